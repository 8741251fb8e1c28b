"""Compare two benchmark result folders: ``python tests/benchmarks/compare.py OLD NEW``.

Prints every table row found in both, with the change as NEW / OLD. Rows are matched by
benchmark and measure; results from different machines are flagged, since they do not compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import format_value  # noqa: E402


def load(folder: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def compare(old_dir: Path, new_dir: Path, stream=sys.stdout) -> int:
    old, new = load(old_dir), load(new_dir)
    common_names = [name for name in new if name in old]
    if not common_names:
        print(f"no benchmark in both {old_dir} and {new_dir}", file=sys.stderr)
        return 1
    for name in common_names:
        before, after = old[name], new[name]
        envs = before.get("environment", {}), after.get("environment", {})
        print(f"\n== {name}: {envs[0].get('commit', '?')[:10]} -> {envs[1].get('commit', '?')[:10]} ==", file=stream)
        for key in ("platform", "cpus", "quick"):
            if envs[0].get(key) != envs[1].get(key):
                print(f"  warning: {key} differs ({envs[0].get(key)} vs {envs[1].get(key)})", file=stream)
        rows_before = {row["what"]: row for row in before.get("table", [])}
        lines = []
        for row in after.get("table", []):
            was = rows_before.get(row["what"])
            if was is None or isinstance(row["value"], str) or isinstance(was["value"], str):
                continue
            change = row["value"] / was["value"] if was["value"] else float("nan")
            lines.append((row["what"], format_value(was["value"]), format_value(row["value"]), row["unit"],
                          f"{change:.2f}x"))
        header = ("measure", "old", "new", "unit", "new/old")
        widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
        for line in [header, *lines]:
            print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip(), file=stream)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} OLD_RESULTS_DIR NEW_RESULTS_DIR")
    sys.exit(compare(Path(sys.argv[1]), Path(sys.argv[2])))
