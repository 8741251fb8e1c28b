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


def pytest_collection_modifyitems(session, config, items):
    """The modules that read background replays (``replay_pool``): their replays submitted now, their
    tests moved to the end of the session, so the replays run while the other tests do."""
    import replay_pool

    modules = []
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "background_replays") and module not in modules:
            modules.append(module)
    if not modules:
        return
    replay_pool.POOL = replay_pool.POOL or replay_pool.ReplayPool()
    for module in modules:
        replay_pool.POOL.submit_module(module.__name__, module.background_replays)
    late = [item for item in items if getattr(item, "module", None) in modules]
    items[:] = [item for item in items if getattr(item, "module", None) not in modules] + late


def pytest_sessionfinish(session, exitstatus):
    import replay_pool

    if replay_pool.POOL is not None:
        replay_pool.POOL.close()
        replay_pool.POOL = None
