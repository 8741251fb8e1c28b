"""GPU and host alerts (``verl-gpu``): XID and ECC errors, remapped rows, lost and hot GPUs, slowdowns,
idle GPUs and stragglers of a run, host memory.

Their thresholds are not verl metrics: they are the catalog's ``system`` section.
"""

from __future__ import annotations

from . import nodes
from .model import NUMBER, PERCENT, Alert, Group, new_or_increased, sub

# XIDs that mean the GPU or its memory failed: the job cannot continue on this GPU.
# 48 double-bit ECC, 61/62 internal micro-controller, 63/64 row remapping, 74 NVLink, 79 fallen off
# the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 ECC unrecovered.
FATAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)
THROTTLE_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "hw_slowdown")
THROTTLED = "|".join(THROTTLE_REASONS)
XID_FATAL = "|".join(str(x) for x in FATAL_XIDS)
# The runs a node works for (verl_node_run_info), where its exporter names any.
NODE_RUNS_QUOTED = ("{{ with printf `verl_node_run_info{instance=%q}` $labels.instance | query }} (working for"
             "{{ range . }} {{ .Labels.project }}/{{ .Labels.experiment }}{{ end }}){{ end }}")

GPU_INFO = "GPU {{ $labels.gpu }} on {{ $labels.instance }}"

