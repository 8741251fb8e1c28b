#!/usr/bin/env python3
"""Write alerts/*.rules.yml, prometheus/recording-rules.yml, alerts/RUNBOOK.md and docs/alerts.md.

Usage: python alerts/generate.py [--check]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generator.render import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
