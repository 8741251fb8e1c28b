"""Arbitrary text and bytes in keys, values, steps and file names, through the sources, the store
and the collector runner, always give an exposition Prometheus and client_python both accept.

Hypothesis generates 10,000 cases. A case is one file, its name any bytes, matched by a glob,
holding FileLogger JSON lines, console lines or raw bytes; it is drawn as one byte string that
``decode_case`` reads its choices from (one draw per case instead of hundreds keeps generation
fast). Cases are then followed in batches: one glob and one store per batch, each case a run of
its own, one exposition per batch, read by client_python's parsers (strict OpenMetrics too) and,
many batches per call, by ``promtool check metrics``. A batch that fails is replayed case by case
to name the case that broke it.
"""

import json
import logging
import os
import re
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from servers import require_binary
from verl_exporter.collectors import CollectorRunner
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.schema import reserved_names
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.run_store import RunStore

CASES = 10_000
BATCH = 250  # cases per store and exposition
PROMTOOL_BATCHES = 8  # expositions per promtool call

SPECIAL = ["\ud800", "\udbff", "\udc00", "\udcff", "\udfff", "\ufffd", "\u2028", "\x85", "\ufeff", "é", "世", "😀",
           "\\", '"', "\n", "\r", "\t", "\x00", "\x1b", " - ", ":", "/", "_", "{", "}", "np.float64("]
OWN_KEYS = sorted(name.removeprefix("verl_").replace("_", "/", 1) for name in reserved_names()
                  if name.startswith("verl_"))
KEYS = sorted({"actor/pg_loss", "actor/entropy_loss", "timing_s/gen", "timing_per_token_ms/gen", "val_core",
                 "perf/max_memory_allocated_gb", "val-core/openai/gsm8k/acc/mean@1", "val-aux/a/b/c", "val-core",
                 "host/memory_used_gb", "gpu/memory_used_gb", "job/rss_mb", "exporter/x_ms", "x_total", "1abc",
                 "training/last_step_timestamp_ms", "actor_pg_loss", "ACTOR/PG_LOSS", "", "/", "A" * 200})
NUMBER_TEXTS = ["0x10", "1e999", "-1e999", "nan", "NaN", "Infinity", "-Infinity", "1_0", "np.float64(0.5)",
                "np.int64(3", "True", "np.False_", "1.2.3", "--1", "", " 1 ", "1e-400", "0" * 400 + "1"]
STEPS = ['"1"', "1.5", "1e400", "null", "true", "[]", "{}", "-0", "NaN", "", "0x10", str(2**53), str(2**53 + 1),
         str(-(2**53) - 1), str(2**63), str(2**64 + 1)]
PREFIXES = ["", "(TaskRunner pid=1) ", "\x1b[36m(main_task pid=2)\x1b[0m ", "\r", "'project_name': 'p', "]


