"""No logged key can take a name the exporter serves itself, whatever unit rule names it.

For every name the collectors serve (with every sample name derived from it) and every catalog
metric, keys are built that every naming rule would turn into that name; none may get it.
"""

import itertools

from exposition import scrape
from promtool import check_metrics
from verl_exporter import schema
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.collectors.host import HostCollector
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.gpu.fake import FakeNvmlBackend
from verl_exporter.schema import reserved_names
from verl_exporter.store import catalog as catalog_module
from verl_exporter.store.catalog import LOGGED_PREFIX, PREFIX, default_catalog, default_name
from verl_exporter.store.records import Record, RunKey
from verl_exporter.store.run_store import RunStore

CATALOG = default_catalog()
OWN = reserved_names()
CATALOG_NAMES = CATALOG.served_names()


def keys_named(name: str) -> set[str]:
    """Keys that the plain rule or a unit rule would name ``name``, in a few spellings."""
    stem = name.removeprefix(PREFIX)
    bodies = {("", stem, "")}  # (the rule's key prefix, the body, the rule's key suffix)
    for pattern, template, suffix, _ in catalog_module._UNIT_RULES:
        head = template.split("{}")[0]
        if stem.startswith(head) and stem.endswith(suffix.lstrip("_")) and len(stem) > len(head) + len(suffix):
            body = stem[len(head):len(stem) - len(suffix)]
            before, _, after = pattern.pattern.strip("^$").partition("(.+)")
            bodies.add((before, body, after))
    keys = set()
    for before, body, after in bodies:
        for spelling in (body, body.replace("_", "/", 1), body.upper(), body.replace("_", "-"), body + "/"):
            keys.add(before + spelling + after)
    return keys


def test_the_reserved_names_are_the_schemas_with_every_sample_name():
    families = {family.name for family in schema.families()}
    for expected in ("verl_gpus", "verl_gpu_memory_used_bytes", "verl_host_memory_used_bytes", "verl_job_running",
                     "verl_job_resident_memory_bytes", "verl_training_last_step_timestamp_seconds",
                     "verl_training_steps_ingested", "verl_exporter_collector_duration_seconds",
                     "verl_exporter_source_up", "verl_exporter_build_info", "verl_node_run_info"):
        assert expected in families
    assert {"verl_training_steps_ingested_total", "verl_training_steps_ingested_created"} <= OWN
    # Every family a configured collector describes is among them.
    described = [*GpuCollector(FakeNvmlBackend(), timeout_seconds=None).describe(), *HostCollector().describe(),
                 *TrainingCollector(RunStore(CATALOG)).describe()]
    assert {family.name for family in described} <= families


def test_everything_the_exporter_registers_is_reserved(tmp_path):
    """Drift guard: a family cli.py serves that the schema does not list would fail here."""
    from verl_exporter.app import Exporter
    from verl_exporter.config.options import load_options

    run = tmp_path / "gsm8k" / "ppo.jsonl"
    run.parent.mkdir()
    run.write_text('{"step": 1, "data": {"actor/pg_loss": 0.5}}\n')
    exporter = Exporter(load_options(["--source", str(run), "--gpu.fake", "healthy:1", "--job.pid", "1"]))
    try:
        exporter.ingestor.poll_all()
        served = {sample.name for family in exporter.registry.collect() for sample in family.samples}
        described = {family.name for family in exporter.registry.collect()}
    finally:
        for source in exporter.sources.values():
            source.close()
    assert "verl_gpu_up" in served and "verl_job_running" in served and "verl_actor_pg_loss" in served
    assert "process_cpu_seconds_total" in served  # client_python's, which no logged key (verl_...) can take
    own = {name for name in served | described if name.startswith("verl_") and name != "verl_actor_pg_loss"}
    assert own - OWN == set()


def test_catalog_names_are_never_the_exporters_own():
    assert not CATALOG_NAMES & OWN
    assert not any(name.startswith(LOGGED_PREFIX) for name in CATALOG_NAMES)


def test_no_key_outside_the_catalog_gets_an_own_or_a_catalog_name():
    taken = []
    for name in sorted(OWN | CATALOG_NAMES):
        for key in sorted(keys_named(name)):
            if key in CATALOG.listed_keys():
                continue  # a catalog key (or alias) owns its name
            got = CATALOG.resolve(key).spec.name
            if got in OWN or got in CATALOG_NAMES:
                taken.append((key, got))
    assert taken == []


def test_the_reverse_rules_reach_every_name():
    """The test above is only as good as keys_named: its keys do hit each name by the rules alone."""
    for name in sorted(OWN | CATALOG_NAMES):
        if name.startswith(PREFIX):  # process_* and python_* no logged key can reach at all
            assert name in {catalog_module._named_by_rule(key)[0] for key in keys_named(name)}, name
    assert len({key for name in OWN for key in keys_named(name)}) > 5 * len(OWN)


def test_the_reported_keys_are_renamed_and_the_exposition_stays_clean():
    reported = {
        "host/memory_used_gb": "verl_logged_host_memory_used_bytes",
        "gpu/memory_used_gb": "verl_logged_gpu_memory_used_bytes",
        "job/rss_mb": "verl_logged_job_rss_bytes",
        "training/last_step_timestamp_ms": "verl_logged_training_last_step_timestamp_seconds",
        "exporter/collector_duration_ms": "verl_logged_exporter_collector_duration_seconds",
        "training/steps_ingested": "verl_logged_training_steps_ingested",
        "gpus": "verl_logged_gpus",
        "actor_pg_loss": "verl_logged_actor_pg_loss",  # not the catalog's actor/pg_loss
    }
    assert {key: default_name(key)[0] if key != "actor_pg_loss" else CATALOG.resolve(key).spec.name
            for key in reported} == reported
    store = RunStore(CATALOG)
    store.ingest(Record(RunKey("p", "e"), 1, {key: 1e6 for key in reported} | {"actor/pg_loss": 0.5}))
    text = scrape(training=TrainingCollector(store), gpu=GpuCollector(FakeNvmlBackend(gpus=1), timeout_seconds=None),
                  host=HostCollector())
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps))
    assert check_metrics(text) == ""
    for name in itertools.chain(reported.values(), ["verl_actor_pg_loss"]):
        assert f"\n{name}{{" in text
