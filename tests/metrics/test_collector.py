"""The collector over literal kernel files, an NVML stand-in and counters; then over the real
cgroup2 tree of this machine."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from metrics_fixtures import full_collector, samples, scrape, value, write_cgroup, write_system
from sparkd.metrics import ServiceView, SparkdCollector, SparkdCounters

GiB = 1 << 30


def test_service_figures_from_cgroup_files(tmp_path):
    text = scrape(full_collector(tmp_path))
    assert value(text, "sparkd_service_memory_current_bytes", service="llm") == GiB
    assert value(text, "sparkd_service_memory_max_bytes", service="llm") == 2 * GiB
    assert value(text, "sparkd_service_memory_high_bytes", service="llm") == 1.5 * GiB
    assert value(text, "sparkd_service_memory_max_enforced", service="llm") == 1
    assert value(text, "sparkd_service_memory_peak_bytes", service="llm") == 1.5 * GiB
    assert value(text, "sparkd_service_memory_anon_bytes", service="llm") == 768 << 20
    assert value(text, "sparkd_service_memory_file_bytes", service="llm") == 256 << 20
    for event, count in {"low": 0, "high": 3, "max": 7, "oom": 1, "oom_kill": 2, "oom_group_kill": 1}.items():
        assert value(text, "sparkd_service_memory_events_total", service="llm", event=event) == count
    assert value(text, "sparkd_service_pressure_memory_waiting_seconds_total", service="llm") == 9.0
    assert value(text, "sparkd_service_pressure_memory_stalled_seconds_total", service="llm") == 4.0
    assert value(text, "sparkd_service_pressure_memory_waiting_avg10_ratio", service="llm") == 0.53
    assert value(text, "sparkd_service_pressure_memory_stalled_avg10_ratio", service="llm") == 0.25


def test_state_backend_result_and_stopped_service(tmp_path):
    text = scrape(full_collector(tmp_path))
    assert value(text, "sparkd_service_state", service="llm", state="active") == 1
    assert value(text, "sparkd_service_state", service="llm", state="failed") == 0
    assert value(text, "sparkd_service_state", service="idle", state="failed") == 1
    assert value(text, "sparkd_service_info", service="llm", backend="cgroupfs", unit="sparkd-llm.service") == 1
    assert value(text, "sparkd_service_last_result_info", service="idle", result="oom-kill") == 1
    # A stopped service has its policy limit and enforcement but no cgroup figures.
    assert value(text, "sparkd_service_memory_max_bytes", service="idle") == GiB
    assert value(text, "sparkd_service_memory_max_enforced", service="idle") == 0
    assert ("sparkd_service_memory_high_bytes", frozenset({("service", "idle")})) not in samples(text)  # not set
    assert not [k for k in samples(text) if k[0].startswith("sparkd_service_memory_current") and ("service", "idle") in k[1]]


def test_gpu_memory_summed_over_the_service_cgroup_pids(tmp_path):
    text = scrape(full_collector(tmp_path))
    assert value(text, "sparkd_gpu_nvml_up") == 1
    # pids 4242 (2048 MiB) and 4243 (100 MiB) are in the cgroup; 9999 is not.
    assert value(text, "sparkd_service_gpu_memory_bytes", service="llm") == 2148 << 20
    assert ("sparkd_service_gpu_memory_bytes", frozenset({("service", "idle")})) not in samples(text)


def test_system_and_counter_families(tmp_path):
    text = scrape(full_collector(tmp_path))
    assert value(text, "sparkd_memory_available_bytes") == 20000000 * 1024
    assert value(text, "sparkd_memory_total_bytes") == 24683656 * 1024
    assert value(text, "sparkd_guard_reserve_bytes") == 16 * GiB
    assert value(text, "sparkd_pressure_memory_waiting_seconds_total") == 2.5
    assert value(text, "sparkd_pressure_memory_stalled_seconds_total") == 1.25
    assert value(text, "sparkd_pressure_memory_waiting_avg10_ratio") == 0.125
    assert value(text, "sparkd_pressure_memory_stalled_avg10_ratio") == 0.0525
    assert value(text, "sparkd_start_time_seconds") == 1700000000.0
    assert value(text, "sparkd_service_starts_total", service="llm") == 1
    assert value(text, "sparkd_service_stops_total", service="llm") == 1
    assert value(text, "sparkd_service_exits_total", service="llm", result="oom-kill") == 1
    assert value(text, "sparkd_guard_refusals_total", service="llm", reason="headroom") == 1
    assert value(text, "sparkd_competitor_evictions_total", competitor="ollama.service") == 1
    assert value(text, "sparkd_nvrm_events_total", xid="79", bucket="node") == 1
    assert value(text, "sparkd_actions_total", rule="stop-on-full", action="stop", outcome="done") == 1
    assert value(text, "sparkd_watcher_up", watcher="psi", service="llm", mode="trigger_2s") == 1
    assert value(text, "sparkd_watcher_errors_total", watcher="kmsg", service="") == 1
    build = [k for k in samples(text) if k[0] == "sparkd_build_info"]
    assert len(build) == 1 and ("version", "0.1.0") in build[0][1]


def test_each_scrape_reads_the_files_afresh(tmp_path):
    collector = full_collector(tmp_path)
    assert value(scrape(collector), "sparkd_service_memory_current_bytes", service="llm") == GiB
    (tmp_path / "sparkd-llm.service" / "memory.current").write_text("5\n")
    assert value(scrape(collector), "sparkd_service_memory_current_bytes", service="llm") == 5


def test_failing_sources_are_counted_and_the_scrape_goes_on(tmp_path, caplog):
    counters = SparkdCounters()
    cg = write_cgroup(tmp_path / "cg")
    views = [ServiceView("llm", "active", "cgroupfs", "u", cg, GiB, False)]

    def broken_gpu():
        raise RuntimeError("driver binding exploded")

    collector = SparkdCollector(lambda: views, counters, gpu_reader=broken_gpu, meminfo_path=tmp_path / "missing",
                                pressure_path=tmp_path / "nope")
    for _ in range(2):
        text = scrape(collector)
    assert value(text, "sparkd_scrape_errors_total", source="meminfo") == 2
    assert value(text, "sparkd_scrape_errors_total", source="gpu") == 2
    assert value(text, "sparkd_gpu_nvml_up") == 0
    assert value(text, "sparkd_service_memory_current_bytes", service="llm") == GiB
    # A kernel without PSI has no /proc/pressure/memory: not an error, just no series.
    assert ("sparkd_scrape_errors_total", frozenset({("source", "pressure")})) not in samples(text)
    logged = [r.getMessage() for r in caplog.records if "metrics_source_failed" in r.getMessage()]
    assert len(logged) == 2  # once per distinct error, not once per scrape
    assert any(f"could not read {tmp_path / 'missing'}" in m for m in logged)


def test_cgroup_gone_during_scrape_is_no_error(tmp_path):
    counters = SparkdCounters()
    meminfo, pressure = write_system(tmp_path)
    views = [ServiceView("llm", "active", "cgroupfs", "u", tmp_path / "gone", GiB, False)]
    text = scrape(SparkdCollector(lambda: views, counters, meminfo_path=meminfo, pressure_path=pressure))
    assert value(text, "sparkd_service_state", service="llm", state="active") == 1
    assert not [k for k in samples(text) if k[0] == "sparkd_scrape_errors_total"]
    assert not [k for k in samples(text) if k[0] == "sparkd_service_memory_events_total"]


def test_unparsable_memory_file_is_a_scrape_error_naming_nothing_else(tmp_path):
    cg = write_cgroup(tmp_path / "cg", {"memory.current": "lots\n"})
    meminfo, pressure = write_system(tmp_path)
    counters = SparkdCounters()
    views = [ServiceView("llm", "active", "cgroupfs", "u", cg, GiB, False)]
    text = scrape(SparkdCollector(lambda: views, counters, meminfo_path=meminfo, pressure_path=pressure))
    assert value(text, "sparkd_scrape_errors_total", source="cgroup") == 1
    assert value(text, "sparkd_memory_available_bytes") == 20000000 * 1024


CGROUP2 = Path("/sys/fs/cgroup/unified") if not Path("/sys/fs/cgroup/cgroup.controllers").exists() else Path("/sys/fs/cgroup")


@pytest.fixture
def real_cgroup():
    path = CGROUP2 / f"sparkd-test-metrics-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    proc = subprocess.Popen(["sleep", "600"])
    try:
        (path / "cgroup.procs").write_text(str(proc.pid))
        yield path, proc.pid
    finally:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.root
def test_real_cgroup_tree(real_cgroup, tmp_path):
    """This machine's cgroup2: memory.pressure always; memory.* only where the controller is on."""
    path, pid = real_cgroup
    has_memory = "memory" in (CGROUP2 / "cgroup.controllers").read_text().split()
    views = [ServiceView("real", "active", "cgroupfs", "u", path, GiB, has_memory)]
    text = scrape(SparkdCollector(lambda: views, SparkdCounters()))
    assert value(text, "sparkd_service_pressure_memory_waiting_seconds_total", service="real") >= 0
    assert value(text, "sparkd_memory_available_bytes") > 0
    if has_memory:
        assert value(text, "sparkd_service_memory_current_bytes", service="real") > 0
    else:  # hybrid host: no controller, so nothing is enforced and there is no memory.current
        assert value(text, "sparkd_service_memory_max_enforced", service="real") == 0
        assert ("sparkd_service_memory_current_bytes", frozenset({("service", "real")})) not in samples(text)
