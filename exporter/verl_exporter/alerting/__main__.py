"""``python -m verl_exporter.alerting [--check] [--runbook-url URL]``: write the generated alert files."""

import sys

from .generate import main

sys.exit(main())
