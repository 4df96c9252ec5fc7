"""A real Prometheus server on loopback scrapes a real sparkd (cgroupfs placement on a test
cgroup root, services driven by sparkctl) and evaluates the shipped rules; the test reads
Prometheus' HTTP API."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from sparkd_harness import CGROUP2, Sparkd, free_port, remove_cgroup_tree, sparkctl

ROOT = Path(__file__).resolve().parents[2]
# Bounds on a wedged machine, never expected to be reached: server start, a scrape plus a rule run.
PROMETHEUS_READY_SECONDS = 60.0
SERIES_WAIT_SECONDS = 30.0
pytestmark = [pytest.mark.root, pytest.mark.skipif(not shutil.which("prometheus"), reason="needs prometheus (apt-get install prometheus)")]






@pytest.fixture
def sparkd(tmp_path):
    cgroup_root = CGROUP2 / f"sparkd-test-metrics-{os.getpid()}-{time.monotonic_ns()}"
    cgroup_root.mkdir()
    run_dir = Path(tempfile.mkdtemp(prefix="sparkd-run-", dir="/tmp"))
    policy = {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(cgroup_root), "state_dir": str(tmp_path / "state"),
                   "control_socket": str(run_dir / "control.sock"), "metrics_listen": "127.0.0.1:0"},
        "guards": {"reserve": "64M", "competitors": []},
        "services": {
            "sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "stop_timeout": "5s"},
            "huge": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "64T"},
        },
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    d = Sparkd(tmp_path / "policy.yaml", run_dir / "control.sock", tmp_path / "sparkd.log")
    try:
        d.start()
        port = int(re.search(r"event=metrics_listening .*port=(\d+)", d.log_text()).group(1))
        yield d, port
    finally:
        d.ensure_dead()
        remove_cgroup_tree(cgroup_root)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def prometheus(tmp_path, sparkd):
    _, sparkd_port = sparkd
    yield from _prometheus(tmp_path, {"sparkd": f"127.0.0.1:{sparkd_port}"})


def _prometheus(tmp_path, targets: dict[str, str]):
    """A Prometheus on a free loopback port scraping {job: host:port} every second, with our rules."""
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "packaging/prometheus/recording.yml"), str(ROOT / "packaging/prometheus/alerts.yml")],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [t]}]} for job, t in targets.items()],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=1h"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PROMETHEUS_READY_SECONDS
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready:\n" + (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(base: str, promql: str) -> list[dict]:
    body = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(base: str, promql: str, expect: float) -> dict:
    """The single series promql returns once its value is expect (after the next scrapes)."""
    deadline = time.monotonic() + SERIES_WAIT_SECONDS
    while True:
        result = query(base, promql)
        if len(result) == 1 and float(result[0]["value"][1]) == expect:
            return result[0]["metric"]
        assert time.monotonic() < deadline, f"{promql}: expected one series = {expect}, last got {result}"
        time.sleep(0.5)


def test_prometheus_scrapes_sparkd_and_runs_the_rules(sparkd, prometheus):
    d, sparkd_port = sparkd
    sock = d.socket
    assert sparkctl(sock, "start", "sleeper").returncode == 0
    labels = wait_for(prometheus, 'sparkd_service_state{service="sleeper", state="active"}', 1)
    assert (labels["job"], labels["instance"]) == ("sparkd", f"127.0.0.1:{sparkd_port}")
    wait_for(prometheus, 'sparkd_service_memory_max_bytes{service="sleeper"}', 256 << 20)
    wait_for(prometheus, 'sparkd_service_starts_total{service="sleeper"}', 1)
    wait_for(prometheus, 'sparkd_service_info{service="sleeper", backend="cgroupfs", unit="sparkd-sleeper.service"}', 1)
    # Hybrid host: the limit is not enforced and that is visible, not hidden.
    has_memory = "memory" in (CGROUP2 / "cgroup.controllers").read_text().split()
    wait_for(prometheus, 'sparkd_service_memory_max_enforced{service="sleeper"}', 1 if has_memory else 0)
    assert query(prometheus, 'sparkd_service_pressure_memory_waiting_seconds_total{service="sleeper"}')
    assert float(query(prometheus, "sparkd_memory_available_bytes")[0]["value"][1]) > 0
    assert not query(prometheus, '{__name__=~"sparkd_.*", pid!=""}')  # no pid labels anywhere

    refused = sparkctl(sock, "start", "huge")
    assert refused.returncode == 1
    wait_for(prometheus, 'sparkd_guard_refusals_total{service="huge", reason="headroom"}', 1)
    # The shipped alert rule, evaluated by this Prometheus, fires on the new refusal series.
    deadline = time.monotonic() + SERIES_WAIT_SECONDS
    while True:
        alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        firing = [a for a in alerts if a["labels"]["alertname"] == "SparkdGuardRefusingStarts" and a["state"] == "firing"]
        if firing:
            break
        assert time.monotonic() < deadline, f"SparkdGuardRefusingStarts never fired: {alerts}"
        time.sleep(0.5)
    assert firing[0]["labels"]["service"] == "huge"

    assert sparkctl(sock, "stop", "sleeper").returncode == 0
    wait_for(prometheus, 'sparkd_service_state{service="sleeper", state="inactive"}', 1)
    wait_for(prometheus, 'sparkd_service_stops_total{service="sleeper"}', 1)
    wait_for(prometheus, 'sparkd_service_exits_total{service="sleeper", result="success"}', 1)
    health = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert [t["health"] for t in health] == ["up"], health


def test_prometheus_scrapes_an_engine(tmp_path):
    # The engine's own /metrics (sparkd_engine_ names, docs/metrics-engine.md) through a real scrape.
    sys.path.insert(0, str(ROOT / "tests" / "engine" / "server"))
    from engine_server import EngineProcess, make_tiny_model

    engine = EngineProcess(make_tiny_model(tmp_path / "tiny.gguf"), log=tmp_path / "engine.log").start()
    try:
        scraper = _prometheus(tmp_path, {"engine": f"127.0.0.1:{engine.port}"})
        base = next(scraper)
        try:
            labels = wait_for(base, "sparkd_engine_ready", 1)
            assert (labels["job"], labels["instance"]) == ("engine", f"127.0.0.1:{engine.port}")
            reply = engine.client().completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
            generated = reply.usage.completion_tokens
            assert generated > 0
            wait_for(base, "sparkd_engine_generated_tokens_total", generated)
            assert query(base, "sparkd_engine_time_to_first_token_seconds_count")
        finally:
            scraper.close()
    finally:
        engine.stop()


def test_every_dashboard_query_parses_on_a_real_prometheus(prometheus):
    import json

    dash = json.loads((ROOT / "packaging/grafana/sparkd.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    bad = []
    for expr in exprs:
        concrete = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$service", ".*")
        body = httpx.get(f"{prometheus}/api/v1/query", params={"query": concrete}, timeout=10).json()
        if body["status"] != "success":
            bad.append(f"{expr}: {body.get('error')}")
    assert bad == []


def _policy_file(tmp_path: Path, cgroup_root: Path, run_dir: Path, listen: str) -> Path:
    policy = {"daemon": {"placement": "cgroupfs", "cgroup_root": str(cgroup_root), "state_dir": str(tmp_path / "state"),
                         "control_socket": str(run_dir / "control.sock"), "metrics_listen": listen},
              "guards": {"reserve": "64M", "competitors": []},
              "services": {"sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "autostart": True}}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def test_malformed_metrics_listen_fails_start_up_before_placing_anything(tmp_path):
    import sys

    from sparkd_harness import python_env

    cgroup_root = CGROUP2 / f"sparkd-test-metrics-{os.getpid()}-{time.monotonic_ns()}"
    policy = _policy_file(tmp_path, cgroup_root, tmp_path, "localhost:9464")
    out = subprocess.run([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(policy)], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "could not parse daemon.metrics_listen 'localhost:9464': 'localhost' is not an IP address" in out.stderr
    assert not cgroup_root.exists() and not (tmp_path / "control.sock").exists()


def test_busy_metrics_port_leaves_sparkd_supervising(tmp_path):
    cgroup_root = CGROUP2 / f"sparkd-test-metrics-{os.getpid()}-{time.monotonic_ns()}"
    cgroup_root.mkdir()
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    d = Sparkd(_policy_file(tmp_path, cgroup_root, tmp_path, f"127.0.0.1:{port}"), tmp_path / "control.sock",
               tmp_path / "sparkd.log")
    try:
        d.start()
        assert f"event=metrics_off error=\"could not listen for metrics on 127.0.0.1:{port}" in d.log_text()
        assert "sleeper" in sparkctl(d.socket, "status").stdout
    finally:
        holder.close()
        d.ensure_dead()
        remove_cgroup_tree(cgroup_root)
