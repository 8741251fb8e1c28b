"""A run's recent steps of the metrics the alert rules judge, so that rules decide in steps, not minutes.

A run lives in steps: 20 s each for a small model, over an hour for a 70B one. Prometheus only knows
wall-clock windows, so a rule written as "the last 30 minutes" sees a hundred steps of one run and
less than one of another. The exporter knows each step, so it serves, per run and per watched
metric, statistics over a fixed number of the run's own steps (in the metric's base unit):

    verl_training_recent_min{project,experiment,metric}     lowest value of the last 3 steps
    verl_training_recent_max{project,experiment,metric}     highest value of the last 3 steps
    verl_training_window_median{project,experiment,metric}  median of the last 10 steps
    verl_training_window_mean{project,experiment,metric}    mean of the last 10 steps
    verl_training_prior_mean{project,experiment,metric}     mean of the 10 steps before those
    verl_training_prior_stddev{project,experiment,metric}   their standard deviation
    verl_training_long_mean{project,experiment,metric}      mean of the last 30 steps
    verl_training_long_prior_mean{project,experiment,metric} mean of the 30 steps before those
    verl_training_early_median{project,experiment,metric}   median of the run's first 10 steps
    verl_training_best_window_mean{project,experiment,metric} highest mean of 10 steps in a row so far
    verl_training_run_max{project,experiment,metric}        highest value of every step so far
    verl_training_run_min{project,experiment,metric}        lowest value of every step so far
    verl_training_early_mad{project,experiment,metric}      spread of the run's first 10 steps (scaled MAD)
    verl_training_zero_streak{project,experiment,metric}    how many of the latest steps in a row were 0
    verl_training_zero_before{project,experiment,metric}    how many of the run's steps before that streak were 0
    verl_training_steps_before{project,experiment,metric}   how many steps the run had before that streak

``metric`` is the served name of the metric (``verl_actor_entropy``). A statistic is served only
once the run has logged the metric at enough steps to fill its window, so a rule needs no warm-up
term of its own. Non-finite values are left out (``verl_training_nonfinite_values_total`` counts
them); values near the largest float are not: a sum of them past the float range is no infinity.
Cardinality: at most one series per (run, metric, statistic) of ``WATCHED`` below, which lists only
what the shipped rules read (``tests/unit/test_step_windows.py`` keeps the two equal).

Below the store and the collectors; it imports only the schema (the statistics' names).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, islice
from operator import eq, sub

from verl_exporter.schema import STEP_STATS

RECENT = 3  # "held": the condition at each of the last RECENT steps
WINDOW = 10  # "half-true": the median of the last WINDOW steps; also the trend windows
EARLY = 10  # the run's baseline: its first EARLY steps
LONG = 30  # slow trends (plateaus): the last LONG steps against the LONG before
ZERO = 0.0005  # a value under this in magnitude is 0: half the resolution of verl before 0.5 (3 decimals)
MAD_SCALE = 1.4826  # the median absolute deviation of normal noise times this is its standard deviation
_SHIFT = 7  # sums of up to 2**_SHIFT values past the float range are taken scaled by 2**-_SHIFT (exact)

# statistic -> the steps it needs (schema.STEP_STATS says what each is, in the order served).
STATS = {
    "recent_min": RECENT,
    "recent_max": RECENT,
    "window_median": WINDOW,
    "window_mean": WINDOW,
    "prior_mean": 2 * WINDOW,
    "prior_stddev": 2 * WINDOW,
    "long_mean": LONG,
    "long_prior_mean": 2 * LONG,
    "early_median": EARLY,
    "best_window_mean": WINDOW,
    "run_max": 1,
    "run_min": 1,
    "early_mad": EARLY,
    "zero_streak": 1,
    "zero_before": 1,
    "steps_before": 1,
}
if list(STATS) != list(STEP_STATS):
    raise RuntimeError("step_windows.STATS and schema.STEP_STATS must name the same statistics")

_ABOVE = frozenset({"recent_min", "window_median"})  # "above a threshold": at each of the last 3, at about half of 10
_BELOW = frozenset({"recent_max", "window_median"})  # "below a threshold"
_EITHER = _ABOVE | _BELOW
_TREND = frozenset({"window_mean", "prior_mean"})
_SPREAD = frozenset({"prior_mean", "prior_stddev"})
_PLATEAU = frozenset({"long_mean", "long_prior_mean"})
_ZEROS = frozenset({"zero_streak", "zero_before", "steps_before"})
_CORR = {"kl": _EITHER, "k3_kl": _ABOVE, "ppl_ratio": _EITHER, "chi2_token": _ABOVE, "rollout_is_mean": _EITHER,
         "rollout_is_eff_sample_size": _BELOW, "rollout_is_std": _ABOVE}

# The metrics the rules judge in steps (served names), and the statistics read of each: no more.
WATCHED: dict[str, frozenset[str]] = {
    "verl_actor_pg_clipfrac": _EITHER,
    "verl_actor_ppo_kl": _EITHER | _SPREAD,
    "verl_actor_entropy": _EITHER | _PLATEAU | _SPREAD | {"early_median", "early_mad"},
    "verl_actor_kl_loss": _ABOVE,
    "verl_actor_grad_norm": _EITHER | _SPREAD,
    "verl_actor_pg_loss": _EITHER | _SPREAD,
    "verl_critic_grad_norm": _EITHER,
    "verl_critic_vf_explained_var": _BELOW | _TREND,
    "verl_critic_vf_loss": _ABOVE | _TREND | _SPREAD,
    "verl_critic_vf_clipfrac": _ABOVE,
    "verl_critic_vpred_mean": frozenset({"window_median"}),
    "verl_critic_returns_mean": frozenset({"window_median"}),
    "verl_critic_advantages_mean": _EITHER | {"window_mean"},
    "verl_critic_advantages_max": _ABOVE | _ZEROS,
    "verl_critic_advantages_min": _BELOW | _ZEROS,
    "verl_critic_score_mean": _BELOW | _TREND | _SPREAD | _PLATEAU | {"early_median", "best_window_mean"},
    "verl_critic_score_max": frozenset({"run_max"}),
    "verl_critic_score_min": frozenset({"run_min"}),
    "verl_critic_rewards_mean": _BELOW | _SPREAD | {"best_window_mean"},
    "verl_response_length_mean": _EITHER | {"prior_mean", "early_median"},
    "verl_response_length_clip_ratio": _ABOVE,
    "verl_prompt_length_clip_ratio": _ABOVE,
    "verl_training_rollout_probs_diff_mean": _ABOVE,
    "verl_training_rollout_probs_diff_max": _ABOVE,
    "verl_training_rollout_actor_probs_pearson_corr": _BELOW,
    "verl_training_off_policy_trajectory_staleness_worst_max": _ABOVE,
    "verl_training_filter_groups_evicted_samples": _ABOVE,
    "verl_training_rollout_failure_evicted_samples": _ABOVE,
    "verl_separate_async_switch_idle": frozenset({"window_mean", "early_median"}),
    "verl_fully_async_trainer_idle_ratio": frozenset({"window_median", "early_median"}),
    "verl_fully_async_rollouter_idle_ratio": frozenset({"window_median", "early_median"}),
    **{f"verl_{actor}rollout_corr_{name}": stats for actor in ("", "actor_") for name, stats in _CORR.items()},
    "verl_timing_step_seconds": _BELOW | {"prior_mean", "early_median", "run_max"},
    "verl_timing_testing_seconds": frozenset({"run_max"}),
    "verl_perf_throughput": _BELOW | {"prior_mean", "best_window_mean"},
    "verl_perf_mfu_actor": _BELOW | {"prior_mean", "best_window_mean"},
    "verl_rollout_spec_accept_rate": _BELOW | _SPREAD | {"best_window_mean"},
    "verl_rollout_moe_max_vio_max": _ABOVE | _SPREAD,
}
LONGEST = max(STATS.values())
# Counts verl logs only at a step where they are not 0 (the V1 replay buffer's evictions, summed over the
# step's iterations): once a run has logged one, a step without it counts as 0, served and in the step
# statistics (``StepFolder.watched``).
SPARSE = frozenset({"verl_training_filter_groups_evicted_samples",
                    "verl_training_filter_groups_discarded_surplus_samples",
                    "verl_training_rollout_failure_evicted_samples", "verl_training_off_policy_evicted_samples"})
# Baselines of one attempt of a run: a restart (the run's config printed again after its steps) starts them
# again, as a resumed job may run on other GPUs or another release (verl 0.9's separate_async counts the
# rollout GPUs in perf/throughput's denominator).
PER_ATTEMPT = frozenset({"verl_perf_throughput", "verl_perf_mfu_actor"})


@dataclass(slots=True)
class StepWindow:
    """One metric of one run: its value at each of its latest steps, its first steps, its extremes."""

    last: deque = field(default_factory=lambda: deque(maxlen=LONGEST))  # one value per step, oldest first
    early: list = field(default_factory=list)
    high: float = -math.inf
    low: float = math.inf
    best_mean: float = -math.inf  # the highest mean of WINDOW steps in a row
    window_sum: float = 0.0  # of the last WINDOW values
    step: int | None = None  # the step of the latest value
    count: int = 0  # steps so far
    zeros: int = 0  # ... whose value was 0 (under ZERO in magnitude)
    streak: int = 0  # the latest steps in a row whose value was 0
    streak_before: int = 0  # the streak before the latest step (what a second value of that step continues)

    def add(self, step: int, value: float) -> None:
        """The metric's value at ``step``; a second value of the same step replaces the first."""
        if value - value != 0:
            return
        last = self.last
        zero = -ZERO < value < ZERO
        if step == self.step:
            self.zeros += zero - (-ZERO < last[-1] < ZERO)
            self.streak = self.streak_before + 1 if zero else 0
            self.window_sum += value - last[-1]  # an overflow is summed again below
            last[-1] = value
            if len(last) <= EARLY and len(self.early) == len(last):
                self.early[-1] = value
        else:
            self.count += 1
            self.zeros += zero
            self.streak_before = self.streak
            self.streak = self.streak + 1 if zero else 0
            self.step = step
            if len(last) >= WINDOW:
                self.window_sum -= last[-WINDOW]
            self.window_sum += value
            last.append(value)
            if len(self.early) < EARLY:
                self.early.append(value)
        if value > self.high:
            self.high = value
        if value < self.low:
            self.low = value
        total = self.window_sum
        if total - total != 0:  # past the float range (the values are finite): summed again, not carried
            total = self.window_sum = sum(list(last)[-WINDOW:])
            if total - total != 0:
                if len(last) >= WINDOW:
                    self.best_mean = max(self.best_mean, _mean(list(last)[-WINDOW:]))
                return
        if len(last) >= WINDOW and total > self.best_mean * WINDOW:
            self.best_mean = total / WINDOW

    def add_all(self, steps: list[int], values: list[float]) -> None:
        """``add`` of each step's value, in order. Distinct finite steps, the common case, are taken
        as a whole (C's max, min and running sums); others one by one."""
        if not steps:
            return
        if (steps[0] == self.step or any(map(eq, steps, islice(steps, 1, None)))
                or not all(map(math.isfinite, values))):
            for step, value in zip(steps, values):
                self.add(step, value)
            return
        last, early = self.last, self.early
        recent = list(last)[-(WINDOW - 1):] + values  # every 10 steps in a row that end with a new one
        if max(map(abs, recent)) * len(recent) > sys.float_info.max:  # sums could leave the float range
            for step, value in zip(steps, values):
                self.add(step, value)
            return
        if len(early) < EARLY:
            early.extend(values[:EARLY - len(early)])
        self.high = max(self.high, max(values))
        self.low = min(self.low, min(values))
        sums = list(accumulate(recent, initial=0.0))
        if len(recent) >= WINDOW:
            self.best_mean = max(self.best_mean, max(map(sub, sums[WINDOW:], sums[:-WINDOW])) / WINDOW)
            self.window_sum = sums[-1] - sums[-1 - WINDOW]
        else:
            self.window_sum = sums[-1]
        last.extend(values)
        self.step = steps[-1]
        self._count_zeros(values)

    def _count_zeros(self, values: list[float]) -> None:
        """The zero counts after ``values``, steps of their own, in order."""
        flags = list(map(ZERO.__gt__, map(abs, values)))
        self.count += len(flags)
        self.zeros += sum(flags)
        trailing = 0  # zeros at the end of values, and before their last one
        for flag in reversed(flags):
            if not flag:
                break
            trailing += 1
        if trailing == len(flags):
            self.streak_before = self.streak + trailing - 1
            self.streak += trailing
        else:
            self.streak_before = trailing - 1 if trailing else _trailing_zeros(flags[:-1], self.streak)
            self.streak = trailing

    def copy(self) -> "StepWindow":
        return StepWindow(deque(self.last, maxlen=LONGEST), list(self.early), self.high, self.low, self.best_mean,
                          self.window_sum, self.step, self.count, self.zeros, self.streak, self.streak_before)

    def stat(self, name: str) -> float | None:
        """Statistic ``name`` of ``STATS``, or None while the run has too few steps of it."""
        needed = STATS[name]
        if len(self.last) < needed and name != "early_median":
            return None
        values = list(self.last)
        if name == "recent_min":
            return min(values[-RECENT:])
        if name == "recent_max":
            return max(values[-RECENT:])
        if name == "window_median":
            return _median(values[-WINDOW:])
        if name == "window_mean":
            return _mean(values[-WINDOW:])
        if name == "prior_mean":
            return _mean(values[-2 * WINDOW:-WINDOW])
        if name == "long_mean":
            return _mean(values[-LONG:])
        if name == "long_prior_mean":
            return _mean(values[-2 * LONG:-LONG])
        if name == "prior_stddev":
            return _pstdev(values[-2 * WINDOW:-WINDOW])
        if name == "best_window_mean":
            return self.best_mean
        if name == "early_median":
            return _median(self.early) if len(self.early) >= EARLY else None
        if name == "early_mad":
            if len(self.early) < EARLY:
                return None
            middle = _median(self.early)
            spread = MAD_SCALE * _median([abs(value - middle) for value in self.early])
            return min(spread, sys.float_info.max)  # a spread past the float range: the largest float
        if name == "zero_streak":
            return float(self.streak)
        if name == "zero_before":
            return float(self.zeros - self.streak)
        if name == "steps_before":
            return float(self.count - self.streak)
        return self.high if name == "run_max" else self.low


