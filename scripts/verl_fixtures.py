#!/usr/bin/env python3
"""Regenerate tests/fixtures/verl/: console logs and JSONL files that verl releases wrote.

    make fixtures                      # every release
    make fixtures RELEASES=0.9.1       # some releases (space or comma separated)
    python3 scripts/verl_fixtures.py 0.9.1 --runs v1-sync   # some runs of them

For each release this installs verl from PyPI (`pip install --no-deps --target`) into a
throwaway folder outside the repository, next to one base virtualenv per numpy major (torch,
ray, hydra, omegaconf, tqdm, tensordict, ... installed once), and runs
scripts/verl_fixture_driver.py there for each run (ppo, grpo, agent; from 0.9 also the V1
trainer's runs, v1-*, with scripts/verl_fixture_driver_v1.py and TransferQueue). The driver runs
the release's own trainer loop in a Ray actor; its console, exactly as Ray printed it, becomes
console.log. Work folder: $VERL_FIXTURES_WORK, default /tmp/verl-fixtures.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRIVER_MODULES = ["verl_fixture_driver.py", "verl_fixture_stubs.py", "verl_fixture_workers.py",
                  "verl_fixture_metrics.py", "verl_fixture_driver_v1.py"]
OUT = REPO / "tests" / "fixtures" / "verl"
WORK = Path(os.environ.get("VERL_FIXTURES_WORK", "/tmp/verl-fixtures"))

RELEASES = ["0.3.0.post1", "0.4.1", "0.5.0", "0.6.1", "0.7.0", "0.8.0", "0.9.1"]
# The CPU build of torch; pip finds it through its find-links or an index that has it.
TORCH = os.environ.get("VERL_FIXTURES_TORCH", "torch==2.13.0+cpu")
# One base environment per numpy major: verl 0.5 to 0.8 require numpy<2, 0.9 requires numpy>=2.
BASE_PACKAGES = [
    "ray==2.60.0", "omegaconf==2.3.1", "hydra-core==1.3.8", "tqdm==4.70.1", "codetiming==1.4.0",
    "pandas", "dill==0.4.1", "tensordict==0.10.0", "pydantic==2.14.4", "cachetools==8.0.2",
    "orjson==3.13.0", "setuptools<80",
]
NUMPY = {1: "numpy==1.26.4", 2: "numpy==2.4.6"}
# Per release, besides verl itself: what its requirements pin differently from the base.
EXTRA = {"0.3.0.post1": ["tensordict==0.6.2"], "0.4.1": ["tensordict==0.6.2"]}
# The V1 trainer (0.9+) keeps its batches in TransferQueue: installed, with what it needs beyond
# the base, into its own folder next to the release's.
V1_PACKAGES = ["TransferQueue==0.1.11", "pyzmq==27.3.0", "msgspec==0.23.0", "psutil==7.2.2",
               "prometheus_client==0.26.0"]
V1_RUNS = ["v1-sync", "v1-sync-resumed", "v1-colocate_async", "v1-separate_async", "v1-colocate_async-evictions"]


def numpy_major(release):
    return 2 if release_tuple(release) >= (0, 9) else 1


def release_tuple(release):
    return tuple(int(p) for p in release.split(".")[:3] if p.isdigit())


def runs_for(release):
    """ppo and grpo everywhere; agent where the release has an agent loop (0.5+); the V1
    trainer's modes from 0.9."""
    runs = ["ppo", "grpo"] + (["agent"] if release_tuple(release) >= (0, 5) else [])
    return runs + (V1_RUNS if release_tuple(release) >= (0, 9) else [])


def say(message):
    print(f"[fixtures] {message}", flush=True)


def pip(python, *args):
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        noise = "WARNING: Location"
        err = "\n".join(line for line in proc.stderr.splitlines() if noise not in line)
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{err[-3000:]}")


