"""preflight: every start guard in order, combined into one PreflightReport.

Order matters: competitors are evicted first (they free GPU and system memory), then the GPU is
read again, then headroom is measured on what is left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SparkdError
from ..placement.base import unit_name
from ..policy import Policy
from ..system.gpu import GpuReader
from ..system.meminfo import DEFAULT_MEMINFO_PATH, read_meminfo
from ..system.procinfo import DEFAULT_PROC_ROOT
from .cgroup import DEFAULT_MOUNTINFO_PATH, check_cgroup
from .competitors import UnitManager, check_competitors
from .gpu import UnitLookup, check_gpu
from .headroom import check_headroom, check_swap
from .report import Check, PreflightReport


@dataclass
class GuardContext:
    """The machine the guards look at: OS paths and the injected systemd / NVML objects."""

    proc_root: Path = DEFAULT_PROC_ROOT
    meminfo_path: Path = DEFAULT_MEMINFO_PATH
    mountinfo_path: Path = DEFAULT_MOUNTINFO_PATH
    nvml: Any = None  # None: the real pynvml
    unit_manager: UnitManager | None = None  # None: unit competitors are skipped with the reason below
    no_unit_manager_reason: str = "no systemd unit manager (PID 1 is not systemd or the bus did not answer)"
    unit_of: UnitLookup | None = None  # pid -> unit over D-Bus; None: /proc/PID/cgroup only


async def preflight(policy: Policy, service_name: str | None, ctx: GuardContext | None = None, *,
                    dry_run: bool = False, freed_by_restart_bytes: int = 0) -> PreflightReport:
    """Run the guards for one service (or every service when None). dry_run reports what an
    eviction would do without doing it (sparkctl preflight); a start runs with dry_run False."""
    ctx = ctx or GuardContext()
    if service_name is not None and service_name not in policy.services:
        known = ", ".join(sorted(policy.services)) or "none"
        raise SparkdError(f"could not run preflight for service {service_name!r}: not in the policy (services: {known})")
    reader = GpuReader(ctx.nvml, proc_root=ctx.proc_root, meminfo_path=ctx.meminfo_path)
    report = PreflightReport(service_name)
    before = await asyncio.to_thread(reader.read)
    mib_by_pid = {p.pid: p.used_mib for p in before.processes}
    report.checks += await check_competitors(policy.guards, unit_manager=ctx.unit_manager,
                                             no_unit_manager_reason=ctx.no_unit_manager_reason,
                                             dry_run=dry_run, gpu_mib_by_pid=mib_by_pid)
    own_unit = unit_name(service_name) if service_name else None
    report.checks.append(await check_gpu(policy.guards, reader, unit_of=ctx.unit_of,
                                         proc_root=ctx.proc_root, own_unit=own_unit))
    report.checks.append(check_cgroup(ctx.mountinfo_path, service_name))
    report.checks += _memory_checks(policy, service_name, ctx, freed_by_restart_bytes)
    return report


def _memory_checks(policy: Policy, service_name: str | None, ctx: GuardContext, freed_bytes: int) -> list[Check]:
    names = [service_name] if service_name else sorted(policy.services)
    if not names:
        return []
    try:
        mem = read_meminfo(ctx.meminfo_path)
    except SparkdError as exc:
        return [Check("headroom", "refused", str(exc))]
    checks = []
    for name in names:
        service = policy.services[name]
        checks.append(check_headroom(name, service, policy.guards, mem, freed_bytes if service_name else 0))
        checks.append(check_swap(name, service, mem))
    return checks