class Choices:
    """Reads a case's choices from its bytes; past their end every choice is 0."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1] if self.at <= len(self.data) else 0

    def number(self, size: int) -> int:
        return int.from_bytes(self.raw(size).ljust(size, b"\0"), "little")

    def raw(self, size: int) -> bytes:
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def pick(self, options: list):
        return options[self.byte() % len(options)]

    def char(self) -> str:
        first = self.byte()
        if first < 0x80:
            return chr(first)  # ASCII, control characters included
        if first < 0xc0:
            return SPECIAL[first % len(SPECIAL)]
        return chr(self.number(3) % 0x110000)  # any code point, lone surrogates included

    def text(self, limit: int = 12) -> str:
        return "".join(self.char() for _ in range(self.byte() % limit))

    def key(self) -> str:
        kind = self.byte() % 5
        return (self.pick(KEYS) if kind == 0 else self.pick(OWN_KEYS) if kind == 1 else self.text() if kind == 2 else
                self.pick(KEYS) + self.text(4) if kind == 3 else
                self.raw(self.byte() % 12).decode("utf-8", "surrogateescape"))

    def float(self) -> float:
        return struct.unpack("<d", self.raw(8).ljust(8, b"\0"))[0]  # NaN, infinities and subnormals too

    def step(self) -> str:
        kind = self.byte() % 5
        if kind == 0:
            return str(self.number(2) - 2**15)
        if kind == 1:
            return "9" * (self.number(2) % 5000)  # beyond 2^53, past Python's 4300-digit limit too
        if kind == 2:
            return self.pick(STEPS)
        return str(self.number(8) - 2**63) if kind == 3 else self.text(6)

    def json_value(self, depth: int = 0):
        kind = self.byte() % 11
        if kind >= 9 and depth < 2:
            items = [self.json_value(depth + 1) for _ in range(self.byte() % 3)]
            return items if kind == 9 else {self.key(): item for item in items}
        return [self.float, lambda: self.number(8) - 2**63, self.text, lambda: self.pick(NUMBER_TEXTS),
                lambda: None, lambda: self.byte() % 2 == 0, lambda: int("9" * (self.number(2) % 4300 + 1)),
                lambda: float(self.number(2) - 2**15) / 8, self.key, self.float, self.float][kind]()

    def jsonl_line(self) -> str:
        data = {self.key(): self.json_value() for _ in range(self.byte() % 6)}
        body = json.dumps(data, ensure_ascii=self.byte() % 2 == 0)
        if self.byte() % 8 == 0:
            body = self.pick(["[]", "null", '"x"', "1", body[:-1], "{" + body])
        return '{"step": %s, "data": %s}' % (self.step(), body)

    def console_line(self) -> str:
        pairs = []
        for _ in range(self.byte() % 6):
            kind = self.byte() % 4
            value = (repr(self.float()) if kind == 0 else self.pick(NUMBER_TEXTS) if kind == 1 else
                     f"np.float64({self.float()!r})" if kind == 2 else self.text(8))
            pairs.append(f" - {self.key()}:{value}")
        return self.pick(PREFIXES) + "step:" + self.step() + "".join(pairs)


def decode_case(data: bytes) -> tuple[str, bytes, list[bytes]]:
    """(suffix, file name, lines) read from ``data``."""
    choices = Choices(data)
    suffix = choices.pick([".jsonl", ".log", ".json", ".txt"])
    name = choices.raw(choices.byte() % 24 + 1).replace(b"/", b"_").replace(b"\0", b"_")
    lines = []
    for _ in range(choices.byte() % 4 + 1):
        kind = choices.byte() % 8
        if kind == 0:
            lines.append(choices.raw(choices.byte() % 80))
            continue
        text = choices.jsonl_line() if (kind < 6) == (suffix in (".jsonl", ".json")) else choices.console_line()
        lines.append(text.encode("utf-8", "surrogatepass"))  # a lone surrogate as JSON writes it, or raw
    return suffix, name, lines


def follow(folder: str, cases: dict[int, tuple]) -> tuple[str, str]:
    """Write each case to ``folder/e<i>/``, follow them all through one glob and one store, and
    return the text and OpenMetrics expositions."""
    for index, (suffix, name, lines) in cases.items():
        os.makedirs(os.path.join(folder, f"e{index}"))
        with open(os.path.join(os.fsencode(folder), b"e%d" % index, b"f" + name + suffix.encode()), "wb") as out:
            out.write(b"\n".join(lines) + b"\n")
    store = RunStore(default_catalog(), max_series_per_run=20)
    source = Source(os.path.join(folder, "*", "*"), store)
    source.poll()
    while source.behind:
        source.poll()
    registry = CollectorRegistry()
    registry.register(CollectorRunner({"training": TrainingCollector(store)}))
    try:
        return generate_latest(registry).decode(), generate_openmetrics(registry).decode()
    finally:
        source.close()


def check(text: str, openmetrics: str, files: int) -> None:
    """client_python reads both; nothing served twice; the collector did not fail; every file has
    its verl_exporter_source_up."""
    list(parse_openmetrics(openmetrics))  # strict: refuses a name two families share, bad escapes, ...
    families = list(text_string_to_metric_families(text))
    series = [(sample.name, tuple(sorted(sample.labels.items()))) for family in families for sample in family.samples]
    assert len(series) == len(set(series)), "a series served twice"
    assert all(name.startswith("verl_") for name, _ in series)
    success = [sample.value for family in families for sample in family.samples
               if sample.name == "verl_exporter_collector_success"]
    assert success == [1.0], "the training collector failed: the data was not clean at ingestion"
    assert sum(name == "verl_exporter_source_up" for name, _ in series) == files


def merged(texts: dict[int, str]) -> str:
    """One document of many expositions: exposition i's names begin ``verl_b<i>_``."""
    return "".join(re.sub(r"^(# (?:HELP|TYPE) )?verl_", rf"\1verl_b{index}_", text, flags=re.M)
                   for index, text in texts.items())