GPUS = Group(name="verl-gpu", file="verl-gpu.rules.yml", title="GPUs and host", audience="oncall", alerts=(
    Alert(
        name="VerlGpuFatalXidError", severity="critical",
        expr=new_or_increased(sub('verl_gpu_xid_errors_total{xid=~"${XID_FATAL}"}', XID_FATAL=XID_FATAL), "15m"),
        for_="0m",
        summary="A GPU reported a fatal XID error.",
        description="${GPU} reported XID {{ $labels.xid }} (${NUMBER} new events in 15 minutes): "
        "the GPU or its memory failed.",
        meaning="XIDs such as 48 (double-bit ECC), 79 (fallen off the bus), 94/95 (ECC) or 119/120 (GSP) mean "
        "the GPU cannot be trusted; the job on it will fail or compute garbage.",
        fix="Drain the node, reset the GPU (`nvidia-smi -r`) or reboot; replace it if it repeats. Restart the "
        "run elsewhere from its last checkpoint.",
    ),
    Alert(
        name="VerlGpuXidError", severity="warning",
        expr=new_or_increased(sub('verl_gpu_xid_errors_total{xid!~"${XID_FATAL}"}', XID_FATAL=XID_FATAL), "15m"),
        for_="0m",
        summary="A GPU reported an XID error.",
        description="${GPU} reported XID {{ $labels.xid }} (${NUMBER} new events in 15 minutes).",
        meaning="Other XIDs (13 graphics engine exception, 31 MMU fault, 43 channel reset) usually come from the "
        "application: a kernel fault in the job.",
        fix="Check the job's log at the same time; look the XID up in NVIDIA's XID catalog.",
    ),
    Alert(
        name="VerlGpuUncorrectableEccErrors", severity="critical",
        expr='verl_gpu_ecc_volatile_errors_total{type="uncorrected"} > 0', for_="0m",
        summary="A GPU has uncorrectable ECC memory errors.",
        description="${GPU} has ${NUMBER} uncorrectable ECC errors since the driver was loaded.",
        meaning="Uncorrectable ECC errors corrupt data in GPU memory; the running job's results are not reliable.",
        fix="Drain the node and reset the GPU (row remapping takes effect on reset); replace it if errors "
        "come back.",
    ),
    Alert(
        name="VerlGpuRowRemapFailure", severity="critical",
        expr='verl_gpu_remapped_rows{state="failure"} > 0', for_="0m",
        summary="A GPU failed to remap a faulty memory row.",
        description="${GPU} reports a row-remapping failure: its memory has a fault it cannot repair.",
        meaning="When remapping fails the GPU has no spare rows left for a faulty memory row.",
        fix="Drain the node and have the GPU replaced (RMA).",
    ),
    Alert(
        name="VerlGpuRowRemapPending", severity="warning",
        expr='verl_gpu_remapped_rows{state="pending"} > 0', for_="0m",
        summary="A GPU has memory rows waiting to be remapped.",
        description="${GPU} has ${NUMBER} rows pending remapping; they are remapped at the next GPU reset.",
        meaning="Faulty rows were found; the repair is applied only when the GPU is reset.",
        fix="Reset the GPU (`nvidia-smi -r`) or reboot when the job allows.",
    ),
    Alert(
        name="VerlGpuLost", severity="critical",
        expr="verl_gpu_up == 0", for_="1m",
        summary="A GPU no longer answers its driver.",
        description="${GPU} does not answer the GPU library (NVML or amdsmi): it is lost.",
        meaning="NVML (amdsmi on AMD GPUs) cannot read the GPU (\"GPU is lost\", fallen off the bus); every "
        "process on it is stuck or dead.",
        fix="Drain the node and reboot it; check `dmesg` for XID 79 (NVIDIA) or amdgpu errors (AMD); replace "
        "the GPU if it repeats.",
    ),
    Alert(
        name="VerlGpuCountDropped", severity="critical",
        expr="verl_gpus < max_over_time(verl_gpus[6h])", for_="1m",
        summary="A host sees fewer GPUs than before.",
        description="The host {{ $labels.instance }} sees " + NUMBER + " GPUs, fewer than in the last 6 hours.",
        meaning="A GPU vanished from the driver's device list (fallen off the bus or disabled).",
        fix="Drain the node, check `nvidia-smi` and `dmesg`, reboot; replace the GPU if it repeats.",
    ),
    Alert(
        name="VerlGpuHot", severity="warning",
        expr="verl_gpu_temperature_celsius > ${system:gpu_hot_celsius}", for_="5m",
        summary="A GPU runs hot.",
        description="${GPU_INFO} is at ${NUMBER} °C (limit ${system:gpu_hot_celsius} °C).",
        meaning="Above about 85 °C data-centre GPUs get close to thermal slowdown.",
        fix="Check the node's cooling (fans, airflow, inlet temperature) and neighbouring GPUs.",
    ),
    Alert(
        name="VerlGpuThrottled", severity="warning",
        expr='verl_gpu_clock_event_active{reason=~"${THROTTLED}"} == 1', for_="5m",
        summary="A GPU is throttled by heat or a power brake.",
        description="${GPU_INFO} is slowed down: {{ $labels.reason }} is active.",
        meaning="Thermal slowdown or the power brake lowers the GPU's clocks; the whole data-parallel job waits for "
        "the slowest GPU.",
        fix="Check cooling and the power supply of the node; `nvidia-smi -q -d PERFORMANCE` shows the reason.",
    ),
    Alert(
        name="VerlGpusIdle", severity="warning",
        expr="avg by (job, instance) (verl_gpu_utilization_ratio) < ${system:gpu_idle_utilization}"
        " and on(job, instance) ((verl_job_running == 1)"
        " or (max by (job, instance) (verl_node_run_info"
        " and on(project, experiment, user, team) verl_training_finished == 0)"
        " unless on(job, instance) verl_job_running))",
        for_="10m",
        summary="GPUs are idle while the training job runs.",
        description="GPUs on {{ $labels.instance }}" + NODE_RUNS_QUOTED + " average " + PERCENT
        + " utilisation while the training job "
        "runs.",
        meaning="The job is alive but its GPUs do nothing: it waits on something (data, reward server, a hung "
        "collective, a dead Ray worker). Where the exporter watches no job processes, a node counts as "
        "running while a run it works for (`verl_node_run_info`) has not finished, as the head node's "
        "exporter says: the runs it follows, or on a worker node without logs the run of its "
        "`--project`/`--experiment`. An exporter that reads a shared log directory works for none of the "
        "runs it follows, so its own idle GPUs do not fire this.",
        fix="See VerlTrainingStalled; check the job's log, Ray's dashboard and the reward service.",
    ),
    Alert(
        name="VerlGpuStraggler", severity="warning",
        expr="${STRAGGLER}", for_="10m", held=nodes.STRAGGLER_WINDOW,
        summary="A GPU of a run works far less than the run's other GPUs.",
        description="Run ${RUN}: ${GPU} was busy ${PERCENT} of the last ${STRAGGLER_WINDOW}${RUN_MEDIAN_QUOTED}"
        "${NODE_BUSY_QUOTED}.",
        meaning="Within one run, the GPU's utilisation averaged over ${STRAGGLER_WINDOW} stays below "
        "${nodes:straggler_ratio} of the median of the run's GPUs (over all its nodes, joined through "
        "`verl_node_run_info`) while that median is above ${nodes:straggler_min_median} and the run steps "
        "(it took a step and is not stalled). A data-parallel job goes at the pace of its slowest rank, so "
        "a GPU (or a whole node, when all of its GPUs fire) that does much less than its peers is either "
        "left out of the work "
        "(a wrong `CUDA_VISIBLE_DEVICES`, a rank that died and was not replaced, a Ray placement that put "
        "fewer workers on the node) or held back (throttled clocks, a slow NVLink or network link, a "
        "host starved of CPU or I/O). The phases of a PPO step idle GPUs on purpose (generation, then "
        "the reference and actor passes; rollout and actor may sit on different GPUs), so the rule "
        "compares averages over several steps, asks for a gap of more than half, and ignores runs whose "
        "median GPU is nearly idle anyway (VerlGpusIdle's case) or that do not step (VerlTrainingStalled). "
        "A node that works for two runs at once is left out, as it is unknown which of its GPUs belong to "
        "which run, unless its exporter knows each job's GPUs (`--slurm`: `verl_job_gpu_info`). GPUs that a "
        "run gives to a part that idles by design (a reward model's own pool) fire "
        "too: silence the alert for that run. Composer's HealthChecker flags a 10% spread over 120 s, "
        "which PPO's phases exceed in healthy runs.",
        fix="Open the run dashboard's GPU spread panel to see whether one GPU or a whole node lags. Check "
        "the node's throttling (`nvidia-smi -q -d PERFORMANCE`, VerlGpuThrottled), its XID errors, the "
        "processes on the GPU (`nvidia-smi`: is the rank there at all?), Ray's placement of the workers "
        "and the node's CPU and network; drain the node and restart the run from its checkpoint if its "
        "hardware is at fault.",
    ),
    Alert(
        name="VerlHostMemoryNearlyFull", severity="warning",
        expr="verl_host_memory_available_bytes / verl_host_memory_total_bytes < ${system:host_memory_available_min}",
        for_="5m",
        summary="The host is nearly out of memory.",
        description="Host {{ $labels.instance }} has only " + PERCENT + " of its memory available.",
        meaning="Ray's object store, rollout buffers or data loading fill host memory; the OOM killer will end the "
        "job.",
        fix="Lower `data.train_batch_size` or the rollout batch, turn off CPU offloading, limit Ray's "
        "object store (`ray start --object-store-memory`).",
    ),
))

GROUPS = (GPUS,)
