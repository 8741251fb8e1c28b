"""The README says what each alert means: every shipped alert is in its table, and nothing else."""

import re

import yaml

from servers import REPO
from verl_exporter import shipped


def shipped_alerts() -> dict[str, str]:
    alerts = {}
    for path in shipped.alert_rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    alerts[rule["alert"]] = rule["labels"]["severity"]
    return alerts


def test_readme_lists_every_alert_with_its_severity():
    readme = (REPO / "README.md").read_text()
    listed = dict(re.findall(r"^\| `(Verl\w+)` \| (\w+) \|", readme, flags=re.M))
    assert listed == shipped_alerts()
    assert f"hold {len(listed)} alerts" in readme
