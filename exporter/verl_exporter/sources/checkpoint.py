"""verl's checkpoint lines: ``local_global_step_folder: <dir>/global_step_N``, printed by the trainer
when it starts saving the checkpoint of step N (the step's own metrics line follows once the save
is done; ``timing_s/save_checkpoint`` in it is how long the save took)."""

from __future__ import annotations

import re

MARKER = "local_global_step_folder:"
_FOLDER = re.compile(r"local_global_step_folder:.*global_step_(\d{1,15})(?!\d)")


def parse_checkpoint_start(line: str) -> int | None:
    """N of a ``local_global_step_folder: .../global_step_N`` line; None for any other line."""
    if MARKER not in line:
        return None
    match = _FOLDER.search(line)
    return int(match.group(1)) if match else None
