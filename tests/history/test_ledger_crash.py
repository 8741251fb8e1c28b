"""A crash's lost work in the goodput ledger: a healthy real run (16 GPUs, a checkpoint every 10 steps) cut
a few steps after a save and ended as a real run's trainer ended, in a fatal traceback. The work since
the save is lost; the ledger still adds up."""

from __future__ import annotations

import pytest

from real_runs import REAL_RUNS, require_run
from regimes import read_run, write_run
from verl_exporter.history import backfill, goodput

BASE = "dstack-ppo-qwen7b-2node-resumed"
CRASHED = "tinyzero-4090-ppo-fragment"  # its trainer's end: a traceback ending in RayTaskError(SafetensorError)
CUT, SAVED = 305, 300  # the last step logged, and the last step that saved a checkpoint
GPUS = 16.0


@pytest.mark.parametrize("tempo", [None, 2400.0])
def test_a_crash_loses_the_work_since_the_last_checkpoint(tmp_path, tempo):
    require_run(BASE)
    require_run(CRASHED)
    run = read_run(str(REAL_RUNS / BASE / "console.log"))
    steps = [(step, values) for step, values in run.steps if step <= CUT]
    assert steps[-1][0] == CUT and steps[SAVED - CUT - 1][1].get("timing_s/save_checkpoint")
    # the traceback as printed, its lines without a time: the trainer failed as step 305 ended
    fatal = [text for _, text in read_run(str(REAL_RUNS / CRASHED / "console.log")).events if "\n" in text]
    ending = [(run.times[CUT] + 0.001, text) for text in fatal]
    crashed = run.but(steps=steps, events=[event for event in run.events if event[0] <= run.times[CUT]] + ending,
                      finished=False)
    log = tmp_path / "console.log"
    write_run(crashed, log)
    history = backfill.build([str(log)], tempo=tempo)
    (ledger,) = goodput.ledgers(history)
    scale = 1.0 if tempo is None else tempo / backfill.build([str(log)]).median_step()  # every duration alike
    unsaved = sum(values["timing_s/step"] for step, values in steps if step > SAVED)
    assert ledger.gpus == GPUS
    assert ledger.buckets["lost"] == pytest.approx(GPUS * unsaved * scale, rel=1e-3)
    assert ledger.lifetime == pytest.approx(GPUS * (history.end - history.start), rel=1e-6)
