"""The schema is what the collectors serve, and the imports of the exporter and of the mixin point one
way only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from verl_exporter import schema
from verl_exporter.collectors import CollectorRunner
from verl_exporter.collectors.evidence import EvidenceCollector
from verl_exporter.collectors.exporter import ExporterCollector
from verl_exporter.collectors.gpu import GpuCollector
from verl_exporter.collectors.host import HostCollector
from verl_exporter.collectors.job_processes import JobSelector
from verl_exporter.collectors.node import NodeCollector
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.gpu.fake import FakeNvmlBackend
from verl_exporter.store import run_settings
from verl_exporter.store.catalog import default_catalog, is_reserved
from verl_exporter.store.run_store import RunStore

PACKAGE = Path(schema.__file__).parent
MIXIN = PACKAGE.parents[1] / "mixin" / "verl_mixin"  # the rules and dashboards, which read the exporter's schema
ROOTS = {"verl_exporter": PACKAGE, "verl_mixin": MIXIN}
CATALOG = default_catalog()


def described(collector) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """name -> (type, help, labels) of what ``collector.describe()`` gives, labels as the first
    sample-less family knows them (client_python keeps them in ``_labelnames``)."""
    return {family.name: (family.type, family.documentation, tuple(family._labelnames))
            for family in collector.describe()}


def listed(*tables, extra: dict | None = None) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    out = {}
    for table in tables:
        for key, family in table.items():
            labels = family.labels + tuple((extra or {}).get(key, ()))
            out[family.name] = (family.type, family.help, labels)
    return out


COLLECTORS = {
    "gpu": (lambda: GpuCollector(FakeNvmlBackend(), job=JobSelector(pid=1), timeout_seconds=None),
            lambda: listed(schema.GPUS, schema.JOB_GPUS)),
    "host": (lambda: HostCollector(job=JobSelector(pid=1)), lambda: listed(schema.HOST, schema.JOB)),
    "training": (lambda: TrainingCollector(RunStore(CATALOG)),
                 lambda: listed(schema.TRAINING_RUN, schema.TRAINING_STORE,
                                extra={"config_info": run_settings.info_labels(CATALOG)})),
    "node": (lambda: NodeCollector(lambda: []), lambda: listed(schema.NODE)),
    "evidence": (lambda: EvidenceCollector(None), lambda: listed(schema.EVIDENCE)),
    "exporter": (ExporterCollector, lambda: listed(schema.EXPORTER)),
    "runner": (lambda: CollectorRunner({}), lambda: listed(schema.RUNNER)),
}


@pytest.mark.parametrize("name", sorted(COLLECTORS))
def test_each_collector_describes_exactly_its_schema_entries(name):
    make, expected = COLLECTORS[name]
    assert described(make()) == expected()


def test_the_schema_tables_are_those_of_the_collectors_and_names_are_unique():
    names = [family.name for family in schema.families()]
    assert len(names) == len(set(names))
    assert {name for tables in schema.BY_COLLECTOR.values() for table in tables
            for name in (f.name for f in table.values())} == set(names)
    assert all(family.type in ("gauge", "counter") for family in schema.families())


def test_every_name_the_schema_lists_is_reserved_from_logged_keys():
    for family in schema.families():
        assert all(is_reserved(name) for name in family.sample_names), family.name
        resolved = CATALOG.resolve(family.name.removeprefix("verl_").replace("_", "/", 1)).spec.name
        assert resolved != family.name


def test_the_clock_event_reasons_nvml_reads_are_named_in_the_help():
    from verl_exporter.gpu.nvml import CLOCK_EVENT_REASONS, REMAPPED_ROW_STATES

    assert all(reason in schema.GPUS["clock_event_active"].help for reason in CLOCK_EVENT_REASONS)
    assert all(state in schema.GPUS["remapped_rows"].help for state in REMAPPED_ROW_STATES)


def _ours(name: str) -> bool:
    return name.split(".")[0] in ROOTS


def _module_name(path: Path) -> str:
    root = next(top for top in ROOTS.values() if path.is_relative_to(top))
    return ".".join(path.relative_to(root.parent).with_suffix("").parts)


def _imports(path: Path) -> set[str]:
    """The modules of the exporter and the mixin that ``path`` imports, at the top or inside a function alike."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if _ours(alias.name)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not _ours(target):
                continue
            for alias in node.names:  # ``from . import schema`` imports the module schema
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _module_path(candidate) else target)
    return {name.removesuffix(".__init__") for name in found}


def _module_path(name: str) -> Path | None:
    top, *rest = name.split(".")
    relative = Path(ROOTS[top], *rest)
    for path in (relative.with_suffix(".py"), relative / "__init__.py"):
        if path.exists():
            return path
    return None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in [*PACKAGE.rglob("*.py"), *MIXIN.rglob("*.py")]:
        module = _module_name(path).removesuffix(".__init__")
        graph[module] = _imports(path) - {module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == 1:
                return stack[stack.index(child):] + [child]
            if child not in state:
                found = visit(child)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_in_the_package_not_even_inside_functions():
    graph = _graph()
    assert "verl_exporter.schema" in graph and graph["verl_exporter.schema"] == set()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_a_package_is_a_node_of_its_modules_imports():
    graph = _graph()
    assert "verl_exporter.schema" in graph["verl_exporter.store.catalog"]
    assert "verl_exporter.collectors.run_cache" in graph["verl_exporter.collectors.training"]


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto the exporter's sub-packages (``verl_exporter.http``, ...) and the mixin
    (one node, ``verl_mixin``); a module of the exporter's root stays a node of its own."""
    def package(module: str) -> str:
        parts = module.split(".")
        if parts[0] == "verl_mixin":
            return "verl_mixin"
        return ".".join(parts[:2]) if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else module

    folded: dict[str, set[str]] = {}
    for module, imports in graph.items():
        folded.setdefault(package(module), set()).update(package(name) for name in imports)
    return {name: imports - {name} for name, imports in folded.items()}


def test_no_import_cycle_between_the_sub_packages():
    packages = _packages(_graph())
    assert {"verl_exporter.config", "verl_exporter.http", "verl_exporter.store"} <= set(packages)
    assert "verl_exporter.config" in packages["verl_exporter.http"]  # http reads its files through config
    assert "verl_exporter.store" in packages["verl_mixin"]  # the rules render from the exporter's catalog
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])


def test_the_package_fold_sees_a_loop_two_modules_apart():
    graph = {"verl_exporter.config.reload": {"verl_exporter.http.server"},
             "verl_exporter.http.web_config": {"verl_exporter.config.yaml_files"}}
    assert _cycle(_packages(graph)) == ["verl_exporter.config", "verl_exporter.http", "verl_exporter.config"]
