"""The wheel's one build step beyond pyproject.toml: the shipped files, kept once in the checkout
(``alerts/``, ``grafana/dashboards/``, the mixin's ``catalog.yaml``), are copied into the package as
``verl_exporter/_files/`` (``verl_exporter.shipped`` finds them there when installed)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# checkout path -> its place in _files/ (alerts/secrets/, where an operator keeps Alertmanager's, stays out)
SHIPPED = {"alerts/rules": "alerts/rules", "alerts/alertmanager": "alerts/alertmanager",
           "alerts/RUNBOOK.md": "alerts/RUNBOOK.md", "grafana/dashboards": "dashboards",
           "mixin/catalog.yaml": "catalog.yaml"}


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own folders
            return
        root = Path(__file__).resolve().parent
        for source, name in SHIPPED.items():
            top = root / source
            for path in [top] if top.is_file() else sorted(top.rglob("*")):
                if path.is_file():
                    target = Path(self.build_lib, "verl_exporter", "_files", name, path.relative_to(top))
                    self.mkpath(str(target.parent))
                    self.copy_file(str(path), str(target))


setup(cmdclass={"build_py": BuildWithShippedFiles})
