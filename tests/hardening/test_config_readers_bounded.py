"""Config files and prints are read within bounds: YAML aliases (a self-referencing mapping, an
alias bomb) are refused at once with a clear reason, a config larger than the cap is refused, and a
mapping with more nodes than the cap stops flattening; other runs keep being read."""

from __future__ import annotations

import time

import pytest

from verl_exporter.sources import Source
from verl_exporter.sources.run_config import MAX_CONFIG_CHARS, MAX_CONFIG_NODES, flatten, read_config_text
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import ParseError
from verl_exporter.store.run_store import RunStore

SELF_REFERENCE = "trainer: {project_name: p, experiment_name: e}\nx: &x {y: *x}\n"
ALIAS_BOMB = "trainer: {project_name: p, experiment_name: e}\na: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))


@pytest.mark.parametrize("text", [SELF_REFERENCE, ALIAS_BOMB], ids=["self-reference", "alias-bomb"])
def test_yaml_aliases_are_refused_at_once(text):
    started = time.monotonic()
    with pytest.raises(ParseError, match="aliases"):
        read_config_text(text)
    assert time.monotonic() - started < 1.0, "refused before anything is expanded"


def test_a_config_over_the_cap_is_refused():
    with pytest.raises(ParseError, match="larger than"):
        read_config_text("trainer: {project_name: p}\n" + "# padding\n" * (MAX_CONFIG_CHARS // 10 + 1))


def test_flattening_stops_at_the_node_cap_even_for_a_cyclic_mapping():
    cyclic: dict = {"trainer": {"project_name": "p"}}
    cyclic["loop"] = cyclic
    flat = flatten(cyclic)
    assert flat["trainer.project_name"] == "p" and len(flat) <= MAX_CONFIG_NODES


def test_an_alias_config_file_is_one_clear_error_and_other_sources_go_on(tmp_path, caplog):
    bomb = tmp_path / "outputs" / "config.yaml"
    bomb.parent.mkdir()
    bomb.write_text(ALIAS_BOMB)
    log = tmp_path / "run.log"
    log.write_text("step:1 - actor/pg_loss:0.1\n")
    store = RunStore(default_catalog())
    for path in (bomb, log):
        Source(str(path), store).settle()
    snapshot = store.snapshot()
    assert [state.last_step for state in snapshot.runs] == [1]
    assert snapshot.parse_errors == {str(bomb): 1}
    assert any("aliases" in record.getMessage() for record in caplog.records)
