"""Training metrics of every followed run, read from the RunStore at scrape time.

Emits, for each verl key logged (names from the catalog, every series labelled with the run)::

    # HELP verl_actor_pg_clipfrac verl actor/pg_clipfrac: Fraction of samples whose policy update was
      clipped by PPO [ratio]. Healthy 0.05 to 0.3.  (one line; wrapped here)
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
    verl_training_next_validation_step{project,experiment}         the run's next step that validates, where known
    verl_run_config{project,experiment,key}                        the run's numeric settings (catalog.yaml's
                                                                   ``settings``), key the dotted verl setting
    verl_run_config_info{project,experiment,adv_estimator,model,rollout,strategy} 1
    verl_training_nonfinite_values_total{project,experiment,key}   NaN/Inf values seen per verl key
    verl_training_series_dropped_total{project,experiment}         keys dropped by the per-run series cap
    verl_training_run_info{project,experiment,source} 1

and, from the errors the run's log shows and its first line::

    verl_training_nonfinite_last_step{project,experiment,key}  the run's step at its latest NaN/Inf of the key
    verl_training_log_errors_last_step{project,experiment,kind} the run's step when the kind was last seen
    verl_training_log_errors_total{project,experiment,kind}    kind: cuda_oom, nccl_timeout, segfault,
                                                               ray_actor_died, traceback
    verl_training_fatal_error_last_step{project,experiment,kind} the run's step when the trainer ended in a
                                                               fatal error (sources.fatal's kinds)
    verl_training_started_timestamp_seconds{project,experiment} when its first line (config print or
                                                               first step) was written

and, over the run's own steps of the metrics the rules judge in steps (``step_windows``)::

    verl_training_recent_min{project,experiment,metric}    and recent_max: the last 3 steps
    verl_training_window_median{project,experiment,metric} and window_mean: the last 10 steps
    verl_training_prior_mean{project,experiment,metric}    the 10 steps before those
    verl_training_early_median{project,experiment,metric}  the run's first 10 steps
    verl_training_run_max{project,experiment,metric}       and run_min: every step so far

and, for a run whose config names its GPUs, its goodput ledger (``store.ledger``)::

    verl_run_gpus{project,experiment}                            trainer.n_gpus_per_node x trainer.nnodes
    verl_run_gpu_seconds_total{project,experiment,bucket}        its GPUs times its time, by bucket
    verl_run_work_at_risk_gpu_seconds{project,experiment}        work since its last checkpoint save

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

import threading
from typing import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from verl_exporter import schema
from verl_exporter.collectors import Collector
from verl_exporter.store import run_settings, step_windows, validation
from verl_exporter.store.run_state import RunState, StoreSnapshot
from verl_exporter.store.run_store import RunStore

from ..exposition import Part
from . import check_renderable
from .run_cache import RunCache
from .training_text import RunText

RUN_LABELS = list(schema.RUN)


class TrainingCollector(Collector):
    """The training families, from one table of what a run exports (``run_families``).

    ``collect()`` hands them over as client_python families (OpenMetrics, ``name[]``);
    ``text_parts()`` as text parts from a cache that formats each run once per change. Both keep
    what they made of each run until the run changes, so a scrape of an unchanged store copies no run.
    """

    def __init__(self, store: RunStore):
        self.store = store
        self._lock = threading.Lock()
        self._families = RunCache(store, self._checked_run_families)
        self._text = RunText(self)

    def describe(self) -> Iterable[Metric]:
        return [*self.new_run_families().values(), *self.new_store_families().values()]

    def new_run_families(self) -> dict[str, schema.Built]:
        """Empty per-run families, by schema key (``verl_run_config_info`` with the catalog's labels)."""
        info_labels = run_settings.info_labels(self.store.catalog)
        return {key: family.new(info_labels if key == "config_info" else ())
                for key, family in schema.TRAINING_RUN.items()}

    @staticmethod
    def new_store_families() -> dict[str, schema.Built]:
        """Empty exporter-wide families of the store, by schema key."""
        return {key: family.new() for key, family in schema.TRAINING_STORE.items()}

    def text_parts(self) -> list[Part]:
        return self._text.parts()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            snapshot, _ = self._families.update()
            runs = self._families.in_order()
        merged: dict[str, Metric] = {}
        logged: dict[str, Metric] = {}
        for run in runs:
            for key, family in run.items():
                into = logged if key.startswith("verl_") else merged
                found = into.get(key)
                if found is None:
                    found = into[key] = Metric(family.name, family.documentation, family.type, family.unit)
                found.samples += family.samples
        families: dict[str, Metric] = dict(self.new_run_families())
        for key in list(families):
            if key in merged:
                families[key] = merged[key]
            elif schema.TRAINING_RUN[key].optional:
                del families[key]
        store = self.store_families(snapshot)
        return [*families.values(), *store.values(), *(logged[name] for name in sorted(logged))]

    def _checked_run_families(self, state: RunState) -> dict[str, schema.Built]:
        families = self.run_families(state)
        check_renderable(list(families.values()))
        return families

    def run_families(self, state: RunState, logged: bool = True) -> dict[str, schema.Built]:
        """One run's families: the per-run ones by schema key (``last_step``, ...), the logged series
        by metric name (``verl_...``, unless ``logged`` is False), only those the run has samples for."""
        families = self.new_run_families()
        info_labels = run_settings.info_labels(self.store.catalog)
        run = list(state.run.labels)
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
        upcoming = validation.next_validation(state)
        if upcoming is not None:
            families["next_validation"].add_metric(run, upcoming)
        for key, value in sorted(state.config.items()):
            families["config"].add_metric(run + [key], value)
        if state.config_info:
            families["config_info"].add_metric(run + [state.config_info.get(label, "") for label in info_labels], 1.0)
        for key, count in sorted(state.nonfinite.items()):
            families["nonfinite"].add_metric(run + [key], count)
        for key, step in sorted(state.nonfinite_step.items()):
            families["nonfinite_step"].add_metric(run + [key], step)
        for kind, count in sorted(state.log_errors.items()):
            families["log_errors"].add_metric(run + [kind], count)
        for kind, step in sorted(state.error_step.items()):
            families["log_errors_step"].add_metric(run + [kind], step)
        if state.fatal is not None:
            families["fatal_step"].add_metric(run + [state.fatal[0]], state.fatal[1])
        if state.started_at is not None:
            families["started_time"].add_metric(run, state.started_at)
        checkpoint = state.checkpoint
        if checkpoint is not None:
            families["checkpoint_saving"].add_metric(run, 1.0 if checkpoint.saving else 0.0)
            families["checkpoint_started"].add_metric(run, checkpoint.started)
            if checkpoint.done_step is not None:
                families["checkpoint_step"].add_metric(run, checkpoint.done_step)
                if checkpoint.done_seconds is not None:  # set with done_step
                    families["checkpoint_seconds"].add_metric(run, checkpoint.done_seconds)
        ledger = state.ledger
        if ledger.gpus:
            families["gpus"].add_metric(run, ledger.gpus)
            for bucket, seconds in ledger.seconds.items():
                families["gpu_seconds"].add_metric(run + [bucket], seconds)
            families["at_risk"].add_metric(run, ledger.at_risk)
        for name, window in sorted(state.windows.items()):
            for stat in step_windows.WATCHED.get(name, ()):
                statistic = window.stat(stat)
                if statistic is not None:
                    families[f"steps_{stat}"].add_metric(run + [name], statistic)
        out = {key: family for key, family in families.items() if family.samples}
        for (name, label_values), (resolved, value) in (state.series.items() if logged else ()):
            family = out.get(name)
            if family is None:
                spec = resolved.spec
                family = out[name] = GaugeMetricFamily(name, spec.full_help(),
                                                       labels=RUN_LABELS + list(spec.label_names))
            family.add_metric(run + list(label_values), value)
        return out

    def store_families(self, snapshot: StoreSnapshot) -> dict[str, schema.Built]:
        """The exporter-wide families of the store: parse errors, dropped values, sources, runs."""
        families = self.new_store_families()
        for source, count in sorted(snapshot.parse_errors.items()):
            families["parse_errors"].add_metric([source], count)
        for (source, reason), count in sorted(snapshot.values_dropped.items()):
            families["values_dropped"].add_metric([source, reason], count)
        for source, unreadable in sorted(snapshot.sources.items()):
            families["source_up"].add_metric([source], 0.0 if unreadable else 1.0)
        families["runs"].add_metric([], len(snapshot.versions or {}))
        families["runs_dropped"].add_metric([], snapshot.runs_dropped)
        for reason in ("finished", "idle", "no_step"):
            families["runs_expired"].add_metric([reason], snapshot.runs_expired.get(reason, 0))
        families["run_cap_reached"].add_metric([], 1.0 if snapshot.run_cap_reached else 0.0)
        return families
