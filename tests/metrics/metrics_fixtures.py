"""Literal inputs for the collector: a cgroup directory, meminfo and PSI files written as the
kernel writes them, an NVML stand-in (fake_nvml.py says why), and a collector with every source
populated so every family has samples."""

from __future__ import annotations

from pathlib import Path

from fake_nvml import FakeGpu, FakeNvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sparkd.metrics import ServiceView, SparkdCollector, SparkdCounters
from sparkd.system.gpu import GpuReader

MiB = 1 << 20
MEMINFO = "MemTotal:       24683656 kB\nMemFree: 100 kB\nMemAvailable:   20000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
SYSTEM_PSI = ("some avg10=12.50 avg60=3.00 avg300=1.00 total=2500000\n"
              "full avg10=5.25 avg60=1.00 avg300=0.50 total=1250000\n")
CGROUP_FILES = {
    "memory.current": "1073741824\n",
    "memory.max": "2147483648\n",
    "memory.peak": "1610612736\n",
    "memory.stat": "anon 805306368\nfile 268435456\nkernel 1000\npgfault 42\n",
    "memory.events": "low 0\nhigh 3\nmax 7\noom 1\noom_kill 2\noom_group_kill 1\n",
    "memory.pressure": "some avg10=53.00 avg60=20.00 avg300=5.00 total=9000000\n"
                       "full avg10=25.00 avg60=10.00 avg300=2.00 total=4000000\n",
    "cgroup.procs": "4242\n4243\n",
}


def write_cgroup(path: Path, files: dict[str, str] = CGROUP_FILES) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def write_system(tmp: Path) -> tuple[Path, Path]:
    (tmp / "meminfo").write_text(MEMINFO)
    (tmp / "pressure").write_text(SYSTEM_PSI)
    return tmp / "meminfo", tmp / "pressure"


def full_counters() -> SparkdCounters:
    c = SparkdCounters()
    c.service_started("llm")
    c.service_stopped("llm")
    c.service_ended("llm", "oom-kill")
    c.observe_preflight({"service": "llm", "checks": [
        {"name": "headroom[llm]", "status": "refused", "culprits": []},
        {"name": "competitor[ollama.service]", "status": "ok",
         "culprits": [{"name": "ollama.service", "detail": "stopped and disabled"}]}]})
    c.nvrm_event(79, "node")
    c.action("stop-on-full", "stop", "done")
    c.watcher_health("psi", True, "trigger_2s", service="llm")
    c.watcher_error("kmsg")
    c.scrape_error("gpu")
    return c


def full_collector(tmp: Path, counters: SparkdCounters | None = None) -> SparkdCollector:
    cg = write_cgroup(tmp / "sparkd-llm.service")
    meminfo, pressure = write_system(tmp)
    views = [
        ServiceView("llm", "active", "cgroupfs", "sparkd-llm.service", cg, 2 << 30, True, "success",
                    memory_high_policy_bytes=3 << 29),
        ServiceView("idle", "failed", "cgroupfs", "sparkd-idle.service", None, 1 << 30, False, "oom-kill"),
    ]
    nvml = FakeNvml([FakeGpu("NVIDIA H200", 141 << 30, 3 << 30, compute=[(4242, 2048 * MiB), (9999, 512 * MiB)],
                             graphics=[(4243, 100 * MiB)])])
    return SparkdCollector(lambda: views, counters or full_counters(), gpu_reader=GpuReader(nvml).read,
                           reserve_bytes=16 << 30, started_at=1700000000.0, meminfo_path=meminfo, pressure_path=pressure)


def scrape(collector: SparkdCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset(labels)): value} from an exposition, through prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]
