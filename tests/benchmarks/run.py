"""Run the benchmarks: ``python tests/benchmarks/run.py [--quick] [--only scrape,ingest,...]``.

Each benchmark prints a table and writes ``<out>/<name>.json`` (figures, parameters, commit and
machine), so two commits can be compared with ``tests/benchmarks/compare.py OLD NEW``. ``--quick``
uses tiny sizes: a smoke run that shows the scripts work, not figures to quote. Targets that are
missed are marked MISSED in the table; the exit status is non-zero only when a benchmark could not
run.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, BenchmarkError, environment, print_table, write_json  # noqa: E402

BENCHMARKS = ("scrape", "ingest", "overhead", "rules", "fleet", "dashboards")
# The rule files before the fleet-scale changes (shared sub-expressions), for the rules benchmark.
RULE_REFERENCE = "875ae66"

FULL = {
    "scrapes": 300,
    "ingest_mb": 500.0,
    "overhead_seconds": 120.0,
    "overhead_scrape_interval": 15.0,
    "overhead_step_interval": 1.0,
    "overhead_many": 100,
    "rule_runs": "10,100,1000",
    "rule_steps": 20,
    "rule_interval": 5.0,
    "rule_evaluations": 9,
}
QUICK = {
    "scrapes": 20,
    "ingest_mb": 2.0,
    "overhead_seconds": 3.0,
    "overhead_scrape_interval": 1.0,
    "overhead_step_interval": 0.5,
    "overhead_many": 5,
    "rule_runs": "2",
    "rule_steps": 5,
    "rule_interval": 1.0,
    "rule_evaluations": 2,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results", help="folder for the JSON results")
    parser.add_argument("--cache", type=Path, help="folder for generated input files (default: OUT/cache)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (process logs) afterwards")
    for name, default in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=None,
                            help=f"default {default} (--quick: {QUICK[name]})")
    parser.add_argument("--rule-reference", default=RULE_REFERENCE,
                        help="git revision whose rule files the rules benchmark measures too, for a before/after "
                             f"comparison ('' for none; default {RULE_REFERENCE})")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for name in FULL:
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(args.only) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    args.cache = args.cache or args.out / "cache"
    return args


def raise_open_file_limit(wanted: int = 8192) -> None:
    """Following 1000 runs keeps 1000 files open; lift the soft limit the exporters inherit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_one(name: str, args: argparse.Namespace, work: Path):
    work.mkdir(parents=True, exist_ok=True)
    if name == "scrape":
        import bench_scrape

        return bench_scrape.run(work, scrapes=args.scrapes)
    if name == "ingest":
        import bench_ingest

        return bench_ingest.run(work, args.cache, target_bytes=int(args.ingest_mb * 1_000_000))
    if name == "fleet":  # its own sizes: bench_fleet.py --help
        import bench_fleet

        return bench_fleet.run(work, args.cache, **(bench_fleet.QUICK if args.quick else bench_fleet.FULL))
    if name == "dashboards":  # its own sizes: bench_dashboards.py --help (1,000 nodes, 200 runs, 3 h)
        import bench_dashboards

        sizes = bench_dashboards.QUICK if args.quick else bench_dashboards.FULL
        return bench_dashboards.run(work, args.cache, **sizes, backends=("prometheus", "victoriametrics", "memory"),
                                    rounds=2 if args.quick else 8, merge=not args.quick)
    if name == "overhead":
        import bench_overhead

        return bench_overhead.run(work, duration=args.overhead_seconds, scrape_interval=args.overhead_scrape_interval,
                                  step_interval=args.overhead_step_interval, many=args.overhead_many)
    import bench_rules

    runs = [int(count) for count in args.rule_runs.split(",")]
    return bench_rules.run(work, runs=runs, steps=args.rule_steps, interval=args.rule_interval,
                           evaluations=args.rule_evaluations, reference=args.rule_reference or None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_open_file_limit()
    env = environment()
    env["quick"] = args.quick
    print(f"verl-exporter benchmarks at {env['commit'][:12] or 'unknown commit'}"
          f"{' (uncommitted changes)' if env['dirty'] else ''} on {env['cpus']} CPUs"
          f"{' (quick sizes: not figures to quote)' if args.quick else ''}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="verl-bench-"))
    failed = []
    try:
        for name in args.only:
            started = time.monotonic()
            print(f"\nrunning {name} ...", flush=True)
            try:
                result = run_one(name, args, work / name)
            except BaseException as exc:  # servers.py fails with pytest's Failed, a BaseException
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                if not isinstance(exc, BenchmarkError) and type(exc).__name__ != "Failed":
                    traceback.print_exc()
                print(f"{name}: could not run: {str(exc)[-3000:]}", file=sys.stderr, flush=True)
                failed.append(name)
                continue
            result.figures["bench_seconds"] = time.monotonic() - started
            print_table(result)
            path = write_json(result, args.out, env)
            print(f"  wrote {path}", flush=True)
    finally:
        if args.keep or failed:
            print(f"\nprocess logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"\nbenchmarks that could not run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
