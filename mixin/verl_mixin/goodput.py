"""What the fleet's GPUs did: the runs' goodput ledgers (``verl_run_gpu_seconds_total{bucket}``, see
``store.ledger``) summed per owner, team and fleet, the fleet's waste against the operator's goodput
objective (a multi-window burn rate, as the Google SRE workbook's alerting chapter), and a run's work at risk.

Of the fleet's training time (its runs' productive and stalled GPU time), waste is the time stalled, the
work lost (redone after a failure) and the productive time of runs training on after a diagnosis (while
one of their training diagnoses fires); goodput is the rest. Overhead (start-up, validation, checkpoints,
the gaps between steps) is what training costs, and neither: a run starting up or validating never
burns the budget. The objective and the burn rates are the catalog's (``system.goodput_*``).
"""

from __future__ import annotations

from collections.abc import Callable

from .model import Alert, Group, sub
from .nodes import RUN_GPU_BUSY

GPU_SECONDS = "verl_run_gpu_seconds_total"
EXTRA = {"goodput": {"hour_seconds": 3600}}  # the ledger counts seconds; the operator's bounds are in hours
RUN_LABELS = "project, experiment, user, team"
WINDOWS = ("5m", "30m", "1h", "6h")
PER_OWNER = "user_team_bucket:verl_run_gpu_seconds:rate5m"
PER_TEAM = "team_bucket:verl_run_gpu_seconds:rate5m"
PER_FLEET = "bucket:verl_run_gpu_seconds:rate5m"
AFTER_DIAGNOSIS = "run:verl_run_gpu_seconds_after_diagnosis:rate5m"
DIAGNOSED = "run:verl_training_diagnosed:firing"  # 1 per run while a diagnosis fires
# The run's GPUs that idle (their utilisation over 10 minutes, nodes.RUN_GPU_BUSY), where the exporter of
# their node sees them: GPU time in whatever bucket, held and unused.
IDLE_GPUS = "run:verl_run_gpus_idle:count"
LOST = '"lost"'


def waste(window: str) -> str:
    """The fleet's recorded waste ratio over ``window``: the share of its training time wasted."""
    return f"fleet:verl_gpu_waste:ratio_rate{window}"


def hung_or_lost(window: str) -> str:
    """The part of it the on-call acts on: the share of the fleet's training time stalled or lost."""
    return f"fleet:verl_gpu_stalled_or_lost:ratio_rate{window}"


FAST = ("1h", "5m")  # the windows of the fast burn, which pages
SLOW = ("6h", "30m")


def _rate(bucket: str, window: str) -> str:
    return f"rate({GPU_SECONDS}{{bucket{bucket}}}[{window}])"


def recording_rules(diagnoses: list[str]) -> list[dict]:
    """The verl-goodput group: GPU-seconds a second by bucket per owner, team and fleet, the runs a
    diagnosis (one of ``diagnoses`` firing) is about and their GPU time, each run's idle GPUs, and the
    fleet's waste ratio over each burn-rate window."""
    firing = f'ALERTS{{alertstate="firing", alertname=~"{"|".join(diagnoses)}"}}'
    rules = [
        {"record": PER_OWNER, "expr": f"sum by (user, team, bucket) (rate({GPU_SECONDS}[5m]))"},
        {"record": PER_TEAM, "expr": f"sum by (team, bucket) (rate({GPU_SECONDS}[5m]))"},
        {"record": PER_FLEET, "expr": f"sum by (bucket) (rate({GPU_SECONDS}[5m]))"},
        {"record": DIAGNOSED, "expr": f"group by ({RUN_LABELS}) ({firing})"},
        {"record": IDLE_GPUS, "expr": f"count by ({RUN_LABELS}) ({RUN_GPU_BUSY} < ${{system:gpu_idle_utilization}})"},
        {"record": AFTER_DIAGNOSIS,
         "expr": f'sum by ({RUN_LABELS}) ({_rate("!=" + LOST, "5m")}) and on({RUN_LABELS}) {DIAGNOSED}'},
    ]
    for window in WINDOWS:
        productive, stalled = _rate('="productive"', window), _rate('="stalled"', window)
        after = f"sum(sum by ({RUN_LABELS}) ({productive}) and on({RUN_LABELS}) {DIAGNOSED})"
        hung = f"sum({stalled}) + (sum({_rate('=' + LOST, window)}) or vector(0))"
        training = f"(sum({productive}) + sum({stalled}) > 0)"
        rules.append({"record": waste(window),
                      "expr": f"clamp_max(({hung} + ({after} or vector(0))) / {training}, 1)"})
        if window in FAST:
            rules.append({"record": hung_or_lost(window), "expr": f"clamp_max(({hung}) / {training}, 1)"})
    return [{"name": "verl-goodput", "rules": rules}]


