"""The tables of docs/precision.md ("In every regime") from the report of the regime replays:

    VERL_REGIMES_FULL=1 VERL_REGIMES_REPORT=/tmp/regimes.json .venv/bin/python -m pytest tests/history/test_regimes.py
    .venv/bin/python scripts/regimes_table.py /tmp/regimes.json

Per regime and tempo: healthy runs silent, failures named within 5 steps of their onset (where the regime
leaves the onset in the run: not before a resumed copy's start, nor test_regimes.EXCUSED); per fork
family; and each failure's steps from onset to its first firing in each regime (the slowest tempo).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "history")]

import tempfile  # noqa: E402

from test_regimes import EXCUSED  # noqa: E402

from real_runs import VERDICTS, log_files  # noqa: E402
from regimes import read_run, resume_point  # noqa: E402
from reported_failures import FAILURES, write_failure  # noqa: E402

GRACE = 5
FAMILIES = (("verl-data", "verl team baselines"), ("verldata", "verl team baselines"),
            ("mi300", "verl team baselines"), ("dstack", "verl team baselines"), ("opd-", "Open-AgentRL"),
            ("ragen", "RAGEN"), ("verlagent", "verl-agent"), ("diver", "DIVER"), ("searchr1", "Search-R1"),
            ("failure:", "rebuilt failures"))


def family(name: str) -> str:
    return next((label for prefix, label in FAMILIES if name.startswith(prefix)), "the rest")


def expectations(name: str) -> tuple[str, dict[str, int]]:
    """(verdict, alert -> onset step) of a real run or a rebuilt failure."""
    if name.startswith("failure:"):
        failure = next(f for f in FAILURES if "failure:" + f.issue.split(":")[0] == name)
        return "failing", {alert: failure.at for alert in failure.fires}
    entry = VERDICTS[name]
    return entry["verdict"], {alert: onset["step"] for alert, onset in (entry.get("onset") or {}).items()}


def resume_points(names: set[str]) -> dict[str, int]:
    """The step each run's resumed copy starts at (its failures' onsets before it are not in the copy)."""
    points, folder = {}, Path(tempfile.mkdtemp())
    for name in names:
        if name.startswith("failure:"):
            failure = next(f for f in FAILURES if "failure:" + f.issue.split(":")[0] == name)
            path = folder / f"{len(points)}.log"
            write_failure(failure, path)
            points[name] = resume_point(read_run(str(path)))
        else:
            points[name] = resume_point(read_run(log_files(name)[0]))
    return points


def main(path: str) -> None:
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    by_cell: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_family: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    delays: dict[tuple[str, str], dict[str, int | None]] = defaultdict(dict)
    resumed_at = resume_points({entry["run"] for entry in report})
    for entry in report:
        name, regime, tempo, episodes = entry["run"], entry["regime"], entry["tempo"], entry["episodes"]
        verdict, onsets = expectations(name)
        loud = sorted({alert for alert, severity, _, _ in episodes if severity in ("warning", "critical")})
        cells = (by_cell[regime, tempo], by_family[family(name), regime])
        if verdict == "healthy":
            for cell in cells:
                cell["healthy"].append(not loud)
                if loud:
                    cell["loud"].append(f"{name} ({', '.join(loud)})")
        for alert, onset in onsets.items():
            if (regime, alert) in EXCUSED or (regime == "resumed" and onset <= resumed_at[name] + 10):
                continue  # the regime takes the onset out of the run (test_regimes.EXCUSED); its delay is still shown
            fired = min((first for a, _, first, _ in episodes if a == alert and first is not None), default=None)
            for cell in cells:
                cell["named"].append(fired is not None and fired <= onset + GRACE)
        for alert, onset in onsets.items():
            fired = min((first for a, _, first, _ in episodes if a == alert and first is not None), default=None)
            key = (name, alert)
            previous = delays[key].get(regime, -1)
            delay = None if fired is None else fired - onset
            delays[key][regime] = delay if previous == -1 or previous is None or delay is None else max(previous, delay)
    regimes = sorted({regime for regime, _ in by_cell}, key=list(dict.fromkeys(e["regime"] for e in report)).index)
    print("| regime | tempo | healthy runs silent | failures named within 5 steps |")
    print("| --- | --- | ---: | ---: |")
    for regime in regimes:
        for tempo in ("30s", "5m", "40m"):
            cell = by_cell.get((regime, tempo))
            if cell:
                print(f"| {regime} | {tempo} | {sum(cell['healthy'])}/{len(cell['healthy'])} | "
                      f"{sum(cell['named'])}/{len(cell['named'])} |")
    print("\n| family | regime | healthy runs silent | failures named within 5 steps |")
    print("| --- | --- | ---: | ---: |")
    for (name, regime), cell in sorted(by_family.items()):
        print(f"| {name} | {regime} | {sum(cell['healthy'])}/{len(cell['healthy'])} | "
              f"{sum(cell['named'])}/{len(cell['named'])} |")
    print("\nSteps from onset to the first firing, the slowest of the three tempos (-: never):\n")
    print("| failure | alert | onset | " + " | ".join(regimes) + " |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in regimes) + " |")
    for (name, alert), by_regime in sorted(delays.items()):
        onset = expectations(name)[1][alert]
        print(f"| {name} | {alert} | {onset} | "
              + " | ".join("-" if by_regime.get(r) is None else str(by_regime[r]) for r in regimes) + " |")
    loud = sorted({item for cell in by_cell.values() for item in cell["loud"]})
    if loud:
        print("\nHealthy runs that raised a warning or critical alert: " + "; ".join(loud))


if __name__ == "__main__":
    main(sys.argv[1])
