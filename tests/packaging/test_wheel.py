"""The wheel carries its rules: installed in a fresh virtualenv, away from the checkout,
``verl-exporter replay`` finds the shipped rules and raises the alert of a simulated run, and
``verl-exporter rules`` writes them with another runbook base.

The new virtualenv reaches the package's dependencies through a ``.pth`` line to this one's
site-packages (no download); ``verl_exporter`` itself comes from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from servers import REPO, require_binary
from verl_exporter import simulate

pytestmark = pytest.mark.slow

STEPS = 40  # the nan scenario turns NaN at step 15


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtualenv with the wheel built from this checkout installed (its bin/ folder)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # what exporter/Dockerfile copies, so that the build leaves the checkout alone
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("exporter", "mixin", "alerts", "grafana/dashboards"):
        shutil.copytree(REPO / folder, source / folder, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copyfile(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"),
                            str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (work / "dist").glob("verl_exporter-*.whl")
    target = work / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies from this environment, after the new one's own site-packages.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              str(wheel)], capture_output=True, text=True, timeout=300)
    if install.returncode != 0 and "no such option: --python" in install.stderr:  # pip before 22.3
        install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--prefix",
                                  str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    return target / "bin"


def run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_the_package_and_its_data_come_from_the_wheel(installed, tmp_path):
    probe = ("import json, verl_exporter, verl_mixin, verl_exporter.shipped as s; "
             "from verl_exporter.store.catalog import default_catalog; "
             "print(json.dumps({'package': verl_exporter.__file__, 'mixin': verl_mixin.__file__, "
             "'catalog': str(s.catalog()), 'metrics': len(default_catalog().metrics), "
             "'rules': [str(p) for p in s.rule_files()], 'runbook': str(s.runbook()), "
             "'alertmanager': str(s.alertmanager_config()), "
             "'dashboards': sorted(p.name for p in s.dashboards_dir().glob('*.json')), "
             "'templates': sorted(p.name for p in s.alertmanager_templates().glob('*.tmpl'))}))")
    result = run(installed, tmp_path, str(installed / "python"), "-c", probe)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    venv_dir = installed.parent.resolve()
    for key in ("package", "mixin", "catalog"):  # the mixin's code and catalog come with the exporter
        assert Path(found[key]).resolve().is_relative_to(venv_dir), found[key]
    assert found["metrics"] > 50
    names = sorted(Path(path).name for path in found["rules"])
    assert names == sorted([path.name for path in (REPO / "alerts/rules").glob("*.yml")])
    assert all(Path(path).resolve().is_relative_to(venv_dir) for path in found["rules"])
    for key in ("runbook", "alertmanager"):
        assert Path(found[key]).resolve().is_relative_to(venv_dir) and Path(found[key]).is_file(), key
    assert found["dashboards"] == ["fleet-overview.json", "gpu-nodes.json", "run-detail.json"]
    assert found["templates"] == ["verl.tmpl"]


def test_replay_from_another_folder_uses_the_shipped_rules(installed, tmp_path):
    require_binary("prometheus"), require_binary("promtool")
    history = tmp_path / "history" / "nan-ppo.jsonl"
    history.parent.mkdir()
    with history.open("w", encoding="utf-8") as out:
        for step, values in simulate.generate_steps("nan"):
            if step > STEPS:
                break
            out.write(simulate.format_jsonl(step, values) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run(installed, elsewhere, str(installed / "verl-exporter"), "replay", str(history))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out  # 1: a critical alert would have fired
    assert "VerlTrainingNonFinite (critical)" in out
    assert "A loss or gradient norm of the run is NaN or Inf." in out


def test_rules_command_writes_the_rules_with_another_runbook_base(installed, tmp_path):
    base = "https://wiki.example/verl/RUNBOOK.md"
    result = run(installed, tmp_path, str(installed / "verl-exporter"), "rules", "--runbook-url", base, "--out", "out")
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "out" / "verl-operations.rules.yml").read_text()
    assert f"runbook_url: {base}#verltrainingstalled" in text
    assert (tmp_path / "out" / "prometheusrule.yml").is_file() and (tmp_path / "out" / "RUNBOOK.md").is_file()


def test_a_default_install_brings_py_spy_for_the_stacks_of_a_stall(installed):
    import zipfile

    [wheel] = (installed.parent.parent / "dist").glob("verl_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    core = [requirement for requirement in requires if "extra ==" not in requirement]
    assert any(requirement.startswith("py-spy") for requirement in core), requires
    assert any(requirement.startswith("py-spy") and 'extra == "forensics"' in requirement for requirement in requires)
