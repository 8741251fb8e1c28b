#!/usr/bin/env python3
"""See the verl alerts fire, on this machine, without a GPU or a training job.

Starts, on 127.0.0.1 only: the exporter following a simulated verl run (``--scenario``) with fake
GPUs, a real Prometheus with the shipped alert and recording rules, a real Alertmanager with
the shipped alertmanager.yml, and a stand-in for Slack and PagerDuty that prints every notification.
Prints the URLs to open and runs until Ctrl-C, then stops everything it started.

One simulated step takes ``--step-seconds`` (1 s) and stands for a 60 s verl step, so the rules are
rendered with every duration divided by 60 (``for: 10m`` -> 10 s); thresholds are unchanged. The
shipped rule files (alerts/rules/) keep their real durations.

    python scripts/demo.py --scenario lr-too-high        # or: make demo SCENARIO=critic-underfit
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from stand_in_receiver import Receiver, describe  # scripts/, beside this file
from verl_exporter import simulate
from verl_mixin import local

REPO = Path(__file__).resolve().parent.parent

# What each scenario trips (with the default healthy GPUs; --gpus hot:8 adds the GPU alerts).
EXPECTED = {
    "healthy": "nothing: a healthy PPO run stays silent",
    "healthy-grpo": "nothing: a healthy on-policy GRPO run (pg_clipfrac and ppo_kl about 0) stays silent",
    "lr-too-high": "VerlLearningRateTooHigh (Slack), muting VerlPolicyUpdateAggressive, VerlPolicyChangeTooLarge "
                   "and VerlActorGradNormPinned",
    "critic-underfit": "VerlCriticNotLearning (Slack) after 20 warm-up steps",
    "entropy-collapse": "VerlEntropyCollapsing (Slack), later VerlPrematureConvergence",
    "truncation": "VerlResponsesTruncated (Slack), later VerlResponsesOftenTruncated",
    "stall": "VerlTrainingStalled (PagerDuty) once the run stops after 20 steps",
    "nan": "VerlTrainingNonFinite (PagerDuty) from step 15",
}


def port_or_free(port: int) -> int:
    """``port`` if it is free on 127.0.0.1, else (or for 0) any free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        sys.exit(f"demo: {name} is not installed; `make tools` installs Debian's prometheus and "
                 "prometheus-alertmanager packages")
    return path


def wait_ready(name: str, url: str, process: subprocess.Popen, log: Path, timeout: float = 60,
               accept=lambda body: True) -> None:
    """Wait until ``url`` answers 200 with a body ``accept`` likes; exit if ``process`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"demo: {name} exited with {process.returncode}; its log:\n{log.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and accept(response.read().decode("utf-8", "replace")):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"demo: {name} did not become ready at {url} within {timeout:.0f}s; see {log}")


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(args.dir).resolve()
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.notified = 0
        self.seen_until = False

    def start(self, name: str, cmd: list[str], ready_url: str) -> None:
        log = self.dir / f"{name}.log"
        process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=self.dir)
        self.processes.append((name, process))
        wait_ready(name, ready_url, process, log)

    def on_notification(self, path: str, payload: dict) -> None:
        self.notified += 1
        text = describe(path, payload).rstrip()
        self.seen_until = self.seen_until or bool(self.args.until and self.args.until in text)
        print(f"\n--- notification {self.notified} ---\n{text}\n", flush=True)

    def run(self) -> int:
        args = self.args
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        ports = {name: port_or_free(getattr(args, f"{name}_port"))
                 for name in ("exporter", "prometheus", "alertmanager", "receiver")}
        with Receiver(ports["receiver"], on_notification=self.on_notification) as receiver:
            try:
                self._start_all(ports, receiver.url)
                self._print_urls(ports)
                return self._wait()
            except KeyboardInterrupt:
                print("\nstopping", flush=True)
                return 0
            finally:
                self.stop()

    def _start_all(self, ports: dict, receiver_url: str) -> None:
        """Alertmanager, then Prometheus, then the exporter, then the rules: Prometheus sees the run
        from its first step, and no rule judges the seconds before the exporter is up."""
        args = self.args
        exporter = f"127.0.0.1:{ports['exporter']}"
        alertmanager = f"127.0.0.1:{ports['alertmanager']}"
        prometheus = f"127.0.0.1:{ports['prometheus']}"
        am_dir = self.dir / "alertmanager"
        am_dir.mkdir()
        (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(
            local.alertmanager_config(receiver_url, am_dir / "secrets", group_wait="2s", group_interval="10s")))
        self.start("alertmanager", [
            binary("prometheus-alertmanager"), f"--config.file={am_dir / 'alertmanager.yml'}",
            f"--storage.path={am_dir / 'data'}", f"--web.listen-address={alertmanager}", "--cluster.listen-address=",
        ], f"http://{alertmanager}/-/ready")
        prom_dir = self.dir / "prometheus"
        config = prom_dir / "prometheus.yml"
        rules = local.write_rules(prom_dir / "rules", time_scale=args.step_seconds / 60, min_range=3,
                                  runbook_url=f"http://{exporter}/runbook")
        config.write_text(yaml.safe_dump(local.prometheus_config(exporter, alertmanager, [], interval="1s")))
        self.start("prometheus", [
            binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={prom_dir / 'data'}",
            f"--web.listen-address={prometheus}", "--web.enable-lifecycle",
            # after the reload below, alerts sent before Alertmanager is rediscovered are dropped: resend soon
            "--rules.alert.resend-delay=2s",
        ], f"http://{prometheus}/-/ready")
        # Prometheus hands new targets to its scrapers after up to 5 s; start the run once it scrapes.
        wait_ready("prometheus's scrape of the exporter", f"http://{prometheus}/api/v1/query?query=up",
                   self.processes[-1][1], self.dir / "prometheus.log", accept=lambda body: '"up"' in body)
        self.start("exporter", [
            sys.executable, "-m", "verl_exporter", "--web.listen-address", exporter,
            "--simulate", args.scenario, "--simulate.interval", str(args.step_seconds),
            "--simulate.dir", str(self.dir / "run"), "--source.poll-interval", "0.1", "--gpu.fake", args.gpus,
            "--no-collector.host",
        ], f"http://{exporter}/-/ready")
        config.write_text(yaml.safe_dump(local.prometheus_config(exporter, alertmanager, rules, interval="1s")))
        request = urllib.request.Request(f"http://{prometheus}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                sys.exit(f"demo: Prometheus refused to load the rules ({response.status}); see {self.dir}")

    def _print_urls(self, ports: dict) -> None:
        args = self.args
        print(f"""
