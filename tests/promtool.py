"""promtool, from Debian's prometheus package, as the test suite uses it."""

from __future__ import annotations

import subprocess

from servers import require_binary


def check_metrics(text: str) -> str:
    """Run ``promtool check metrics`` on exposition text; its complaints ('' when lint clean)."""
    result = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=60)
    output = (result.stdout + result.stderr).decode()
    return output.strip() if result.returncode or output.strip() else ""
