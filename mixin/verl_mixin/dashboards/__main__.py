"""Write the dashboards to grafana/dashboards/, or with --check, fail if the
committed JSON is stale.

    .venv/bin/python -m verl_mixin.dashboards [--check] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DASHBOARDS_DIR, build_all
from .common import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl_mixin.dashboards", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    parser.add_argument("--out", type=Path, default=DASHBOARDS_DIR, help="directory of the JSON files")
    args = parser.parse_args(argv)
    stale = []
    for filename, model in build_all().items():
        path = args.out / filename
        text = render(model)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(model['panels'])} panels)")
    if stale:
        print("stale dashboards (regenerate with `python -m verl_mixin.dashboards`): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