def _mean(values: list[float]) -> float:
    """fsum's mean of finite ``values``, also where their sum is past the float range: then they
    are summed scaled by a power of two, which is exact."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.ldexp(math.fsum(math.ldexp(value, -_SHIFT) for value in values) / len(values), _SHIFT)


def _pstdev(values: list[float]) -> float:
    """statistics.pstdev in floats (fsum's two passes), its exact fractions only where the squares
    leave the float range: a hundred times cheaper, and within an ulp or two of it (0 where all are equal)."""
    if max(values) == min(values):
        return 0.0
    try:
        mean = math.fsum(values) / len(values)
        spread = math.sqrt(math.fsum((value - mean) ** 2 for value in values) / len(values))
    except OverflowError:
        spread = math.inf
    return spread if math.isfinite(spread) else statistics.pstdev(values)


def _median(values: list[float]) -> float:
    """statistics.median, also of two middle values whose sum is past the float range."""
    middle = statistics.median(values)
    if middle - middle != 0 and len(values) % 2 == 0:
        ordered = sorted(values)
        low, high = ordered[len(values) // 2 - 1], ordered[len(values) // 2]
        if math.isfinite(low) and math.isfinite(high):
            return low / 2 + high / 2
    return middle


def _trailing_zeros(flags: list[bool], earlier: int) -> int:
    """How many of ``flags`` at their end are zeros, continuing ``earlier`` zeros where all are."""
    count = 0
    for flag in reversed(flags):
        if not flag:
            return count
        count += 1
    return count + earlier
