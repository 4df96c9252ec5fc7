"""One read of a service cgroup's memory and pressure files, for the collector.

Every figure is optional: on hybrid hosts (no memory controller) memory.* files are absent
while memory.pressure exists; memory.peak needs kernel 5.19. A cgroup removed while it is read
(the service just ended) yields None from sample_cgroup, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..system import cgroups

MEMORY_EVENTS = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")
USEC_PER_SECOND = 1_000_000
PERCENT = 100.0


@dataclass
class CgroupSample:
    memory_current_bytes: int | None = None
    memory_max_bytes: int | None = None  # None: file absent or 'max'
    memory_max_present: bool = False  # memory.max exists (the memory controller is enabled here)
    memory_peak_bytes: int | None = None
    anon_bytes: int | None = None
    file_bytes: int | None = None
    events: dict[str, int] = field(default_factory=dict)
    # PSI "some" (waiting) and "full" (stalled): cumulative seconds and avg10 as a 0..1 ratio.
    waiting_seconds: float | None = None
    stalled_seconds: float | None = None
    waiting_avg10_ratio: float | None = None
    stalled_avg10_ratio: float | None = None


def pressure_figures(psi: dict[str, dict[str, float]] | None) -> tuple[float | None, ...]:
    """(waiting s, stalled s, waiting avg10 ratio, stalled avg10 ratio) from parse_pressure()."""
    some, full = (psi or {}).get("some", {}), (psi or {}).get("full", {})

    def seconds(d: dict) -> float | None:
        return d["total"] / USEC_PER_SECOND if "total" in d else None

    def ratio(d: dict) -> float | None:
        return d["avg10"] / PERCENT if "avg10" in d else None

    return seconds(some), seconds(full), ratio(some), ratio(full)


def _memory_max(cgroup: str) -> tuple[bool, int | None]:
    try:
        text = cgroups.read_text(cgroup, "memory.max").strip()
    except FileNotFoundError:
        if Path(cgroup).is_dir():
            return False, None
        raise
    return True, (int(text) if text.isdigit() else None)


def sample_cgroup(cgroup_dir: Path) -> CgroupSample | None:
    """Read every file once; None when the cgroup vanished meanwhile."""
    cgroup = str(cgroup_dir)
    s = CgroupSample()
    try:
        s.memory_current_bytes = cgroups.memory_current(cgroup)
        s.memory_max_present, s.memory_max_bytes = _memory_max(cgroup)
        s.memory_peak_bytes = cgroups.memory_peak(cgroup)
        stat = cgroups.read_memory_stat(cgroup) or {}
        s.anon_bytes, s.file_bytes = stat.get("anon"), stat.get("file")
        events = cgroups.read_memory_events(cgroup) or {}
        s.events = {k: events[k] for k in MEMORY_EVENTS if k in events}
        figures = pressure_figures(cgroups.read_pressure(cgroup, "memory"))
    except FileNotFoundError:
        return None
    s.waiting_seconds, s.stalled_seconds, s.waiting_avg10_ratio, s.stalled_avg10_ratio = figures
    return s
