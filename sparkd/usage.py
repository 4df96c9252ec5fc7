"""Memory use of a placed service, read from its cgroup v2 files (for `sparkctl status`).

Every figure is optional: on hybrid hosts memory.current/memory.max do not exist (no memory
controller) while memory.pressure does; a file that cannot be read is reported as None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

PROC_MOUNTS = Path("/proc/self/mounts")


@dataclass
class CgroupUsage:
    memory_current_bytes: int | None = None
    memory_max_bytes: int | None = None  # None: file missing or 'max'
    memory_max_unlimited: bool = False
    memory_high_bytes: int | None = None  # None: file missing or 'max' (no throttling threshold)
    psi_some_avg10: float | None = None
    psi_full_avg10: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def find_cgroup2_mount(mounts_path: Path = PROC_MOUNTS) -> Path | None:
    """Where cgroup2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        lines = Path(mounts_path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def resolve_cgroup_dir(cgroup: str | None, cgroup2_mount: Path | None) -> Path | None:
    """A backend's cgroup (absolute filesystem path, or systemd's ControlGroup relative to the
    cgroup2 mount) as a directory that exists, or None."""
    if not cgroup:
        return None
    path = Path(cgroup)
    if path.is_dir() and cgroup2_mount is not None and path.is_relative_to(cgroup2_mount):
        return path
    if cgroup2_mount is not None:
        joined = cgroup2_mount / cgroup.lstrip("/")
        if joined.is_dir():
            return joined
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _avg10(text: str | None, kind: str) -> float | None:
    for line in (text or "").splitlines():
        fields = line.split()
        if fields and fields[0] == kind:
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    return float(value)
    return None


def read_usage(cgroup_dir: Path | None) -> CgroupUsage:
    usage = CgroupUsage()
    if cgroup_dir is None:
        return usage
    current = _read(cgroup_dir / "memory.current")
    if current is not None and current.isdigit():
        usage.memory_current_bytes = int(current)
    limit = _read(cgroup_dir / "memory.max")
    if limit == "max":
        usage.memory_max_unlimited = True
    elif limit is not None and limit.isdigit():
        usage.memory_max_bytes = int(limit)
    high = _read(cgroup_dir / "memory.high")
    if high is not None and high.isdigit():
        usage.memory_high_bytes = int(high)
    pressure = _read(cgroup_dir / "memory.pressure")
    usage.psi_some_avg10 = _avg10(pressure, "some")
    usage.psi_full_avg10 = _avg10(pressure, "full")
    return usage


def cgroup_pids(cgroup_dir: Path | None) -> set[int]:
    """Every pid in a cgroup and its children (to match GPU processes to a service)."""
    pids: set[int] = set()
    if cgroup_dir is None:
        return pids
    for procs in Path(cgroup_dir).rglob("cgroup.procs"):
        text = _read(procs)
        pids.update(int(p) for p in (text or "").split())
    return pids
