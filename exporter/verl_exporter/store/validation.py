"""When a run validates next, from its config and its own validations, for the stall rule: a step
that validates takes the run's validation on top (10 to 20 times a training step for agent runs).

A step validated when it logged validation metrics (``val-core/``, ``val-aux/``, ``val/``, ``val-env/``)
or a validation time (``timing_s/testing``): verl validates before training (step 0, ``val_before_train``),
every ``trainer.test_freq`` steps and at the last step. The next validation is

- by the config's ``trainer.test_freq`` (none where it is 0 or less), in the phase of the run's own
  validations (verl before 0.3 logs them one step early: 9, 19, ...);
- else every as many steps as between the run's last two validations;
- and the run's last step (``Total training steps``) where that comes first: verl validates there too;
- else unknown (``None``): the rule then allows for a validation at every step.
"""

from __future__ import annotations

from verl_exporter.store.run_state import RunState

PREFIXES = ("val-core/", "val-aux/", "val/", "val-env/", "timing_s/testing")
TEST_FREQ = "trainer.test_freq"


def is_validation_key(key: str) -> bool:
    """Whether a step that logged ``key`` validated."""
    return key.startswith(PREFIXES)


def note(state: RunState, step: int) -> None:
    """``step`` of the run validated."""
    if not state.validations or state.validations[-1] != step:
        state.validations = (*state.validations[-2:], step)


def next_validation(state: RunState) -> int | None:
    """The run's next step that validates, or None where that is not known (or it never validates)."""
    last, total = state.last_step, state.total_steps
    if last is None:
        return None
    seen = [step for step in state.validations if step != total]  # the last step's is out of cadence
    frequency = state.config.get(TEST_FREQ)
    if frequency is not None:
        frequency = int(frequency)
        if frequency <= 0:
            return None
        phase = seen[-1] % frequency if seen else 0
        upcoming = last + 1 + (phase - last - 1) % frequency
    elif len(seen) < 2 or seen[-1] <= seen[-2]:
        return None
    else:
        period = seen[-1] - seen[-2]
        upcoming = seen[-1] + period * max(1, -(-(last + 1 - seen[-1]) // period))
    return total if total is not None and last < total < upcoming else upcoming
