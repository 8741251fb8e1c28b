"""The scale-out setup of prometheus/victoriametrics/, for real and at a reduced size.

Debian's victoria-metrics package. Four exporters stand for a fleet: two runs (``demo/healthy`` and
``demo/lr-too-high``, simulated, one step every 0.2 s), each on a head node that follows the run's
log and a worker node that names the run with ``--project``/``--experiment``, 8 fake GPUs each (the
``hot`` fake: GPU 0 of each node runs hot, with ECC and XID errors and a remapped-row failure). Two
vmagents read the shipped ``prometheus/victoriametrics/scrape.yml`` (its file_sd folder pointed at this
test's, its interval 1 s) as
members 0 and 1 of one cluster of scrapers (``-promscrape.cluster.membersCount=2``) and remote-write
into one VictoriaMetrics; one vmalert evaluates the shipped rule files against it, unchanged (every
group at a 1 s interval). Then: each target is scraped by exactly one member, the recording rules
are written back, and every query of the three dashboards is answered by VictoriaMetrics the way
Grafana asks Prometheus. Last, a member of a cluster that VictoriaMetrics scrapes with the shipped
``scrapers.yml`` is killed: VerlScrapeShardDown fires for it, where VerlExporterDown cannot.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from servers import REPO, Server, free_port, require_binary, start_alertmanager, start_exporter, wait_until
from victoriametrics import start_victoria_metrics, start_vmalert, vmagent_check

sys.path.insert(0, str(REPO / "tests" / "dashboards"))
from dashboard_models import gated, panels, substitute  # noqa: E402
from test_dashboards_queries import DASHBOARDS, fill_variables, run_query  # noqa: E402

from verl_exporter.shipped import rule_files  # noqa: E402
from verl_mixin import local  # noqa: E402

CONFIG_DIR = REPO / "prometheus" / "victoriametrics"
MEMBERS = 2
TIMEOUT = 60
RUNS = ("healthy", "lr-too-high")
# Panels whose series come from other scrape jobs (the rollout servers, the scheduler's job): none here.
OTHER_SOURCES = {"Requests running and waiting", "KV-cache usage", "Generation tokens per second",
                 "Preemptions per second"}


def start_vmagent_member(tmp_path, scrape_config, member: int, remote_write_url: str, port: int = 0) -> Server:
    """vmagent as member ``member`` of a cluster of MEMBERS scrapers, with the shipped scrape config."""
    port = port or free_port()
    workdir = tmp_path / f"vmagent-{member}-{port}"
    workdir.mkdir()
    cmd = [require_binary("vmagent"), f"-httpListenAddr=127.0.0.1:{port}", f"-promscrape.config={scrape_config}",
           f"-promscrape.cluster.membersCount={MEMBERS}", f"-promscrape.cluster.memberNum={member}",
           f"-remoteWrite.url={remote_write_url}", f"-remoteWrite.tmpDataPath={workdir / 'queue'}",
           # Every second, not the shipped 15 s, and the file_sd files re-read as often: a test of seconds.
           "-promscrape.config.strictParse=true", "-promscrape.fileSDCheckInterval=1s",
           "-remoteWrite.flushInterval=1s"]
    config = yaml.safe_load(scrape_config.read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    for job in config["scrape_configs"]:
        job.pop("scrape_timeout", None)
    fast = scrape_config.with_name(f"scrape-1s-{member}.yml")
    fast.write_text(yaml.safe_dump(config))
    cmd[2] = f"-promscrape.config={fast}"
    return Server("vmagent", cmd, port, workdir / "vmagent.log", "/health", cwd=workdir)


def shipped_scrape_config(tmp_path, targets: list[str]) -> Path:
    """A copy of the shipped scrape.yml with its file_sd folder (../file_sd/*.yml) listing ``targets``."""
    config_dir = tmp_path / "prometheus" / "victoriametrics"
    config_dir.mkdir(parents=True)
    shutil.copy(CONFIG_DIR / "scrape.yml", config_dir / "scrape.yml")
    (tmp_path / "prometheus" / "file_sd").mkdir()
    (tmp_path / "prometheus" / "file_sd" / "fleet.yml").write_text(yaml.safe_dump([{"targets": sorted(targets)}]))
    return config_dir / "scrape.yml"


class Fleet:
    """Exporters, the vmagent cluster, VictoriaMetrics, vmalert and Alertmanager, stopped in reverse order."""

    def __init__(self, tmp_path):
        self.servers = []
        try:
            self._start(tmp_path)
        except BaseException:
            self.close()
            raise

    def _add(self, server):
        self.servers.append(server)
        return server

    def _start(self, tmp_path):
        self.exporters = {}
        for run in RUNS:
            gpus = ("--gpu.fake", "hot:8")
            self.exporters[f"{run}-head"] = self._add(start_exporter(
                tmp_path, "--simulate", run, "--simulate.interval", "0.2", "--simulate.dir", str(tmp_path / run),
                *gpus))
            self.exporters[f"{run}-worker"] = self._add(start_exporter(
                tmp_path, "--project", "demo", "--experiment", run, *gpus))
        self.scrape_config = shipped_scrape_config(tmp_path, [f"127.0.0.1:{e.port}" for e in self.exporters.values()])
        self.vm = self._add(start_victoria_metrics(tmp_path))
        self.vmagents = [self._add(start_vmagent_member(tmp_path, self.scrape_config, member,
                                                        f"{self.vm.url}/api/v1/write"))
                         for member in range(MEMBERS)]
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump({"route": {"receiver": "none"}, "receivers": [{"name": "none"}]}))
        self.alertmanager = self._add(start_alertmanager(tmp_path, am_config))
        # The shipped rule files as they are, every group evaluated each second.
        self.vmalert = self._add(start_vmalert(tmp_path, list(rule_files()), self.vm, self.alertmanager))

    def query(self, expr: str) -> list[dict]:
        status, body = self.vm.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", body[:500]
        return data["data"]["result"]

    def close(self):
        for server in reversed(self.servers):
            server.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("scale-out"))
    yield fleet
    fleet.close()


def recorded_evaluations(name: str, fleet: Fleet) -> int:
    """How many series of ``name`` have at least four samples in the last minute."""
    return len(fleet.query(f"count_over_time({name}[1m]) >= 4"))


@pytest.fixture(scope="module")
def recorded(fleet):
    """Waits until vmalert has written the per-node, per-run and per-fleet figures of every node."""
    wait_until(lambda: [float(r["value"][1]) for r in fleet.query("job:verl_gpus_up:sum")] == [32.0],
               timeout=TIMEOUT, message="32 GPUs up in the fleet's recorded figure")
    wait_until(lambda: sorted(float(r["value"][1]) for r in fleet.query("project_experiment:verl_gpus:count"))
               == [16.0, 16.0], timeout=TIMEOUT, message="16 GPUs (two nodes) in each run's recorded figure")
    wait_until(lambda: fleet.query('verl_val_core{experiment="healthy"}'), timeout=TIMEOUT,
               message="a validation step of the healthy run")
    wait_until(lambda: fleet.query("gpu:verl_gpu_xid_errors:nonzero"), timeout=TIMEOUT,
               message="the hot GPUs' XID errors recorded")
    # A recorded series read by another rule shows up one write-and-index round later (about 10 s here
    # for a new series): the run's median GPU utilization is four rules deep (verl_node_run_info, then
    # :unfinished, then the per-GPU :avg10m, then the median). Wait for that one, a few samples of it.
    wait_until(lambda: recorded_evaluations("project_experiment:verl_gpu_utilization_ratio:median10m", fleet) == 2,
               timeout=TIMEOUT, message="four evaluations of each run's median GPU utilization (the deepest chain)")
    wait_until(lambda: recorded_evaluations("job:verl_gpus_up:sum", fleet), timeout=TIMEOUT,
               message="four evaluations of the fleet's recorded figures")
    # The goodput row adds up recorded rates a minute apart: a minute's mark with them and the waste recorded.
    wait_until(lambda: fleet.query("sum_over_time((fleet:verl_gpu_waste:ratio_rate5m"
                                   " * sum(bucket:verl_run_gpu_seconds:rate5m))[5m:60s])"), timeout=90,
               message="a minute's mark with the fleet's goodput ledger and waste recorded")
    return fleet


def test_the_shipped_scrape_config_is_strict_vmagent_config():
    result = vmagent_check(CONFIG_DIR / "scrape.yml", "-promscrape.config.strictParse=true")
    assert result.returncode == 0, result.stdout + result.stderr


def scraped_by(vmagents: list[Server], job: str = "verl") -> list[set[str]]:
    """The targets each vmagent scrapes (its active targets of ``job``)."""
    found = []
    for vmagent in vmagents:
        status, body = vmagent.get("/api/v1/targets")
        assert status == 200, body
        found.append({t["labels"]["instance"] for t in json.loads(body)["data"]["activeTargets"]
                      if t["labels"].get("job") == job})
    return found


def shares_of_all(vmagents: list[Server], targets: set[str]) -> list[set[str]]:
    """Each member's targets, once the members have taken every one of ``targets`` between them and
    two reads a second apart agree (a member that has just re-read its file_sd files may list some of
    them for a moment). Fails with the last shares seen if that never happens."""
    seen: list[list[set[str]]] = [[]]

    def settled() -> list[set[str]] | None:
        found = scraped_by(vmagents)
        previous, seen[0] = seen[0], found
        return found if set().union(*found) == targets and found == previous else None

    return wait_until(settled, timeout=TIMEOUT, interval=1.0, message="every target taken by a member",
                      fail=lambda reason: pytest.fail(f"{reason}; the last shares read: {seen[0]}"))


def test_each_target_is_scraped_by_exactly_one_member(fleet):
    targets = {f"127.0.0.1:{e.port}" for e in fleet.exporters.values()}
    shares = shares_of_all(fleet.vmagents, targets)
    assert sum(len(share) for share in shares) == len(targets)  # no target twice
    up = wait_until(lambda: (lambda r: r if len(r) == len(targets) else None)(fleet.query('up{job="verl"} == 1')),
                    timeout=TIMEOUT, message="every target up in VictoriaMetrics")
    assert {r["metric"]["instance"] for r in up} == targets
    # One series per GPU, not one per member: no duplicates from the sharding.
    assert [float(r["value"][1]) for r in fleet.query("count(verl_gpu_up)")] == [32.0]


def test_the_members_split_a_fleet_of_named_nodes_between_them(tmp_path):
    """Four exporters on random ports may all hash to one member; 24 nodes of fixed names are split,
    the same way every time: each is scraped by one member, and each member scrapes some."""
    nodes = {f"gpu-node-{index:02d}:9945" for index in range(24)}
    scrape_config = shipped_scrape_config(tmp_path, list(nodes))
    members = []
    try:
        for member in range(MEMBERS):  # nowhere to write to: only the split is looked at
            members.append(start_vmagent_member(tmp_path, scrape_config, member,
                                                f"http://127.0.0.1:{free_port()}/api/v1/write"))
        shares = shares_of_all(members, nodes)
        assert sum(len(share) for share in shares) == len(nodes), shares  # no node twice
        assert all(shares), f"a member scrapes nothing: {shares}"
    finally:
        for server in members:
            server.stop()


def test_vmalert_evaluates_every_shipped_group_without_error(recorded):
    groups = json.loads(recorded.vmalert.get("/api/v1/rules")[1])["data"]["groups"]
    shipped = {group["name"] for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]}
    assert {group["name"] for group in groups} == shipped
    rules = [rule for group in groups for rule in group["rules"]]
    assert [(r["name"], r["lastError"]) for r in rules if r["lastError"] or r["health"] != "ok"] == []


def test_recorded_figures_cover_every_node_and_run(recorded):
    nodes = {r["metric"]["instance"]: float(r["value"][1]) for r in recorded.query("instance:verl_gpus:count")}
    assert sorted(nodes.values()) == [8.0] * 4
    busy = {r["metric"]["experiment"]: float(r["value"][1])
            for r in recorded.query("project_experiment:verl_gpu_utilization_ratio:avg")}
    assert set(busy) == set(RUNS) and all(0.5 < value <= 1 for value in busy.values())
    hot = recorded.query("gpu:verl_gpu_ecc_errors:nonzero")
    assert {(r["metric"]["gpu"], r["metric"]["type"]) for r in hot} >= {("0", "uncorrected")}
    assert len({r["metric"]["instance"] for r in hot}) == 4  # every node runs the hot fake


def dashboard_queries() -> list:
    params = []
    for filename, dashboard in DASHBOARDS.items():
        found = [(panel["title"], target) for panel in panels(dashboard) if not gated(dashboard, panel)
                 for target in panel["targets"]]  # a gated row's runs (V1, async) are not simulated
        found += [("annotation " + a["name"], {"expr": a["expr"]})
                  for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
        params += [pytest.param(filename, title, target, id=f"{filename[:-5]}:{title}:{target.get('refId', 'A')}")
                   for title, target in found]
    return params


@pytest.fixture(scope="module")
def variable_values(recorded):
    """Each dashboard's variables as Grafana fills them: All on the fleet and GPU dashboards where offered."""
    return {filename: fill_variables(recorded.vm, dashboard, pick_all=filename != "run-detail.json")
            for filename, dashboard in DASHBOARDS.items()}


@pytest.mark.parametrize("filename, title, target", dashboard_queries())
def test_dashboard_query_is_answered_by_the_scaled_out_store(recorded, variable_values, filename, title, target):
    expr = substitute(target["expr"], variable_values[filename])
    result = run_query(recorded.vm, expr, instant=target.get("instant", False) and not target.get("range", False))
    if title in OTHER_SOURCES or "ALERTS" in expr or "verl_job_info" in expr:
        return  # answered (run_query fails on an error); their series come from elsewhere
    assert result, f"{filename} panel {title!r} returned nothing from the scaled-out store: {expr}"


def shipped_scrapers_config(tmp_path, members: list[str]) -> Path:
    """The shipped scrapers.yml (VictoriaMetrics scraping the vmagent members) listing ``members``, every second."""
    config = yaml.safe_load((CONFIG_DIR / "scrapers.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": members}]
    path = tmp_path / "scrapers.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_shipped_scrapers_config_is_strict_vmagent_config():
    result = vmagent_check(CONFIG_DIR / "scrapers.yml", "-promscrape.config.strictParse=true")
    assert result.returncode == 0, result.stdout + result.stderr
    (job,) = yaml.safe_load((CONFIG_DIR / "scrapers.yml").read_text())["scrape_configs"]
    assert job["job_name"] == "vmagent"  # VerlScrapeShardDown watches up{job="vmagent"}


def firing(vmalert: Server, name: str) -> list[dict]:
    alerts = json.loads(vmalert.get("/api/v1/alerts")[1])["data"]["alerts"] or []
    return [alert["labels"] for alert in alerts if alert["name"] == name and alert["state"] == "firing"]


def test_a_dead_member_fires_verl_scrape_shard_down(tmp_path):
    """Kill the member that scrapes an exporter: that exporter's up series stops (no up == 0, so no
    VerlExporterDown), and VerlScrapeShardDown fires for the member, from VictoriaMetrics' scrape of
    the members. The shipped operations rules, durations divided by 60 (its 5m wait is 5 s)."""
    servers = []
    try:
        for name in ("a", "b", "c", "d"):
            servers.append(start_exporter(tmp_path, "--project", "demo", "--experiment", name))
        exporters = [f"127.0.0.1:{server.port}" for server in servers]
        ports = [free_port() for _ in range(MEMBERS)]
        members = [f"127.0.0.1:{port}" for port in ports]
        vm = start_victoria_metrics(tmp_path, f"-promscrape.config={shipped_scrapers_config(tmp_path, members)}")
        servers.append(vm)
        scrape_config = shipped_scrape_config(tmp_path, exporters)
        vmagents = [start_vmagent_member(tmp_path, scrape_config, member, f"{vm.url}/api/v1/write", ports[member])
                    for member in range(MEMBERS)]
        servers += vmagents
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump({"route": {"receiver": "none"}, "receivers": [{"name": "none"}]}))
        servers.append(alertmanager := start_alertmanager(tmp_path, am_config))
        rules = [path for path in local.write_rules(tmp_path / "rules", time_scale=1 / 60, min_range=3)
                 if path.name == "verl-operations.rules.yml"]
        servers.append(vmalert := start_vmalert(tmp_path, rules, vm, alertmanager))

        def query(expr: str) -> set[str]:
            body = vm.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))[1]
            return {r["metric"]["instance"] for r in json.loads(body)["data"]["result"]}

        shares = shares_of_all(vmagents, set(exporters))
        dead = next(member for member in range(MEMBERS) if shares[member])  # one that scrapes something
        wait_until(lambda: query('up{job="verl"} == 1') == set(exporters)
                   and query('up{job="vmagent"} == 1') == set(members), timeout=TIMEOUT,
                   message="every exporter and every member up in VictoriaMetrics")
        assert firing(vmalert, "VerlScrapeShardDown") == []

        vmagents[dead].process.kill()  # a crash: no goodbye, no stale markers
        shard_down = wait_until(lambda: firing(vmalert, "VerlScrapeShardDown"), timeout=30,
                                message="VerlScrapeShardDown firing for the killed member")
        assert [(alert["job"], alert["instance"]) for alert in shard_down] == [("vmagent", members[dead])]
        # The killed member's exporters: no sample of their up since (gone, not 0), no VerlExporterDown.
        assert query('last_over_time(up{job="verl"}[3s])') == set(exporters) - shares[dead]
        assert query('up{job="verl"} == 0') == set()
        assert firing(vmalert, "VerlExporterDown") == []
    finally:
        for server in reversed(servers):
            server.stop()
