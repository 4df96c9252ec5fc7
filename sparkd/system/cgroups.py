"""Small readers and writers over cgroup v2 files.

Every path is a parameter, so tests (and containers with odd mounts) point them anywhere.
Conventions:
- `cgroup` arguments are absolute directory paths inside a cgroup2 mount.
- Readers of files that belong to a controller (memory.*, *.pressure) return None when the
  cgroup exists but the file does not (the controller is not enabled there, as on hybrid hosts
  without the memory controller); they raise FileNotFoundError when the cgroup itself is gone.
- Everything else raises OSError from the filesystem unchanged; callers turn it into their own
  "could not <verb> <object>: <cause>" message.
"""

from __future__ import annotations

import os
import signal
import time

DEFAULT_MOUNTINFO = "/proc/self/mountinfo"
DEFAULT_PROC_ROOT = "/proc"

# Preferred locations: pure v2 first, then systemd's hybrid layout.
_PREFERRED_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")

# Rounds of "SIGKILL every pid" in the fallback kill: a process may fork between reading
# cgroup.procs and the kill, so repeat until the cgroup reads empty.
_FALLBACK_KILL_ROUNDS = 50
_FALLBACK_KILL_PAUSE_SECONDS = 0.01


# -- discovery ---------------------------------------------------------------------------------


def parse_mountinfo_cgroup2(text: str) -> list[str]:
    """Mount points of every cgroup2 filesystem listed in a mountinfo text, in order."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        if len(fields) >= 5 and right.split()[:1] == ["cgroup2"]:
            mounts.append(_unescape_mount_path(fields[4]))
    return mounts


def _unescape_mount_path(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(path):
        code = path[i + 1 : i + 4]
        if path[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def find_cgroup2_mount(mountinfo_path: str = DEFAULT_MOUNTINFO) -> str | None:
    """The cgroup2 mount point (/sys/fs/cgroup or hybrid /sys/fs/cgroup/unified), None if none."""
    with open(mountinfo_path) as f:
        mounts = parse_mountinfo_cgroup2(f.read())
    for preferred in _PREFERRED_MOUNTS:
        if preferred in mounts:
            return preferred
    return mounts[0] if mounts else None


def cgroup_of_pid(pid: int, proc_root: str = DEFAULT_PROC_ROOT) -> str | None:
    """The pid's cgroup v2 path relative to the mount ("/sparkd.slice/x.service"), None on pure v1.

    Raises FileNotFoundError / ProcessLookupError when the process does not exist.
    """
    with open(os.path.join(proc_root, str(pid), "cgroup")) as f:
        for line in f:
            hierarchy, _, rest = line.rstrip("\n").partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and controllers == "":
                return path
    return None


# -- plain files -------------------------------------------------------------------------------


def read_text(cgroup: str, filename: str) -> str:
    with open(os.path.join(cgroup, filename)) as f:
        return f.read()


def write_text(cgroup: str, filename: str, value: str) -> None:
    """Write one value with a single write(2), as the kernel expects for cgroup files."""
    fd = os.open(os.path.join(cgroup, filename), os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_optional(cgroup: str, filename: str) -> str | None:
    try:
        return read_text(cgroup, filename)
    except FileNotFoundError:
        if os.path.isdir(cgroup):
            return None
        raise


def parse_flat_keyed(text: str) -> dict[str, int]:
    """'key value' lines (memory.events, memory.stat, cgroup.events, cpu.stat) as a dict."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key and value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


# -- controllers -------------------------------------------------------------------------------


def controllers(cgroup: str) -> set[str]:
    """Controllers available in this cgroup (its cgroup.controllers)."""
    return set(read_text(cgroup, "cgroup.controllers").split())


def subtree_control(cgroup: str) -> set[str]:
    """Controllers this cgroup enables for its children (its cgroup.subtree_control)."""
    return set(read_text(cgroup, "cgroup.subtree_control").split())


def enable_controllers(cgroup: str, names: set[str] | list[str], mount: str) -> set[str]:
    """Make `names` available in `cgroup` by enabling them in every ancestor's subtree_control.

    Walks from `mount` (the top cgroup, which must be an ancestor of `cgroup`) down to the
    parent of `cgroup`, writing "+name" only where it is not enabled yet. Controllers the top
    does not offer at all cannot be enabled from here: they are skipped and returned, so the
    caller decides what "not available" means (placement reports the limit as not enforced).
    Write errors (EBUSY when an ancestor below the root has processes of its own, EACCES)
    raise OSError naming nothing: the caller adds the path.
    """
    mount = os.path.normpath(mount)
    cgroup = os.path.normpath(cgroup)
    rel = os.path.relpath(cgroup, mount)
    if rel.startswith(".."):
        raise ValueError(f"{cgroup} is not below the cgroup mount {mount}")
    wanted = set(names)
    missing = wanted - controllers(mount)
    enable = wanted - missing
    parts = [] if rel == "." else rel.split(os.sep)
    current = mount
    for part in parts:
        already = subtree_control(current)
        todo = sorted(enable - already)
        if todo:
            write_text(current, "cgroup.subtree_control", " ".join(f"+{n}" for n in todo))
        current = os.path.join(current, part)
    return missing


