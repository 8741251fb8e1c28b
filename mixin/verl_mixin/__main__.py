"""``python -m verl_mixin [--check] [--runbook-url URL]``: write the generated alert files."""

import sys

from .generate import main

sys.exit(main())
