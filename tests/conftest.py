import contextlib
import sys
from pathlib import Path

import pytest

# Test helper modules (servers.py, promtool.py) import as top-level modules, and so does the demo's
# stand-in for Slack and PagerDuty (scripts/stand_in_receiver.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node Slurm cluster (tests/slurm_cluster.py) shared by the session; skipped, with
    the daemon's log tail as the reason, where its daemons cannot run."""
    from slurm_cluster import SlurmUnavailable, slurm_cluster

    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(slurm_cluster(tmp_path_factory.mktemp("slurm")))
        except SlurmUnavailable as exc:
            pytest.skip(f"no Slurm cluster here: {exc}")
        yield cluster
