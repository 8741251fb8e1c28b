import sys
from pathlib import Path

# Test helper modules (servers.py, promtool.py) import as top-level modules, and so does the demo's
# stand-in for Slack and PagerDuty (scripts/stand_in_receiver.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))