def promtool_complaints(document: str) -> str:
    result = subprocess.run([require_binary("promtool"), "check", "metrics"], input=document.encode(),
                            capture_output=True, timeout=300)
    output = (result.stdout + result.stderr).decode()
    # Lint advice on a logged key's own words (an "ms" inside a name) is no refusal.
    return "\n".join(line for line in output.splitlines() if line.strip() and "abbreviated units" not in line)


def culprit(root: str, cases: dict[int, tuple]):
    """The first case that fails on its own, or None."""
    for index, case in cases.items():
        try:
            text, openmetrics = follow(os.path.join(root, f"alone{index}"), {index: case})
            check(text, openmetrics, 1)
            assert not promtool_complaints(text), promtool_complaints(text)
        except Exception as exc:
            return case, exc
    return None


@pytest.fixture
def quiet_sources():
    """10,000 cases of bad lines would log (rate limited) tens of thousands of warnings."""
    logger = logging.getLogger("verl_exporter.sources")
    level, logger.level = logger.level, logging.ERROR
    yield
    logger.setLevel(level)


def test_any_bytes_in_keys_values_steps_and_file_names_give_an_accepted_exposition(tmp_path, quiet_sources):
    drawn: list[bytes] = []

    @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(min_size=64, max_size=1200))
    def draw(data):
        drawn.append(data)

    draw()
    assert len(drawn) >= CASES
    cases = {index: decode_case(data) for index, data in enumerate(drawn)}
    texts: dict[int, str] = {}
    for start in range(0, len(cases), BATCH):
        batch = {index: cases[index] for index in range(start, min(start + BATCH, len(cases)))}
        try:
            text, openmetrics = follow(str(tmp_path / f"b{start}"), batch)
            check(text, openmetrics, len(batch))
        except Exception as exc:
            pytest.fail(f"batch {start}: {exc!r}; failing case: {culprit(str(tmp_path), batch)!r}")
        texts[start] = text
    starts = sorted(texts)
    for at in range(0, len(starts), PROMTOOL_BATCHES):
        chunk = {start: texts[start] for start in starts[at:at + PROMTOOL_BATCHES]}
        complaints = promtool_complaints(merged(chunk))
        if complaints:
            start = int(re.search(r"verl_b(\d+)_", complaints).group(1)) if "verl_b" in complaints else starts[at]
            batch = {index: cases[index] for index in range(start, min(start + BATCH, len(cases)))}
            pytest.fail(f"promtool: {complaints[:2000]}\nfailing case: {culprit(str(tmp_path), batch)!r}")


def test_the_cases_reach_every_kind_of_input():
    """The decoder is worth the 10,000 cases only if its choices reach what they should."""
    seen = [decode_case(os.urandom(600)) for _ in range(500)]
    lines = b"\n".join(line for _, _, case in seen for line in case)
    assert {suffix for suffix, _, _ in seen} == {".jsonl", ".log", ".json", ".txt"}
    assert any(b"\xff" in name or b"\x80" in name for _, name, _ in seen)
    for needle in (b"\\ud8", b"\xed\xa0", b"\\udc", b'"step": 999999999999', b"step:-", b"0x10", b"[", b"null",
                   b"host/memory_used", b"np.float64(", b"NaN", b"Infinity"):
        assert needle in lines, needle


def test_promtool_batches_still_name_the_exposition_that_fails():
    """The merged check can fail: a family declared twice in one exposition is found and named."""
    good = "# HELP verl_a A.\n# TYPE verl_a gauge\nverl_a 1.0\n"
    assert promtool_complaints(merged({0: good, 1: good})) == ""
    complaints = promtool_complaints(merged({0: good, 7: good + good}))
    assert complaints and "verl_b7_a" in complaints