def base_env(major):
    """The virtualenv shared by all releases of one numpy major; built once."""
    env = WORK / f"base-np{major}"
    stamp = env / ".fixtures-ready"
    if stamp.exists():
        return env / "bin" / "python"
    say(f"building base environment {env} (numpy {major}.x, {TORCH}, ray, hydra ...)")
    if env.exists():
        shutil.rmtree(env)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = env / "bin" / "python"
    pip(python, TORCH, NUMPY[major])
    pip(python, TORCH, NUMPY[major], *BASE_PACKAGES)
    stamp.write_text("ok\n")
    return python


def release_dir(python, release):
    """verl==release (and its differing pins) installed with --no-deps into its own folder."""
    target = WORK / "rel" / release
    stamp = target / ".fixtures-ready"
    if stamp.exists():
        return target
    say(f"installing verl=={release} from PyPI into {target}")
    if target.exists():
        shutil.rmtree(target)
    pip(python, "--no-deps", "--target", str(target), f"verl=={release}", *EXTRA.get(release, []))
    stamp.write_text("ok\n")
    return target


def v1_dir(python, release):
    """TransferQueue and its dependencies, for the V1 runs of one release."""
    target = WORK / "rel" / f"{release}-tq"
    stamp = target / ".fixtures-ready"
    if stamp.exists():
        return target
    say(f"installing {' '.join(V1_PACKAGES)} from PyPI into {target}")
    if target.exists():
        shutil.rmtree(target)
    pip(python, "--no-deps", "--target", str(target), *V1_PACKAGES)
    stamp.write_text("ok\n")
    return target


def driver(name=DRIVER_MODULES[0]):
    """The driver and its modules, copied into the work folder: warnings verl prints name the
    caller's file, and the fixtures should not carry the checkout's path."""
    folder = WORK / "driver"
    folder.mkdir(parents=True, exist_ok=True)
    for module in DRIVER_MODULES:
        shutil.copyfile(REPO / "scripts" / module, folder / module)
    return folder / name


def drive(python, target, release, run):
    """Run the driver for one run; console.log is its stdout and stderr as one stream."""
    out = OUT / release / run
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    scratch = WORK / "scratch" / f"{release}-{run}"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(target)
    script = driver()
    if run.startswith("v1-"):
        env["PYTHONPATH"] += os.pathsep + str(v1_dir(python, release))
        script = driver("verl_fixture_driver_v1.py")
    env.pop("VERL_FILE_LOGGER_ROOT", None)
    env["PYTHONUNBUFFERED"] = "1"
    started = time.monotonic()
    with open(out / "console.log", "wb") as console:
        proc = subprocess.run(
            [str(python), str(script), "--release", release, "--run", run, "--out", str(out)],
            stdout=console, stderr=subprocess.STDOUT, cwd=scratch, env=env, timeout=600,
        )
    took = time.monotonic() - started
    if proc.returncode != 0:
        tail = (out / "console.log").read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"driver exited {proc.returncode}; last lines of its console:\n" + "\n".join(tail))
    sizes = ", ".join(f"{p.name} {p.stat().st_size // 1024} KB" for p in sorted(out.iterdir()))
    keys = len((out / "keys.txt").read_text().split())
    say(f"  {release}/{run}: {keys} keys in {took:.0f}s ({sizes})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", help=f"default: {' '.join(RELEASES)}")
    parser.add_argument("--runs", default="", help="only these runs (comma separated), e.g. v1-sync")
    args = parser.parse_args()
    only = [r for r in args.runs.replace(",", " ").split() if r]
    wanted = [r for arg in args.releases for r in arg.replace(",", " ").split()] or RELEASES
    unknown = [r for r in wanted if r not in RELEASES]
    if unknown:
        parser.error(f"unknown release(s) {' '.join(unknown)}; known: {' '.join(RELEASES)}")
    WORK.mkdir(parents=True, exist_ok=True)
    failed = []
    for release in wanted:
        try:
            python = base_env(numpy_major(release))
            target = release_dir(python, release)
            for run in [r for r in runs_for(release) if not only or r in only]:
                say(f"driving verl {release}, run {run}")
                drive(python, target, release, run)
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            say(f"verl {release} could not be driven: {exc}")
            failed.append(release)
    if failed:
        say(f"FAILED: {' '.join(failed)}")
        return 1
    say(f"done: {' '.join(wanted)} -> {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
