"""Training metrics of every followed run, read from the RunStore at scrape time.

Emits, for each verl key logged (names from the catalog, every series labelled with the run)::

    # HELP verl_actor_pg_clipfrac verl actor/pg_clipfrac: Fraction of samples whose policy update was clipped by PPO [ratio]. Healthy 0.05 to 0.3.
    # TYPE verl_actor_pg_clipfrac gauge
    verl_actor_pg_clipfrac{experiment="ppo-qwen",project="gsm8k"} 0.12

and per run::

    verl_training_last_step{project,experiment}                    last step seen
    verl_training_last_step_timestamp_seconds{project,experiment}  when it was seen (unix time)
    verl_training_steps_ingested_total{project,experiment}         steps read since the exporter started
    verl_training_finished{project,experiment}                     1 once the run reached its last step or verl
                                                                   printed its end of training
    verl_training_finished_timestamp_seconds{project,experiment}   once finished only: when its last step was
                                                                   read (rules guard on it: few series)
    verl_training_total_steps{project,experiment}                  the run's length (verl's "Total training steps")
    verl_run_config{project,experiment,key}                        the run's numeric settings (catalog.yaml's
                                                                   ``settings``), key the dotted verl setting
    verl_run_config_info{project,experiment,adv_estimator,model,rollout,strategy} 1
    verl_training_nonfinite_values_total{project,experiment,key}   NaN/Inf values seen per verl key
    verl_training_series_dropped_total{project,experiment}         keys dropped by the per-run series cap
    verl_training_run_info{project,experiment,source} 1

and, from the errors the run's log shows and its first line::

    verl_training_log_errors_total{project,experiment,kind}    kind: cuda_oom, nccl_timeout, segfault,
                                                               ray_actor_died, traceback
    verl_training_started_timestamp_seconds{project,experiment} when its first line (config print or
                                                               first step) was written

and, once a run has started saving a checkpoint (verl's ``local_global_step_folder:`` line)::

    verl_checkpoint_saving{project,experiment}                           1 while a save runs, else 0
    verl_checkpoint_save_started_timestamp_seconds{project,experiment}   when the latest save started
    verl_checkpoint_last_step{project,experiment}                        step of the latest save done
    verl_checkpoint_last_save_duration_seconds{project,experiment}       how long it took

and for the exporter: ``verl_exporter_parse_errors_total{source}``,
``verl_exporter_values_dropped_total{source,reason}`` (values that are no number: reason
``not_a_number``, ``object``, ``list`` or ``null``), ``verl_exporter_source_up{source}`` (1 when a
configured path or a glob's match can be read, 0 when it is missing, not a regular file or
unreadable), ``verl_training_runs``, ``verl_training_runs_dropped_total`` (records refused by the
run cap), ``verl_training_run_cap_reached`` (1 while it refuses) and
``verl_training_runs_expired_total{reason}`` (runs dropped by retention: finished or idle; or
``no_step``: a run that never stepped, dropped at the run cap for one that steps).
"""

from __future__ import annotations

import logging
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import run_settings
from . import check_renderable
from ..store import RunStore

log = logging.getLogger(__name__)
RUN_LABELS = ["project", "experiment"]
_WARNED_RUNS: set = set()  # runs whose families could not be built, warned about once (bounded)
# Per-run families served only where some run has a sample (no empty HELP and TYPE for them).
OPTIONAL_FAMILIES = ("finished_time", "total_steps", "config", "config_info", "log_errors", "checkpoint_saving",
                     "checkpoint_started", "checkpoint_step", "checkpoint_seconds")


def unrenderable(run, exc: Exception) -> None:
    """Log, once per run, that the run's families could not be built; it is left out of the scrape."""
    if run not in _WARNED_RUNS and len(_WARNED_RUNS) < 1000:
        _WARNED_RUNS.add(run)
        log.warning("run %r left out of /metrics: its values cannot be served (%s: %s)", run, type(exc).__name__,
                    str(exc)[:200])


