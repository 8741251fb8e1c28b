"""What a file is, by its path: its format (``format_for``) and the run it belongs to until its
content names one (``run_for``)."""

from __future__ import annotations

import os

from verl_exporter.sources.pairing import job_stem
from verl_exporter.store.records import RunKey, clean_text, display_path

FORMATS = ("auto", "jsonl", "console", "config")


def format_for(path: str, fmt: str = "auto") -> str:
    """``jsonl``, ``console`` or ``config``: ``fmt`` itself unless it is ``auto``, then by the file's
    extension (``.yaml``/``.yml``: a run's config, such as hydra's ``.hydra/config.yaml``)."""
    if fmt != "auto":
        return fmt
    lower = path.lower()
    if lower.endswith((".yaml", ".yml")):
        return "config"
    return "jsonl" if lower.endswith((".jsonl", ".json")) else "console"


def run_for(path: str, project: str | None = None, experiment: str | None = None) -> RunKey:
    """The run a file belongs to: the given names, else ``<root>/<project>/<experiment>.jsonl``
    (the experiment is the name's job stem: ``X`` for ``X.log`` and ``X.stderr.log`` alike)."""
    path = display_path(path)
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    name = os.path.basename(path)
    stem = job_stem(name) or os.path.splitext(name)[0]
    return RunKey(clean_text(project or parent or "default"), clean_text(experiment or stem or "default"))
