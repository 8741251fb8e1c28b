"""The same run at another speed: every step's time and every logged duration scaled alike.

A run lives in steps, so its diagnosis must not depend on how fast its GPUs are. ``retime`` turns
a run's timelines into those of the same run on hardware ``factor`` times slower (the median step
taking ``median_step`` seconds): the time between any two entries (steps, checkpoint saves,
errors) and every ``timing_s/*``, ``timing/*``, ``timing_per_token_ms/*`` value and
``perf/time_per_step`` are multiplied by the factor, ``perf/throughput`` is divided by it. The
values of the metrics themselves do not change.
"""

from __future__ import annotations

import statistics

from .timeline import FileTimeline

DURATION_PREFIXES = ("timing_s/", "timing/", "timing_per_token_ms/", "perf/time_per_step")
RATE_KEYS = ("perf/throughput",)


def median_step_seconds(timelines: list[FileTimeline]) -> float | None:
    """The median time between consecutive steps of the files (events left out), or None."""
    gaps = []
    for timeline in timelines:
        times = [step.time for step in timeline.steps if not step.event]
        gaps += [later - earlier for earlier, later in zip(times, times[1:]) if later > earlier]
    return statistics.median(gaps) if gaps else None


def retime(timelines: list[FileTimeline], median_step: float) -> float:
    """Scale ``timelines`` in place so that their median step takes ``median_step`` seconds; the factor."""
    measured = median_step_seconds(timelines)
    if not measured or median_step <= 0:
        return 1.0
    factor = median_step / measured
    entries = [step for timeline in timelines for step in timeline.steps]
    if not entries:
        return factor
    origin = min(step.time for step in entries)
    for step in entries:
        step.time = round(origin + (step.time - origin) * factor, 3)
        if step.logged_at is not None:
            step.logged_at = origin + (step.logged_at - origin) * factor
        for record in step.records:
            record.time = step.time
            if record.values:
                record.values = {key: _scaled(key, value, factor) for key, value in record.values.items()}
    return factor


def _scaled(key: str, value: float | str, factor: float) -> float | str:
    if key.startswith(DURATION_PREFIXES):
        scale = factor
    elif key in RATE_KEYS:
        scale = 1 / factor
    else:
        return value
    try:
        scaled = float(value) * scale
    except (TypeError, ValueError, OverflowError):
        return value
    return repr(scaled) if isinstance(value, str) else scaled  # a record's values stay all text or all numbers