class TrainingCollector:
    """The training families. ``collect()`` hands them over as client_python families; inside
    ``training_render.render_text`` it hands over one family already rendered, from a cache that
    formats each run once per change (see ``training_render``)."""

    def __init__(self, store: RunStore):
        from .training_render import RunRenderCache

        self.store = store
        self.cache = RunRenderCache(self)

    def describe(self) -> Iterable[Metric]:
        return self._families().values()

    def _families(self) -> dict[str, Metric]:
        families = self._run_families()
        families["config_info"] = GaugeMetricFamily(
            "verl_run_config_info", "The run's string settings (verl's config) as labels.",
            labels=RUN_LABELS + run_settings.info_labels(self.store.catalog))
        return families

    def collect(self) -> Iterable[Metric]:
        from .training_render import PRERENDER

        if PRERENDER.get():
            yield self.cache.render()
            return
        snapshot = self.store.snapshot()
        families = self._families()
        logged: dict[str, GaugeMetricFamily] = {}
        for state in sorted(snapshot.runs, key=lambda s: s.run):
            try:
                run = self.run_families(state)
                check_renderable(list(run.values()))
            except Exception as exc:  # what one run logged never fails the others' families
                unrenderable(state.run, exc)
                continue
            for key, family in run.items():
                if key.startswith("verl_"):
                    if logged.setdefault(key, family) is not family:
                        logged[key].samples += family.samples
                else:
                    families[key].samples += family.samples
        self.add_store_families(families, snapshot)
        for name in OPTIONAL_FAMILIES:
            if not families[name].samples:
                del families[name]
        yield from families.values()
        yield from (logged[name] for name in sorted(logged))

    def run_families(self, state, logged: bool = True) -> dict[str, Metric]:
        """One run's families: the per-run ones by key (``last_step``, ...), the logged series by
        metric name (``verl_...``, unless ``logged`` is False), only those the run has samples for."""
        families = self._families()
        info_labels = run_settings.info_labels(self.store.catalog)
        run = [state.run.project, state.run.experiment]
        if state.last_step is not None:
            families["last_step"].add_metric(run, state.last_step)
        if state.last_step_time is not None:
            families["last_step_time"].add_metric(run, state.last_step_time)
        families["steps"].add_metric(run, state.steps_ingested)
        families["finished"].add_metric(run, 1.0 if state.finished else 0.0)
        if state.finished and state.last_step_time is not None:
            families["finished_time"].add_metric(run, state.last_step_time)
        families["dropped"].add_metric(run, len(state.dropped_keys) + state.dropped_unremembered)
        families["info"].add_metric(run + [state.source], 1.0)
        if state.total_steps is not None:
            families["total_steps"].add_metric(run, state.total_steps)
        for key, value in sorted(state.config.items()):
            families["config"].add_metric(run + [key], value)
        if state.config_info:
            families["config_info"].add_metric(run + [state.config_info.get(label, "") for label in info_labels], 1.0)
        for key, count in sorted(state.nonfinite.items()):
            families["nonfinite"].add_metric(run + [key], count)
        for kind, count in sorted(state.log_errors.items()):
            families["log_errors"].add_metric(run + [kind], count)
        if state.started_at is not None:
            families["started_time"].add_metric(run, state.started_at)
        checkpoint = state.checkpoint
        if checkpoint is not None:
            families["checkpoint_saving"].add_metric(run, 1.0 if checkpoint.saving else 0.0)
            families["checkpoint_started"].add_metric(run, checkpoint.started)
            if checkpoint.done_step is not None:
                families["checkpoint_step"].add_metric(run, checkpoint.done_step)
                families["checkpoint_seconds"].add_metric(run, checkpoint.done_seconds)
        out = {key: family for key, family in families.items() if family.samples}
        for (name, label_values), (resolved, value) in (state.series.items() if logged else ()):
            family = out.get(name)
            if family is None:
                spec = resolved.spec
                family = out[name] = GaugeMetricFamily(name, spec.full_help(),
                                                       labels=RUN_LABELS + list(spec.label_names))
            family.add_metric(run + list(label_values), value)
        return out

    @staticmethod
    def add_store_families(families: dict[str, Metric], snapshot) -> None:
        """The exporter-wide families of the store: parse errors, dropped values, sources, runs."""
        for source, count in sorted(snapshot.parse_errors.items()):
            families["parse_errors"].add_metric([source], count)
        for (source, reason), count in sorted(snapshot.values_dropped.items()):
            families["values_dropped"].add_metric([source, reason], count)
        for source, reason in sorted(snapshot.sources.items()):
            families["source_up"].add_metric([source], 0.0 if reason else 1.0)
        families["runs"].add_metric([], len(snapshot.versions))
        families["runs_dropped"].add_metric([], snapshot.runs_dropped)
        for reason in ("finished", "idle", "no_step"):
            families["runs_expired"].add_metric([reason], snapshot.runs_expired.get(reason, 0))
        families["run_cap_reached"].add_metric([], 1.0 if snapshot.run_cap_reached else 0.0)

    @staticmethod
    def _run_families() -> dict[str, Metric]:
        return {
            "last_step": GaugeMetricFamily(
                "verl_training_last_step", "Last training step seen for the run.", labels=RUN_LABELS),
            "last_step_time": GaugeMetricFamily(
                "verl_training_last_step_timestamp_seconds",
                "Unix time at which the run's last step was read.", labels=RUN_LABELS),
            "steps": CounterMetricFamily(
                "verl_training_steps_ingested", "Training steps read for the run since the exporter started.",
                labels=RUN_LABELS),
            "finished": GaugeMetricFamily(
                "verl_training_finished",
                "1 once the run reached its last step or verl reported the end of training, else 0.",
                labels=RUN_LABELS),
            # Only finished runs have it, so a rule's "unless finished" selects those few series, not
            # every run's verl_training_finished.
            "finished_time": GaugeMetricFamily(
                "verl_training_finished_timestamp_seconds",
                "Unix time at which the finished run's last step was read; absent while the run has not finished.",
                labels=RUN_LABELS),
            "total_steps": GaugeMetricFamily(
                "verl_training_total_steps", "Training steps the run will take (verl's Total training steps).",
                labels=RUN_LABELS),
            "config": GaugeMetricFamily(
                "verl_run_config", "The run's numeric settings from its config; key is the dotted verl setting.",
                labels=RUN_LABELS + ["key"]),
            "nonfinite": CounterMetricFamily(
                "verl_training_nonfinite_values", "NaN or Inf values logged by the run, per verl key.",
                labels=RUN_LABELS + ["key"]),
            "dropped": CounterMetricFamily(
                "verl_training_series_dropped",
                "verl keys of the run not exported because the run reached its series cap.", labels=RUN_LABELS),
            "info": GaugeMetricFamily(
                "verl_training_run_info", "A followed run and the file it is read from.",
                labels=RUN_LABELS + ["source"]),
            "started_time": GaugeMetricFamily(
                "verl_training_started_timestamp_seconds",
                "Unix time at which the run's first line (its config print or first step) was written.",
                labels=RUN_LABELS),
            "log_errors": CounterMetricFamily(
                "verl_training_log_errors",
                "Errors the run's log shows, in the lines of any of its actors (kind: cuda_oom, nccl_timeout, "
                "segfault, ray_actor_died, traceback).", labels=RUN_LABELS + ["kind"]),
            "checkpoint_saving": GaugeMetricFamily(
                "verl_checkpoint_saving", "1 while the run saves a checkpoint (from verl's local_global_step_folder "
                "line to the next step), else 0.", labels=RUN_LABELS),
            "checkpoint_started": GaugeMetricFamily(
                "verl_checkpoint_save_started_timestamp_seconds",
                "Unix time at which the run's latest checkpoint save started.", labels=RUN_LABELS),
            "checkpoint_step": GaugeMetricFamily(
                "verl_checkpoint_last_step", "Step of the run's latest checkpoint save that finished.",
                labels=RUN_LABELS),
            "checkpoint_seconds": GaugeMetricFamily(
                "verl_checkpoint_last_save_duration_seconds",
                "How long the run's latest finished checkpoint save took (verl's timing_s/save_checkpoint "
                "where it logs it).", labels=RUN_LABELS),
            "parse_errors": CounterMetricFamily(
                "verl_exporter_parse_errors", "Lines that could not be parsed, per source file.", labels=["source"]),
            "values_dropped": CounterMetricFamily(
                "verl_exporter_values_dropped",
                "Logged values left out because they are no number (reason: not_a_number, object, list, null).",
                labels=["source", "reason"]),
            "source_up": GaugeMetricFamily(
                "verl_exporter_source_up",
                "Whether a configured path or a glob's match can be read (1) or not (0: missing, not a "
                "regular file, unreadable); the log says why.", labels=["source"]),
            "runs": GaugeMetricFamily("verl_training_runs", "Runs the exporter follows."),
            "runs_dropped": CounterMetricFamily(
                "verl_training_runs_dropped", "Records refused because the exporter reached its run cap."),
            "runs_expired": CounterMetricFamily(
                "verl_training_runs_expired",
                "Runs no longer served: finished longer than --store.retention ago, or idle longer than "
                "--store.idle-retention (reason finished or idle), or never stepped and dropped at the run cap "
                "for a run that steps (no_step).", labels=["reason"]),
            "run_cap_reached": GaugeMetricFamily(
                "verl_training_run_cap_reached",
                "1 while the exporter refuses new runs for reaching --store.max-runs, else 0."),
        }