verl-exporter demo: scenario {args.scenario!r}, fake GPUs {args.gpus!r}, one step every {args.step_seconds:g} s
  expect:        {EXPECTED.get(args.scenario, '')}
  metrics:       http://127.0.0.1:{ports['exporter']}/metrics
  alerts:        http://127.0.0.1:{ports['prometheus']}/alerts      (pending, then firing)
  Alertmanager:  http://127.0.0.1:{ports['alertmanager']}/#/alerts    (grouped per run, inhibited ones hidden)
  query:         http://127.0.0.1:{ports['prometheus']}/graph?g0.expr=ALERTS
  runbook:       http://127.0.0.1:{ports['exporter']}/runbook      (every alert's runbook_url)
Notifications that would go to Slack and PagerDuty are printed below.
Rules: the shipped verl-*.rules.yml with durations divided by {60 / args.step_seconds:g}; files and logs in {self.dir}
Press Ctrl-C to stop.""", flush=True)

    def _wait(self) -> int:
        args = self.args
        deadline = time.monotonic() + args.exit_after if args.exit_after else None
        while deadline is None or time.monotonic() < deadline:
            for name, process in self.processes:
                if process.poll() is not None:
                    print(f"demo: {name} exited with {process.returncode}; see {self.dir / (name + '.log')}")
                    return 1
            if args.until and self.seen_until:
                return 0
            time.sleep(0.2)
        return 1 if args.until else 0

    def stop(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self.processes):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="scenarios:\n" + "\n".join(f"  {k:17s} {v}" for k, v in EXPECTED.items()))
    parser.add_argument("--scenario", default=os.environ.get("SCENARIO") or "lr-too-high",
                        choices=list(simulate.SCENARIOS))
    parser.add_argument("--gpus", default="healthy:8", help="fake GPUs, SCENARIO:COUNT (hot:8 trips GPU alerts)")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="seconds per simulated step")
    parser.add_argument("--exporter-port", type=int, default=int(os.environ.get("PORT") or 9945))
    parser.add_argument("--prometheus-port", type=int, default=19090)
    parser.add_argument("--alertmanager-port", type=int, default=19093)
    parser.add_argument("--receiver-port", type=int, default=19094)
    parser.add_argument("--dir", default=str(REPO / ".demo"), help="working directory (wiped at start)")
    parser.add_argument("--exit-after", type=float, default=0,
                        help="stop after this many seconds (0: run until Ctrl-C)")
    parser.add_argument("--until", metavar="TEXT",
                        help="exit 0 once a notification mentions TEXT, e.g. an alert name (1 if none does "
                             "before --exit-after)")
    args = parser.parse_args(argv)
    if args.step_seconds <= 0:
        parser.error("--step-seconds must be positive")
    return args


def interrupt(*_) -> None:
    """SIGTERM stops the demo the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    return Demo(args).run()


if __name__ == "__main__":
    sys.exit(main())
