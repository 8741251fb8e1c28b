"""``python -m verl_exporter.simulate``: the same as ``verl-exporter simulate``."""

import sys

from verl_exporter.simulate.logs import main

sys.exit(main())