def _burning(ratio: Callable[[str], str], windows: tuple[str, str], rate: str) -> str:
    long, short = windows
    return sub("${long} > ${rate} * (1 - ${system:goodput_objective})"
               " and ${short} > ${rate} * (1 - ${system:goodput_objective})",
               long=ratio(long), short=ratio(short), rate=rate)


BURN_MEANING = ("Of the fleet's training time (its runs' productive and stalled GPU time, from the goodput "
                "ledger `verl_run_gpu_seconds_total`, buckets in docs/metrics.md), waste is the time stalled, the "
                "work lost to failures and the steps of runs training on after a diagnosis; goodput is the rest, "
                "and its objective the catalog's `system.goodput_objective` (${system:goodput_objective}). "
                "Start-up, validation and checkpoints are overhead, not waste. ")
BURN_FIX = ("Open the fleet overview's goodput row: the runs and owners wasting most, and how (stalled: see their "
            "VerlTrainingStalled; lost: crashes, VerlTrainingCrashed; after a diagnosis: runs that keep training "
            "after a collapse). Stop or fix those runs.")

GOODPUT = Group(name="verl-goodput-alerts", file="verl-operations.rules.yml", title="Goodput", audience="oncall",
                alerts=(
    Alert(
        name="VerlFleetGoodputBurningFast", severity="critical",
        expr=_burning(hung_or_lost, FAST, "${system:goodput_burn_fast}"), for_="2m",
        summary="The fleet's training GPUs hang or lose their work far faster than its goodput objective allows.",
        description="Over the last hour and the last 5 minutes, {{ $value | humanizePercentage }} of the fleet's "
        "training time was stalled or lost: over ${system:goodput_burn_fast} times the error budget of a goodput "
        "objective of ${system:goodput_objective}.",
        meaning=BURN_MEANING + "The page counts the waste the on-call acts on, runs that hang or crash: stalled "
        "and lost time over ${system:goodput_burn_fast} times the budget left by the objective, over both the "
        "last hour and the last 5 minutes (so it pages quickly and stops paging once the cause is gone), means "
        "much of the fleet's training GPUs do nothing useful now. Runs training on after a diagnosis are "
        "their teams' to stop: they count in VerlFleetGoodputBurning, not here.",
        fix=BURN_FIX,
    ),
    Alert(
        name="VerlFleetGoodputBurning", severity="warning",
        expr=_burning(waste, SLOW, "${system:goodput_burn_slow}"), for_="15m",
        summary="The fleet's goodput is below its objective.",
        description="Over the last 6 hours and the last 30 minutes, {{ $value | humanizePercentage }} of the fleet's "
        "training time was wasted: over the error budget of a goodput objective of ${system:goodput_objective}.",
        meaning=BURN_MEANING + "Waste over the budget over both the last 6 hours and the last 30 minutes is a "
        "slow, steady loss: runs stalling now and then, repeated crashes, runs left training after a collapse.",
        fix=BURN_FIX,
    ),
    Alert(
        name="VerlRunWorkAtRisk", severity="info", audience="team",
        expr="verl_run_work_at_risk_gpu_seconds / ${goodput:hour_seconds} > ${system:work_at_risk_gpu_hours}"
        " unless on(job, instance, project, experiment, user, team) verl_training_finished_timestamp_seconds",
        for_="5m",
        summary="A run holds many GPU-hours of work not saved in a checkpoint.",
        description="Run {{ $labels.project }}/{{ $labels.experiment }}: ${NUMBER} GPU-hours of work since its last "
        "checkpoint save (over ${system:work_at_risk_gpu_hours}): a failure now loses them.",
        meaning="`verl_run_work_at_risk_gpu_seconds` is the GPU time of the run's steps since its last checkpoint "
        "save: what a crash, a preemption or a lost node would make it redo. The bound is the catalog's "
        "`system.work_at_risk_gpu_hours`.",
        fix="Save checkpoints more often (`trainer.save_freq`), or save one now if the run can; on a cluster "
        "that preempts, keep the work at risk under what a preemption may cost.",
    ),
))

GROUPS = (GOODPUT,)
