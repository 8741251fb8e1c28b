"""The shipped YAML files read by libyaml's safe loader: the same documents, and nothing unsafe."""

from __future__ import annotations

import pytest
import yaml

from verl_exporter import shipped
from verl_exporter.config.yaml_files import FAST_SAFE_LOADER, load_shipped


def test_every_shipped_file_reads_as_the_pure_python_safe_loader_reads_it():
    files = [shipped.catalog(), *shipped.rule_files(), shipped.alertmanager_config()]
    assert len(files) > 5
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert load_shipped(text) == yaml.safe_load(text), path


def test_the_fast_loader_is_libyaml_where_pyyaml_has_it():
    assert FAST_SAFE_LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


@pytest.mark.parametrize("text", ["!!python/object/apply:os.system ['true']", "!!python/name:os.system"])
def test_a_python_tag_is_refused(text):
    with pytest.raises(yaml.YAMLError):
        load_shipped(text)


def test_a_broken_file_raises_a_yaml_error_with_its_place():
    with pytest.raises(yaml.MarkedYAMLError) as raised:
        load_shipped("groups:\n  - name: x\n   rules: [")
    assert raised.value.problem_mark is not None and raised.value.problem_mark.line >= 1
