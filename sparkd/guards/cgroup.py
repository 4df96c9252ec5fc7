"""cgroup guard: cgroup v2 must be mounted, and memory.max is only enforced with its memory controller.

Hybrid hosts (cgroup v1 for controllers, cgroup2 at /sys/fs/cgroup/unified without memory) accept
a limit but never enforce it: preflight says so as a warning, never silently. No cgroup2 at all
means sparkd cannot isolate the service: refused.
"""

from __future__ import annotations

from pathlib import Path

from ..system.cgroups import DEFAULT_MOUNTINFO, controllers as read_controllers, find_cgroup2_mount
from .report import Check

DEFAULT_MOUNTINFO_PATH = Path(DEFAULT_MOUNTINFO)


def check_cgroup(mountinfo_path: Path = DEFAULT_MOUNTINFO_PATH, service_name: str | None = None) -> Check:
    key = f"services.{service_name}.memory_max" if service_name else None
    try:
        mount = find_cgroup2_mount(mountinfo_path)
        controllers = read_controllers(mount) if mount is not None else set()
    except OSError as exc:
        return Check("cgroup", "refused", f"could not read {exc.filename}: {exc.strerror}", (), key)
    if mount is None:
        return Check("cgroup", "refused", f"no cgroup2 file system in {mountinfo_path}: sparkd needs cgroup v2 "
                     "to isolate services (boot with systemd.unified_cgroup_hierarchy=1)", (), key)
    if "memory" not in controllers:
        have = " ".join(sorted(controllers)) or "none"
        return Check("cgroup", "warning", f"cgroup2 at {mount} has no memory controller (controllers: {have}): "
                     "memory_max is NOT enforced on this host", (), key)
    return Check("cgroup", "ok", f"cgroup2 at {mount} with the memory controller: memory_max is enforced")
