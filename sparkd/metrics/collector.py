"""sparkd's Prometheus collector: fresh metric families on every scrape.

Sources are injected (service views, counters, meminfo and PSI paths, a GPU reader) so tests
point them at literal files and stand-ins, each test with its own CollectorRegistry. A source
that fails is counted in sparkd_scrape_errors_total{source} and logged once per distinct error;
the rest of the scrape goes on. No pid labels: pids change on every restart and would leak series.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..errors import SparkdError
from ..logfmt import log_event
from ..system import cgroups
from ..system.gpu import MIB, GpuSnapshot
from ..system.meminfo import DEFAULT_MEMINFO_PATH, read_meminfo
from .cgroup_sample import MEMORY_EVENTS, CgroupSample, pressure_figures, sample_cgroup
from .counter_families import counter_families
from .counters import SparkdCounters
from .source import ACTIVE_STATES, ServiceView

log = logging.getLogger("sparkd.metrics")
DEFAULT_PRESSURE_PATH = Path("/proc/pressure/memory")
_PSI_HELP = {
    "waiting": "PSI 'some': time at least one task waited for memory",
    "stalled": "PSI 'full': time all non-idle tasks were stalled on memory at once",
}


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class SparkdCollector(Collector):
    def __init__(
        self,
        services: Callable[[], list[ServiceView]],
        counters: SparkdCounters,
        *,
        gpu_reader: Callable[[], GpuSnapshot] | None = None,
        reserve_bytes: int | None = None,
        started_at: float | None = None,
        meminfo_path: Path = DEFAULT_MEMINFO_PATH,
        pressure_path: Path = DEFAULT_PRESSURE_PATH,
    ):
        self._services = services
        self._counters = counters
        self._gpu_reader = gpu_reader
        self._reserve_bytes = reserve_bytes
        self._started_at = started_at
        self._meminfo_path = Path(meminfo_path)
        self._pressure_path = Path(pressure_path)
        self._last_errors: dict[str, str] = {}

    def _failed(self, source: str, exc: Exception) -> None:
        self._counters.scrape_error(source)
        text = str(exc)
        if self._last_errors.get(source) != text:  # once per distinct error, not every scrape
            self._last_errors[source] = text
            log_event(log, "metrics_source_failed", logging.WARNING, source=source, error=text)

    def collect(self) -> Iterator[Metric]:
        views = self._services()
        samples = {v.name: self._sample(v) for v in views}
        yield from self._service_families(views, samples)
        yield from self._gpu_families(views)
        yield from self._system_families()
        yield from counter_families(self._counters.snapshot())

    def _sample(self, view: ServiceView) -> CgroupSample | None:
        if view.cgroup_dir is None:
            return None
        try:
            return sample_cgroup(view.cgroup_dir)
        except (OSError, ValueError) as exc:
            self._failed("cgroup", exc)
            return None

    # --- per service ------------------------------------------------------------------------------

    def _service_families(self, views: list[ServiceView], samples: dict[str, CgroupSample | None]) -> Iterator[Metric]:
        state = _gauge("sparkd_service_state", "1 for the service's current systemd ActiveState, 0 for the others",
                       ("service", "state"))
        info = _gauge("sparkd_service_info", "Where the service is placed (always 1)", ("service", "backend", "unit"))
        max_bytes = _gauge("sparkd_service_memory_max_bytes", "memory_max asked for by the policy", ("service",))
        high_bytes = _gauge("sparkd_service_memory_high_bytes", "memory_high asked for by the policy (throttling "
                            "threshold; absent when not set)", ("service",))
        enforced = _gauge("sparkd_service_memory_max_enforced",
                          "1 when the kernel enforces memory_max (memory controller present, limit set)", ("service",))
        last = InfoMetricFamily("sparkd_service_last_result", "How the service's last run ended (systemd Result)",
                                labels=["service"])
        for v in views:
            for s in ACTIVE_STATES:
                state.add_metric([v.name, s], 1.0 if v.state == s else 0.0)
            info.add_metric([v.name, v.backend, v.unit], 1.0)
            if v.memory_max_policy_bytes is not None:
                max_bytes.add_metric([v.name], v.memory_max_policy_bytes)
            if v.memory_high_policy_bytes is not None:
                high_bytes.add_metric([v.name], v.memory_high_policy_bytes)
            sample = samples.get(v.name)
            is_enforced = v.memory_enforced if sample is None else sample.memory_max_bytes is not None
            enforced.add_metric([v.name], 1.0 if is_enforced else 0.0)
            if v.last_result:
                last.add_metric([v.name], {"result": v.last_result})
        yield from (state, info, max_bytes, high_bytes, enforced, last)
        yield from self._cgroup_families(samples)

    def _cgroup_families(self, samples: dict[str, CgroupSample | None]) -> Iterator[Metric]:
        label = ("service",)
        gauges = {
            "memory_current_bytes": _gauge("sparkd_service_memory_current_bytes", "cgroup memory.current", label),
            "memory_peak_bytes": _gauge("sparkd_service_memory_peak_bytes", "cgroup memory.peak", label),
            "anon_bytes": _gauge("sparkd_service_memory_anon_bytes", "memory.stat anon: anonymous memory", label),
            "file_bytes": _gauge("sparkd_service_memory_file_bytes", "memory.stat file: page cache", label),
            "waiting_avg10_ratio": _gauge("sparkd_service_pressure_memory_waiting_avg10_ratio",
                                          _PSI_HELP["waiting"] + ", share of the last 10 s", label),
            "stalled_avg10_ratio": _gauge("sparkd_service_pressure_memory_stalled_avg10_ratio",
                                          _PSI_HELP["stalled"] + ", share of the last 10 s", label),
        }
        counters = {
            "waiting_seconds": _counter("sparkd_service_pressure_memory_waiting_seconds",
                                        _PSI_HELP["waiting"] + " (cgroup memory.pressure)", label),
            "stalled_seconds": _counter("sparkd_service_pressure_memory_stalled_seconds",
                                        _PSI_HELP["stalled"] + " (cgroup memory.pressure)", label),
        }
        events = _counter("sparkd_service_memory_events", "cgroup memory.events counters", ("service", "event"))
        for name, sample in samples.items():
            if sample is None:
                continue
            for attr, family in (*gauges.items(), *counters.items()):
                value = getattr(sample, attr)
                if value is not None:
                    family.add_metric([name], value)
            for event in MEMORY_EVENTS:
                if event in sample.events:
                    events.add_metric([name, event], sample.events[event])
        yield from (*gauges.values(), *counters.values(), events)

    def _gpu_families(self, views: list[ServiceView]) -> Iterator[Metric]:
        up = _gauge("sparkd_gpu_nvml_up", "1 when NVML answered this scrape")
        held = _gauge("sparkd_service_gpu_memory_bytes", "GPU memory held by the service's processes (NVML)",
                      ("service",))
        snapshot = self._read_gpu()
        up.add_metric([], 1.0 if snapshot is not None and snapshot.available else 0.0)
        if snapshot is not None and snapshot.available:
            for v in views:
                if v.cgroup_dir is not None:
                    total = self._gpu_bytes(v, snapshot)
                    if total is not None:
                        held.add_metric([v.name], total)
        yield from (up, held)

    def _read_gpu(self) -> GpuSnapshot | None:
        if self._gpu_reader is None:
            return None
        try:
            return self._gpu_reader()
        except Exception as exc:  # a broken driver binding must not break the scrape
            self._failed("gpu", exc)
            return None

    def _gpu_bytes(self, view: ServiceView, snapshot: GpuSnapshot) -> int | None:
        if not snapshot.processes:
            return 0
        try:
            pids = set(cgroups.procs(str(view.cgroup_dir), recursive=True))
        except FileNotFoundError:
            return None  # ended during the scrape
        except OSError as exc:
            self._failed("cgroup", exc)
            return None
        return sum((p.used_mib or 0) * MIB for p in snapshot.processes if p.pid in pids)

    # --- system -----------------------------------------------------------------------------------

    def _system_families(self) -> Iterator[Metric]:
        build = InfoMetricFamily("sparkd_build", "sparkd version and the Python running it")
        build.add_metric([], {"version": __version__, "python": platform.python_version()})
        yield build
        if self._started_at is not None:
            yield GaugeMetricFamily("sparkd_start_time_seconds", "When this sparkd started (unix time)",
                                    value=self._started_at)
        if self._reserve_bytes is not None:
            yield GaugeMetricFamily("sparkd_guard_reserve_bytes", "guards.reserve: memory kept free beside services",
                                    value=self._reserve_bytes)
        yield from self._meminfo_families()
        yield from self._pressure_families()

    def _meminfo_families(self) -> Iterator[Metric]:
        try:
            mem = read_meminfo(self._meminfo_path)
        except SparkdError as exc:
            self._failed("meminfo", exc)
            return
        yield GaugeMetricFamily("sparkd_memory_available_bytes", "MemAvailable from /proc/meminfo",
                                value=mem.available_bytes)
        yield GaugeMetricFamily("sparkd_memory_total_bytes", "MemTotal from /proc/meminfo", value=mem.total_bytes)

    def _pressure_families(self) -> Iterator[Metric]:
        try:
            psi = cgroups.read_pressure_file(str(self._pressure_path))
        except FileNotFoundError:
            return  # kernel without PSI (psi=0): nothing to report, not an error
        except (OSError, ValueError) as exc:
            self._failed("pressure", exc)
            return
        waiting, stalled, waiting_avg10, stalled_avg10 = pressure_figures(psi)
        for kind, seconds, ratio in (("waiting", waiting, waiting_avg10), ("stalled", stalled, stalled_avg10)):
            if seconds is not None:
                yield CounterMetricFamily(f"sparkd_pressure_memory_{kind}_seconds",
                                          _PSI_HELP[kind] + " (/proc/pressure/memory)", value=seconds)
            if ratio is not None:
                yield GaugeMetricFamily(f"sparkd_pressure_memory_{kind}_avg10_ratio",
                                        _PSI_HELP[kind] + ", share of the last 10 s (system)", value=ratio)
