"""Every real-verl fixture (tests/fixtures/verl/<release>/<run>/), console and JSONL, read through
the real Source, RunStore and training collector: what verl wrote is what is served.

The ground truth is each run's logged.json: the dicts verl handed to Tracking.log (for a resumed
run, those of both attempts, the first one's listed in first_attempt). Expected names,
labels and scales come from the catalog (what the exporter documents), not from a second copy of
the naming rule. New fixtures are picked up by the glob.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exposition import scrape
from owner import ME
from promtool import check_metrics
from verl_exporter.collectors.training import TrainingCollector
from verl_exporter.sources import Source
from verl_exporter.store.catalog import default_catalog
from verl_exporter.store.records import RunKey
from verl_exporter.store.run_store import RunStore
from verl_exporter.store.step_windows import SPARSE

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "verl"
RUNS = sorted(path.parent for path in FIXTURES.glob("*/*/logged.json"))
FILES = {"console": "console.log", "jsonl": "metrics.jsonl"}
CASES = [pytest.param(run, fmt, id=f"{run.parent.name}-{run.name}-{fmt}")
         for run in RUNS for fmt in FILES if (run / FILES[fmt]).exists()]
if not CASES:
    CASES = [pytest.param(None, None, marks=pytest.mark.skip(
        reason=f"no real-verl fixtures under {FIXTURES} (scripts/verl_fixtures.py, `make fixtures`, writes them)"))]

# The statistics verl's process_validation_metrics names (0.4 on), read from the right of a key.
VAL_STATISTIC = re.compile(r"/([^/]+)/((?:mean|std)@\d+|(?:best|worst|maj)@\d+/(?:mean|std))$")
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def release(run: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", run.parent.name)[:3])


def logged_value(value) -> float | None:
    """A logged.json value as a number; None for what is no number (verl's loggers skip it)."""
    if isinstance(value, str):
        return NONFINITE.get(value.strip().lower())
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


class Case:
    """One fixture file ingested and scraped once, with what verl logged in it."""

    def __init__(self, run: Path, fmt: str):
        truth = json.loads((run / "logged.json").read_text(encoding="utf-8"))
        self.run, self.fmt, self.path = run, fmt, run / FILES[fmt]
        self.release = release(run)
        # The run is the file's: its owner is the user these tests run as.
        self.key = RunKey(truth["project"], truth["experiment"], user=ME)
        steps = truth["steps"]
        if fmt == "jsonl" and "first_attempt" in truth:
            # a resumed run: its FileLogger opened the file with "wb", so it holds the last attempt only
            steps = steps[len(truth["first_attempt"]["steps"]):]
        if fmt == "jsonl":
            held = set(truth.get("jsonl_steps", [entry["step"] for entry in steps]))
            steps = [entry for entry in steps if entry["step"] in held]
            self.raw = self._jsonl_raw()
        self.steps = steps
        self.store = RunStore(default_catalog())
        # A console log is named from the config verl prints; a JSONL file from its path.
        names = {} if fmt == "console" else {"project": self.key.project, "experiment": self.key.experiment}
        source = Source(str(self.path), self.store, fmt=fmt, **names)
        while source.poll():
            pass
        source.close()
        self.text = scrape(training=TrainingCollector(self.store))
        self.samples = [(sample.name, sample.labels, sample.value)
                        for family in text_string_to_metric_families(self.text) for sample in family.samples]
        self.console_text = self.path.read_text(encoding="utf-8", errors="replace") if fmt == "console" else ""

    def _jsonl_raw(self) -> dict[int, dict]:
        """{step: {key: raw JSON value}} as the FileLogger wrote them (null where orjson wrote NaN/Inf)."""
        raw: dict[int, dict] = {}
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                raw.setdefault(record["step"], {}).update(record["data"])
        return raw

    def latest(self) -> dict[str, float]:
        """Each numeric key's last logged value, as this file holds it; 0 for a count verl logs only where
        it is not 0 (``step_windows.SPARSE``) that the last step left out."""
        values: dict[str, float] = {}
        for entry in self.steps:
            for key, value in entry["data"].items():
                number = self.expected(entry["step"], key, value)
                if number is not None:
                    values[key] = number
        catalog, last = default_catalog(), self.steps[-1]["data"] if self.steps else {}
        for key in values:
            if key not in last and catalog.resolve(key).spec.name in SPARSE:
                values[key] = 0.0
        return values

    def expected(self, step: int, key: str, value) -> float | None:
        number = logged_value(value)
        if number is None:
            return None
        if self.fmt == "jsonl" and self.raw.get(step, {}).get(key, 0) is None:
            return math.nan  # orjson (verl 0.8 on) writes NaN, Inf and -Inf all as null
        if self.fmt == "console":
            if f"{key}:" not in self.console_text:
                return None  # not a Python number (a tensor): verl's console logger leaves it out
            if self.release < (0, 5) and math.isfinite(number):
                number = float(f"{number:.3f}")  # concat_dict_to_str of verl < 0.5 prints 3 decimals
        return number

    def beside(self, key: str, other: str) -> bool:
        """Whether the last record holding ``key`` holds ``other`` too."""
        last = next(entry["data"] for entry in reversed(self.steps) if key in entry["data"])
        return other in last

    def served(self, name: str, **labels) -> list[float]:
        want = {"project": self.key.project, "experiment": self.key.experiment,
                "user": self.key.user, "team": self.key.team, **labels}
        return [value for sample_name, sample_labels, value in self.samples
                if sample_name == name and sample_labels == want]


@lru_cache(maxsize=None)
def case(run: Path, fmt: str) -> Case:
    return Case(run, fmt)


def same(served: float, expected: float, release: tuple[int, ...], fmt: str, scale: float) -> bool:
    if math.isnan(expected):
        return math.isnan(served)
    if math.isinf(expected):
        return served == expected
    if fmt == "console" and release < (0, 5):
        return math.isclose(served, expected * scale, rel_tol=1e-9, abs_tol=0.0011 * scale)
    # float32 values reach the files as their shortest float32 text
    return math.isclose(served, expected * scale, rel_tol=1e-6, abs_tol=1e-12)


@pytest.mark.parametrize("run, fmt", CASES)
def test_no_parse_errors(run, fmt):
    c = case(run, fmt)
    errors = [value for name, _, value in c.samples if name == "verl_exporter_parse_errors_total"]
    assert sum(errors) == 0, f"{c.path}: {errors}"


@pytest.mark.parametrize("run, fmt", CASES)
def test_served_text_is_promtool_clean(run, fmt):
    assert check_metrics(case(run, fmt).text) == ""


@pytest.mark.parametrize("run, fmt", CASES)
def test_run_and_last_step(run, fmt):
    c = case(run, fmt)
    if not c.steps:  # a FileLogger that crashed on every step wrote nothing
        assert c.store.snapshot().runs == []
        return
    assert [state.run for state in c.store.snapshot().runs] == [c.key]
    assert c.served("verl_training_last_step") == [max(entry["step"] for entry in c.steps)]


@pytest.mark.parametrize("run, fmt", CASES)
def test_every_logged_key_is_served_with_the_value_verl_wrote_in_base_units(run, fmt):
    c = case(run, fmt)
    catalog = default_catalog()
    wrong = []
    for key, value in c.latest().items():
        resolved = catalog.resolve(key)
        if resolved.spec.key != key and c.beside(key, resolved.spec.key):
            resolved = catalog.own(key)  # an older spelling logged beside the newer one: its own metric
        spec = resolved.spec
        if spec.unit in ("seconds", "bytes") and not spec.name.endswith("_" + spec.unit):
            wrong.append(f"{key}: {spec.name} is in {spec.unit} but its name does not say so")
        if spec.unit not in ("", "seconds") and spec.name.endswith("_seconds"):
            wrong.append(f"{key}: {spec.name} is no duration ({spec.unit or 'no unit'})")
        served = c.served(spec.name, **dict(zip(spec.label_names, resolved.label_values)))
        if len(served) != 1 or not same(served[0], value, c.release, fmt, spec.scale):
            wrong.append(f"{key}: logged {value!r} x {spec.scale}, served {spec.name} {served}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("run, fmt", CASES)
def test_validation_families_are_labelled_by_data_source_variable_and_statistic(run, fmt):
    c = case(run, fmt)
    for key, value in c.latest().items():
        section = key.split("/", 1)[0]
        match = VAL_STATISTIC.search(key)
        if section not in ("val-core", "val-aux") or not match:
            continue
        data_source = key[len(section) + 1:match.start()]
        labels = {"data_source": data_source, "variable": match.group(1), "metric": match.group(2)}
        served = c.served("verl_" + section.replace("-", "_"), **labels)
        assert len(served) == 1 and same(served[0], value, c.release, fmt, 1.0), (key, served)


@pytest.mark.parametrize("run, fmt", CASES)
def test_nan_and_inf_are_served_and_counted(run, fmt):
    c = case(run, fmt)
    counts: dict[str, int] = {}
    for entry in c.steps:
        for key, value in entry["data"].items():
            number = c.expected(entry["step"], key, value)
            if number is not None and not math.isfinite(number):
                counts[key] = counts.get(key, 0) + 1
    served = {labels["key"]: value for name, labels, value in c.samples
              if name == "verl_training_nonfinite_values_total"}
    assert served == counts


CONSOLE_CASES = [param for param in CASES if param.values[1] == "console"]
# Settings every release's config print holds (under its own spelling): the run-aware alerts read them.
SETTINGS_IN_EVERY_RELEASE = ("data.train_batch_size", "data.max_response_length",
                             "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.grad_clip",
                             "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.n")


@pytest.mark.parametrize("run, fmt", CONSOLE_CASES)
def test_console_gives_the_runs_settings_length_and_end(run, fmt):
    c = case(run, fmt)
    truth = json.loads((run / "logged.json").read_text(encoding="utf-8"))
    assert c.served("verl_training_total_steps") == [truth["total_steps"]]
    assert c.served("verl_training_finished") == [1.0], "the last step reached the total"
    settings = {labels["key"]: value for name, labels, value in c.samples if name == "verl_run_config"}
    missing = [key for key in SETTINGS_IN_EVERY_RELEASE if key not in settings]
    assert not missing, f"{c.path}: settings not served: {missing}"
    assert settings["actor_rollout_ref.actor.ppo_epochs"] >= 1


# What verl 0.9's V1 trainer logs beyond the legacy trainer, per trainer mode (logged.json "trainer").
V1_KEYS = {
    "v1/sync": ("training/off_policy/trajectory_staleness/mean", "training/off_policy/trajectory_spans/max",
                "training/num_turns/mean"),
    "v1/colocate_async": ("training/off_policy/trajectory_staleness/mean", "training/filter_groups/evicted_samples"),
    "v1/separate_async": ("training/off_policy/trajectory_staleness/mean", "separate_async/switch/threshold_ratio",
                          "separate_async/decision/should_switch_to_rollout", "timing_s/switch_to_trainer"),
}
V1_CASES = [param for param in CASES if param.values[0] is not None
            and json.loads((param.values[0] / "logged.json").read_text(encoding="utf-8")).get("trainer") in V1_KEYS]


@pytest.mark.parametrize("run, fmt", V1_CASES or [
    pytest.param(None, None, marks=pytest.mark.skip(reason="no V1 runs"))])
def test_v1_trainer_runs_hold_and_serve_their_own_keys(run, fmt):
    c = case(run, fmt)
    trainer = json.loads((run / "logged.json").read_text(encoding="utf-8"))["trainer"]
    latest = c.latest()
    missing = [key for key in V1_KEYS[trainer] if key not in latest]
    assert not missing, f"{c.path}: the V1 trainer's keys are missing: {missing}"
    catalog = default_catalog()
    for key in V1_KEYS[trainer]:
        resolved = catalog.resolve(key)
        served = c.served(resolved.spec.name, **dict(zip(resolved.spec.label_names, resolved.label_values)))
        assert len(served) == 1 and same(served[0], latest[key], c.release, fmt, resolved.spec.scale), (key, served)


RESUMED = [pytest.param(run, id=f"{run.parent.name}-{run.name}")
           for run in RUNS if (run / "metrics.first.jsonl").exists()]


def jsonl_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def follow_rewrite(run: Path, tmp_path: Path, poll_between_lines: bool) -> Case:
    """The first attempt's JSONL read, then truncated by the resumed attempt's FileLogger (open "wb")
    and written again line by line: polled as it goes, after the first attempt's whole file was read;
    or polled only once it is complete, after only the first attempt's first line was read."""
    truth = json.loads((run / "logged.json").read_text(encoding="utf-8"))
    key = RunKey(truth["project"], truth["experiment"], user=ME)
    path = tmp_path / f"{truth['experiment']}.jsonl"
    first_lines = jsonl_lines(run / "metrics.first.jsonl")
    seen = first_lines if poll_between_lines else first_lines[:1]
    path.write_bytes(b"".join(seen))
    store = RunStore(default_catalog())
    source = Source(str(path), store, fmt="jsonl", project=key.project, experiment=key.experiment)
    while source.poll():
        pass
    first = truth["first_attempt"]["jsonl_steps"][:len(seen)]
    assert [state.last_step for state in store.snapshot().runs] == [max(first)]
    if not poll_between_lines:  # the first attempt writes on, unseen, before it fails
        path.write_bytes(b"".join(first_lines))
    with open(path, "wb") as handle:  # what verl 0.9's FileLogger does when the run starts again
        if poll_between_lines:
            source.poll()
        for line in jsonl_lines(run / "metrics.jsonl"):
            handle.write(line)
            handle.flush()
            if poll_between_lines:
                source.poll()
    while source.poll():
        pass
    source.close()
    c = Case.__new__(Case)
    c.run, c.fmt, c.path, c.release, c.key, c.store = run, "jsonl", path, release(run), key, store
    c.steps = truth["steps"][len(truth["first_attempt"]["steps"]):]
    c.raw = c._jsonl_raw()
    c.text = scrape(training=TrainingCollector(store))
    c.samples = [(sample.name, sample.labels, sample.value)
                 for family in text_string_to_metric_families(c.text) for sample in family.samples]
    c.console_text = ""
    c.records_expected = len(first) + len(truth["jsonl_steps"])  # one per step line of either attempt
    return c


def check_resumed(c: Case) -> None:
    errors = [value for name, _, value in c.samples if name == "verl_exporter_parse_errors_total"]
    assert sum(errors) == 0, errors
    assert [state.run for state in c.store.snapshot().runs] == [c.key]
    assert c.served("verl_training_last_step") == [max(entry["step"] for entry in c.steps)]
    assert [state.steps_ingested for state in c.store.snapshot().runs] == [c.records_expected]
    catalog = default_catalog()
    wrong = []
    for key, value in c.latest().items():
        spec = catalog.resolve(key).spec
        served = c.served(spec.name, **dict(zip(spec.label_names, catalog.resolve(key).label_values)))
        if len(served) != 1 or not same(served[0], value, c.release, "jsonl", spec.scale):
            wrong.append(f"{key}: resumed attempt logged {value!r}, served {spec.name} {served}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("run", RESUMED or [pytest.param(None, marks=pytest.mark.skip(reason="no resumed run"))])
def test_a_resumed_run_truncating_its_jsonl_reads_as_a_restart_polled_as_it_is_written(run, tmp_path):
    """Polled while the resumed attempt writes (the exporter sees the file shrink): the run goes on
    from the resumed step with the values the resumed attempt wrote, and nothing is misread."""
    check_resumed(follow_rewrite(run, tmp_path, poll_between_lines=True))


@pytest.mark.parametrize("run", RESUMED or [pytest.param(None, marks=pytest.mark.skip(reason="no resumed run"))])
def test_a_resumed_run_truncating_its_jsonl_reads_as_a_restart_polled_once_rewritten(run, tmp_path):
    """Polled at step 0 of the first attempt, then only once the resumed attempt has written its
    whole file: the same file (same inode), now longer than the offset read, must be read from its
    start, not from the old offset."""
    check_resumed(follow_rewrite(run, tmp_path, poll_between_lines=False))
