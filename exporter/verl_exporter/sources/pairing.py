"""Which files are one job's output: the job a log file belongs to (``job_of``).

A job's stdout and stderr often go to two files (Slurm's ``--output``/``--error``, RAGEN's
``.out``/``.err``, ``2> X.stderr.log``). They are one job's when they sit in the same folder and
their names are equal once the stream part is removed:

==========================================  ================
stdout                                      stderr
==========================================  ================
``X.out`` (Slurm ``%x-%j.out``)             ``X.err``
``X.log``, ``X.stdout.log``, ``X.out.log``  ``X.stderr.log``, ``X.err.log``
``X.stdout``                                ``X.stderr``
``X-stdout.log``, ``X_stdout.txt``          ``X-stderr.log``, ``X_stderr.txt``
``stdout.log``, ``stdout``                  ``stderr.log``, ``stderr``
==========================================  ================

Two files are one job's only where one user owns both: a file another user put beside a job's
log is a job of its own, and can never feed, finish or rename its run.

The files of one job feed one run: the run named in either (verl's config print, usually in
stdout), else the path's (``<folder>/<X>``; ``<folder>/stdout`` for ``stdout.log``). A file of no
stream (``X.jsonl``) is a job of its own. Any other file that names the run is another job's and
cannot feed it (``RunStore``'s rule).
"""

from __future__ import annotations

import os
import re

_STREAM = re.compile(r"(?:\A|[._-])(?:std)?(?:out|err)\Z")
_STREAM_FILE = re.compile(r"\A(?:std(?:out|err))\Z")
_LOG_EXTENSIONS = (".log", ".txt")


def job_stem(name: str) -> str | None:
    """A file's name without its extension and stream part: ``X`` for ``X.err``, ``X.stderr.log``,
    ``X.log``; ``stdout`` for ``stderr.log``. None for a file that is no stream of a job's output
    (``X.jsonl``: a metrics file, never paired)."""
    stem = name
    for extension in _LOG_EXTENSIONS:
        if stem.endswith(extension):
            stem = stem[: -len(extension)]
            break
    if _STREAM_FILE.match(stem):
        return "stdout"
    stream = _STREAM.search(stem)
    if stream is not None and stream.start() > 0:
        return stem[: stream.start()]
    return stem if stem != name else None


def job_of(path: str, uid: int | None = None) -> str:
    """The job ``path`` belongs to: its folder, its name's job stem (the path itself for a file that
    is no stream of a job's output) and its owner ``uid``: files of two users are never one job's."""
    folder, name = os.path.split(os.path.abspath(path))
    stem = job_stem(name)
    return os.path.join(folder, name if stem is None else stem + "\0") + f"\0{'' if uid is None else uid}"
