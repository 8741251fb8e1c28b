"""What a run's GPUs did: its GPU-seconds by bucket (the goodput ledger).

A run holds its GPUs (``trainer.n_gpus_per_node`` x ``trainer.nnodes`` of its config) from its first line
to its end; every second of that, times its GPUs, goes to one bucket:

- ``startup``: from the run's first line (its config print) to the end of its first step (which holds
  the engines' warm-up), and again from each restart to the end of the step after it;
- ``productive``: the steps, without their validation and checkpoint parts (``timing_s/step`` less
  ``timing_s/testing`` and ``timing_s/save_checkpoint``);
- ``validation``, ``checkpoint``: those parts (and, where the line that timed a save was lost, the time
  from the save's start to the next step's);
- ``between_steps``: the time between one step's end and the next one's start (logging, the final
  validation and save after the last step);
- ``stalled``: such time past what the run's steps make likely (``stall_bound``): counted as it accrues,
  so a hung run's hours show while it hangs.

``lost`` overlaps them: when the run ends in a fatal error, the work of its steps since its last
checkpoint save (their productive and validation time, and the time of the step that failed) is counted
again as lost, the work a restart must redo (so does a restart of a run that had not ended: it died
unseen). Where two overlap, lost wins: goodput is productive less lost. A step's time counts at most
the time since the previous one, so the buckets add up to the run's GPUs times its lifetime (each
attempt's, from its first line to its end or its latest line).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl_exporter.store.records import CHECKPOINT_SAVE_KEYS, STEP_DURATION_KEYS, logged_seconds

BUCKETS = ("startup", "productive", "validation", "checkpoint", "between_steps", "stalled", "lost")
OVERLAPPING = frozenset({"lost"})  # counted again from the others: not part of the lifetime's sum
TESTING_KEYS = ("timing_s/testing", "timing/testing")
RECENT_STEPS = 10  # the steps the stall bound looks at
STALL_FACTOR = 3.0  # a gap longer than this many median steps ...
LONGEST_FACTOR = 1.5  # ... and than this many of the longest step so far is a stall
MIN_STEPS = 3  # steps before anything counts as stalled


def _seconds(values: Mapping, keys: tuple[str, ...]) -> float:
    return logged_seconds(values, keys) or 0.0


@dataclass(slots=True)
class Ledger:
    """One run's GPU-seconds by bucket; fed its records' times and step timings."""

    gpus: float = 0.0  # 0 while unknown: nothing is counted
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    at_risk: float = 0.0  # GPU-seconds of work since the last checkpoint save
    since: float | None = None  # the time accounted up to (None: the run is not running)
    stepped: bool = False  # this attempt has had a step
    counted: float = 0.0  # seconds past ``since`` already counted (startup or stalled, as they accrued)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    longest: float = 0.0
    finished_at: float | None = None  # when verl printed the end of training, until the run steps again

    def copy(self) -> "Ledger":
        return Ledger(self.gpus, dict(self.seconds), self.at_risk, self.since, self.stepped, self.counted,
                      deque(self.recent, maxlen=RECENT_STEPS), self.longest, self.finished_at)

    def stall_bound(self) -> float | None:
        """Seconds between two steps' ends past which the run counts as stalled (None: too few steps)."""
        if len(self.recent) < MIN_STEPS:
            return None
        return max(STALL_FACTOR * statistics.median(self.recent), LONGEST_FACTOR * self.longest)

    def start(self, moment: float) -> None:
        """The run's first line, or its config printed again after its steps (a restart): a new attempt.
        An attempt that had not ended died unseen: its work since the last save is lost, and the time
        after its latest line is no one's."""
        if self.since is not None:
            self._lose()
        self.since, self.stepped, self.counted, self.finished_at = moment, False, 0.0, None

    def tick(self, now: float, *, busy: bool = False) -> bool:
        """Count the time since the last record that already belongs to a bucket whatever comes next:
        the wait for a first step (startup), the part of a gap past the stall bound (stalled), unless
        the run is ``busy`` (saving a checkpoint, or its next step validates: the step tells)."""
        if self.since is None or not self.gpus:
            return False
        if not self.stepped:
            due, bucket = now - self.since, "startup"
        else:
            bound = self.stall_bound()
            if bound is None or busy:
                return False
            due, bucket = now - self.since - bound, "stalled"
        if due <= self.counted:
            return False
        self._add(bucket, due - self.counted)
        self.counted = due
        return True

    def step(self, moment: float, values: Mapping, *, saving_since: float | None = None) -> None:
        """A step ended at ``moment``, its timings in ``values``. An attempt's first step counts as its
        start-up (it holds the engines' warm-up). ``saving_since``: a checkpoint save began then and ended
        with this step; where the line that timed it was lost, the time from its start to this step's
        start is the save's, not a stall."""
        took = _seconds(values, STEP_DURATION_KEYS)
        if self.since is None and self.finished_at is not None:  # a step logged after verl's end of training
            self.since, self.stepped, self.counted = self.finished_at, True, 0.0
        elif self.since is None:  # stepping again after a failure, with no config print: resumed
            self.since, self.stepped, self.counted = moment - took, False, 0.0
        gap = max(0.0, moment - self.since)
        free = max(0.0, gap - self.counted)  # not yet in a bucket
        if not self.stepped:
            self._add("startup", free)
            self.at_risk += min(took, gap) * self.gpus
        else:
            work = min(took or free, free)
            if free > work:  # idle time: a save that ran in it, then the stall bound tells which
                began, saving = moment - (took or free), 0.0
                if saving_since is not None:
                    saving = min(free - work, max(0.0, began - max(saving_since, self.since + self.counted)))
                    self._add("checkpoint", saving)
                bound = self.stall_bound()
                waited = began - self.since - saving
                self._add("stalled" if bound is not None and waited > bound else "between_steps",
                          free - work - saving)
            if work > 0:  # none where the step took no time since the last (a backlog's lines, read at once)
                testing = min(_seconds(values, TESTING_KEYS), work)
                saving = min(_seconds(values, CHECKPOINT_SAVE_KEYS), work - testing)
                self._add("validation", testing)
                self._add("checkpoint", saving)
                self._add("productive", work - testing - saving)
                self.at_risk = 0.0 if saving > 0 else self.at_risk + work * self.gpus
        if took > 0:
            self.recent.append(took)
            self.longest = max(self.longest, took)
        self.since, self.stepped, self.counted, self.finished_at = moment, True, 0.0, None

    def saved(self) -> None:
        """A checkpoint save finished (where verl logs no timing_s/save_checkpoint)."""
        self.at_risk = 0.0

    def end(self, moment: float, *, failed: bool) -> None:
        """The run finished, or ended in a fatal error, at ``moment``. A failure loses the step that
        failed and the work since the last save."""
        if self.since is None:
            return
        self.tick(moment)
        rest = max(0.0, moment - self.since - self.counted)
        if not self.stepped:
            self._add("startup", rest)
        elif failed:
            self._add("productive", rest)
            self.at_risk += rest * self.gpus
        else:
            self._add("between_steps", rest)
        if failed:
            self._lose()
        self.at_risk, self.since, self.counted = 0.0, None, 0.0
        self.finished_at = None if failed else moment

    def _lose(self) -> None:
        self.seconds["lost"] += self.at_risk
        self.at_risk = 0.0

    def lifetime(self) -> float:
        """GPU-seconds of the buckets that do not overlap: the run's GPUs times its lifetime."""
        return sum(value for bucket, value in self.seconds.items() if bucket not in OVERLAPPING)

    def _add(self, bucket: str, seconds: float) -> None:
        if seconds > 0:
            self.seconds[bucket] += seconds * self.gpus
