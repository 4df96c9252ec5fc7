"""Small per-process facts read from /proc: name, resident memory, systemd unit by cgroup path.

Every reader returns None when the process is gone or not visible (another pid namespace):
callers report "unknown" rather than fail, because processes come and go between two reads.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_PROC_ROOT = Path("/proc")
# The kernel truncates comm to 15 bytes (TASK_COMM_LEN - 1); a comm this long may be cut short.
_COMM_MAX = 15
_UNIT_SUFFIXES = (".service", ".scope")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def process_name(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> str | None:
    """The process name as ps shows it, completed from argv[0] when comm was truncated."""
    comm = _read(proc_root / str(pid) / "comm")
    if comm is None:
        return None
    comm = comm.rstrip("\n")
    if len(comm) >= _COMM_MAX:
        cmdline = _read(proc_root / str(pid) / "cmdline") or ""
        argv0 = Path(cmdline.split("\0", 1)[0]).name
        if argv0.startswith(comm):
            return argv0
    return comm


def rss_bytes(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> int | None:
    """VmRSS of a process (None for kernel threads, gone or invisible processes)."""
    status = _read(proc_root / str(pid) / "status")
    for line in (status or "").splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def unit_from_cgroup_text(text: str) -> str | None:
    """The systemd unit (last *.service / *.scope path component) in a /proc/PID/cgroup text.

    The cgroup v2 line ("0::/...") wins; on v1/hybrid hosts systemd's own hierarchy
    ("name=systemd") names the same units.
    """
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    for key in ("", "name=systemd"):
        for component in reversed(paths.get(key, "").split("/")):
            if component.endswith(_UNIT_SUFFIXES):
                return component
    return None


def cgroup_unit(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> str | None:
    """The systemd unit a process runs in, from its cgroup path (no D-Bus needed)."""
    text = _read(proc_root / str(pid) / "cgroup")
    return unit_from_cgroup_text(text) if text is not None else None
