"""Placement backends and the choice between them (`daemon.placement: auto | systemd | cgroupfs`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import PlacementError
from ..policy import DaemonPolicy
from ..system.cgroups import find_cgroup2_mount
from .base import Placement, ServiceSpec, ServiceStatus, StatusCallback, unit_name

__all__ = ["Placement", "ServiceSpec", "ServiceStatus", "StatusCallback", "unit_name", "select_placement", "pid1_is_systemd"]

PID1_COMM = Path("/proc/1/comm")


def pid1_is_systemd(comm_path: Path = PID1_COMM) -> tuple[bool, str]:
    """(is systemd, what PID 1 is called) from /proc/1/comm."""
    try:
        comm = Path(comm_path).read_text().strip()
    except OSError as exc:
        return False, f"unknown ({comm_path}: {exc.strerror})"
    return comm == "systemd", comm


async def _open_systemd(policy: DaemonPolicy, on_change: StatusCallback | None, bus_address: str | None) -> Placement:
    from .systemd import SystemdPlacement

    placement = SystemdPlacement(slice_name=policy.slice, bus_address=bus_address, on_change=on_change)
    try:
        # Listing our units is the proof that systemd answers on this bus (it also connects).
        await placement.adopt()
    except PlacementError:
        await placement.close()
        raise
    return placement


def cgroup_root_of(policy: DaemonPolicy) -> Path:
    """daemon.cgroup_root, else the cgroup2 mount of this host."""
    if policy.cgroup_root is not None:
        return policy.cgroup_root
    mount = find_cgroup2_mount()
    if mount is None:
        raise PlacementError("could not find a cgroup2 mount in /proc/self/mountinfo: mount cgroup2 or set daemon.cgroup_root")
    return Path(mount)


def _open_cgroupfs(policy: DaemonPolicy, on_change: StatusCallback | None) -> Placement:
    from .cgroupfs import CgroupfsPlacement

    return CgroupfsPlacement(cgroup_root=str(cgroup_root_of(policy)), slice=policy.slice,
                             state_dir=str(policy.state_dir), on_change=on_change)


async def select_placement(
    policy: DaemonPolicy,
    *,
    on_change: StatusCallback | None = None,
    pid1_comm_path: Path = PID1_COMM,
    bus_address: str | None = None,
) -> tuple[Placement, str]:
    """The backend the policy asks for, and a sentence saying which one and why."""
    if policy.placement == "cgroupfs":
        return _open_cgroupfs(policy, on_change), f"cgroupfs: daemon.placement is cgroupfs (root {cgroup_root_of(policy)})"
    if policy.placement == "systemd":
        return await _open_systemd(policy, on_change, bus_address), "systemd: daemon.placement is systemd"
    is_systemd, comm = pid1_is_systemd(pid1_comm_path)
    if not is_systemd:
        reason = f"cgroupfs: daemon.placement is auto and PID 1 is {comm!r}, not systemd (root {cgroup_root_of(policy)})"
        return _open_cgroupfs(policy, on_change), reason
    try:
        placement = await _open_systemd(policy, on_change, bus_address)
    except PlacementError as exc:
        reason = f"cgroupfs: daemon.placement is auto, PID 1 is systemd but its bus did not answer ({exc}); using root {cgroup_root_of(policy)}"
        return _open_cgroupfs(policy, on_change), reason
    return placement, "systemd: daemon.placement is auto and PID 1 is systemd with a working bus"
