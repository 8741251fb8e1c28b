"""A simulated verl run, so anyone sees live metrics and firing alerts without a GPU, and the tests and
benchmarks get realistic input: ``scenarios`` makes each step's values (healthy runs and each failure
the rules diagnose), ``logs`` writes them as verl does (JSONL or console) and is ``verl-exporter
simulate``. The names below are the simulated run's public interface."""

from verl_exporter.simulate.logs import (
    FINAL_MARKER,
    FORMATS,
    PREFIX,
    STYLES,
    format_config,
    format_console,
    format_jsonl,
    main,
    noise_lines,
    total_steps,
    write_file,
    write_hydra_config,
    write_run,
)
from verl_exporter.simulate.scenarios import (
    ALGORITHMS,
    N_GPUS,
    SAMPLES,
    SCENARIOS,
    STEPS_PER_EPOCH,
    VAL_KEYS,
    algorithm_of,
    check,
    generate_steps,
    is_validation,
    run_config,
    scale_timings,
    step_values,
    validation_values,
)

__all__ = [
    "ALGORITHMS", "FINAL_MARKER", "FORMATS", "N_GPUS", "PREFIX", "SAMPLES", "SCENARIOS", "STEPS_PER_EPOCH",
    "STYLES", "VAL_KEYS", "algorithm_of", "check", "format_config", "format_console", "format_jsonl",
    "generate_steps", "is_validation", "main", "noise_lines", "run_config", "scale_timings", "step_values",
    "total_steps", "validation_values", "write_file", "write_hydra_config", "write_run",
]