# -- memory and pressure -----------------------------------------------------------------------


def read_memory_events(cgroup: str) -> dict[str, int] | None:
    """memory.events (low, high, max, oom, oom_kill, oom_group_kill) or None without memory."""
    text = _read_optional(cgroup, "memory.events")
    return None if text is None else parse_flat_keyed(text)


def read_memory_stat(cgroup: str) -> dict[str, int] | None:
    """memory.stat (anon, file, ... in bytes; counters as counts) or None without memory."""
    text = _read_optional(cgroup, "memory.stat")
    return None if text is None else parse_flat_keyed(text)


def _read_bytes(cgroup: str, filename: str) -> int | None:
    text = _read_optional(cgroup, filename)
    return None if text is None else int(text.strip())


def memory_current(cgroup: str) -> int | None:
    """memory.current in bytes, None without the memory controller."""
    return _read_bytes(cgroup, "memory.current")


def memory_peak(cgroup: str) -> int | None:
    """memory.peak in bytes, None without the memory controller or on kernels before 5.19."""
    return _read_bytes(cgroup, "memory.peak")


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """PSI text to {some: {avg10, avg60, avg300, total}, full: {...}}.

    avg* are percentages of wall time stalled; total is cumulative stall in microseconds.
    """
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values: dict[str, float] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            values[key] = int(value) if key == "total" else float(value)
        out[kind] = values
    return out


def read_pressure_file(path: str) -> dict[str, dict[str, float]]:
    """A PSI file anywhere: a cgroup's memory.pressure or /proc/pressure/memory."""
    with open(path) as f:
        return parse_pressure(f.read())


def read_pressure(cgroup: str, resource: str = "memory") -> dict[str, dict[str, float]] | None:
    """The cgroup's <resource>.pressure, None where PSI is not available."""
    text = _read_optional(cgroup, f"{resource}.pressure")
    return None if text is None else parse_pressure(text)


# -- processes ---------------------------------------------------------------------------------


def procs(cgroup: str, recursive: bool = False) -> list[int]:
    """Pids in cgroup.procs; with recursive, those of every descendant cgroup too."""
    pids = [int(p) for p in read_text(cgroup, "cgroup.procs").split()]
    if recursive:
        for child in _child_cgroups(cgroup):
            try:
                pids.extend(procs(child, recursive=True))
            except FileNotFoundError:
                continue  # removed while we walked
    return pids


def _child_cgroups(cgroup: str) -> list[str]:
    with os.scandir(cgroup) as entries:
        return [e.path for e in entries if e.is_dir(follow_symlinks=False)]


def is_populated(cgroup: str) -> bool:
    """True while the cgroup or a descendant has a live process (cgroup.events populated)."""
    return parse_flat_keyed(read_text(cgroup, "cgroup.events")).get("populated", 0) == 1


def signal_cgroup(cgroup: str, sig: int) -> int:
    """Send sig to every process of the cgroup and its descendants; how many were signalled."""
    sent = 0
    for pid in procs(cgroup, recursive=True):
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            continue  # exited meanwhile
    return sent


def kill_cgroup(cgroup: str, use_kill_file: bool = True) -> None:
    """SIGKILL everything in the cgroup and below, at once where the kernel can.

    cgroup.kill (5.14+) kills atomically, forks included. Without it, SIGKILL every pid
    repeatedly until the cgroup reads empty, since a process may fork between read and kill.
    """
    if use_kill_file and os.path.exists(os.path.join(cgroup, "cgroup.kill")):
        write_text(cgroup, "cgroup.kill", "1")
        return
    for _ in range(_FALLBACK_KILL_ROUNDS):
        if signal_cgroup(cgroup, signal.SIGKILL) == 0:
            return
        time.sleep(_FALLBACK_KILL_PAUSE_SECONDS)


def wait_until_empty(cgroup: str, timeout_seconds: float, poll_seconds: float = 0.02) -> bool:
    """Block until the cgroup has no live process; False when timeout_seconds passed first."""
    deadline = time.monotonic() + timeout_seconds
    while is_populated(cgroup):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_seconds)
    return True


def remove_cgroup(cgroup: str) -> None:
    """rmdir the cgroup and its (empty) descendants, deepest first; absent is fine."""
    try:
        children = _child_cgroups(cgroup)
    except FileNotFoundError:
        return
    for child in children:
        remove_cgroup(child)
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        pass
