#!/usr/bin/env python3
"""Write alerts/*.rules.yml, prometheus/recording-rules.yml, alerts/RUNBOOK.md, docs/alerts.md and
prometheus/kubernetes/prometheusrule.yml.

Usage: python alerts/generate.py [--check]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generator import kubernetes  # noqa: E402
from generator.render import main  # noqa: E402

if __name__ == "__main__":
    status = main()
    sys.exit(kubernetes.main(sys.argv[1:]) or status)
