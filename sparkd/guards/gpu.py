"""GPU occupancy guard: refuse to start while other processes hold GPU memory.

The field report's freeze came from an engine starting while ollama held 36 GiB of the same
unified memory; the driver then failed allocations inside the kernel (NV_ERR_NO_MEMORY).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..policy import GuardsPolicy
from ..system.gpu import GpuProcess, GpuReader, GpuSnapshot
from ..system.procinfo import DEFAULT_PROC_ROOT, cgroup_unit
from .report import Check, Culprit

log = logging.getLogger(__name__)

# pid -> systemd unit, e.g. SystemdBus.unit_by_pid (GetUnitByPID); None when the pid has no unit.
UnitLookup = Callable[[int], Awaitable[str | None]]


async def resolve_units(pids: list[int], unit_of: UnitLookup | None,
                        proc_root: Path = DEFAULT_PROC_ROOT) -> dict[int, str | None]:
    """Each pid's unit through unit_of, falling back to its /proc/PID/cgroup path."""
    units: dict[int, str | None] = {}
    for pid in pids:
        unit = None
        if unit_of is not None:
            try:
                unit = await unit_of(pid)
            except Exception as exc:  # a D-Bus error only loses the name; the cgroup path still has it
                log.debug("Failed to look up the unit of pid %d, using its cgroup: %s", pid, exc)
        units[pid] = unit or cgroup_unit(pid, proc_root)
    return units


def _culprit(proc: GpuProcess, unit: str | None, detail: str = "") -> Culprit:
    if proc.mib_source == "rss":
        detail = ", ".join(d for d in (detail, "resident memory; NVML gave no figure") if d)
    return Culprit(proc.pid, proc.name, unit, proc.used_mib, detail)


def judge_gpu(snapshot: GpuSnapshot, guards: GuardsPolicy, units: dict[int, str | None],
              own_unit: str | None = None) -> Check:
    """The decision, from a snapshot: pure, so it is tested with literal snapshots too."""
    if not snapshot.available:
        return Check("gpu", "skipped", f"GPU guard skipped: {snapshot.reason}")
    busy, notes = [], []
    for proc in snapshot.processes:
        unit = units.get(proc.pid)
        if proc.name in guards.gpu_ignore:
            notes.append(f"ignored {proc.name} (pid {proc.pid}, {proc.used_mib} MiB) by guards.gpu_ignore")
        elif own_unit is not None and unit == own_unit:
            notes.append(f"{proc.name} (pid {proc.pid}) belongs to {own_unit} and is freed by the restart")
        else:
            busy.append(_culprit(proc, unit))
    held_mib = sum(c.mib or 0 for c in busy)
    gpus = ", ".join(f"{d.index}:{d.name}" for d in snapshot.devices) or "none"
    tail = "; ".join(notes)
    if held_mib > guards.gpu_busy_mib:
        msg = (f"{len(busy)} process(es) hold {held_mib} MiB of GPU memory, more than "
               f"guards.gpu_busy_mib={guards.gpu_busy_mib}; stop them or add their names to guards.gpu_ignore")
        return Check("gpu", "refused", msg + (f"; {tail}" if tail else ""), tuple(busy), "guards.gpu_busy_mib")
    problems = [e for d in snapshot.devices for e in d.errors]
    unknown = [c for c in busy if c.mib is None]
    if problems or unknown:
        what = problems + [f"cannot measure GPU memory of pid {c.pid} ({c.name or '?'})" for c in unknown]
        return Check("gpu", "warning", "; ".join(what), tuple(busy), "guards.gpu_busy_mib")
    msg = f"GPUs {gpus}: others hold {held_mib} MiB, at most guards.gpu_busy_mib={guards.gpu_busy_mib}"
    return Check("gpu", "ok", msg + (f"; {tail}" if tail else ""), tuple(busy), "guards.gpu_busy_mib")


async def check_gpu(guards: GuardsPolicy, reader: GpuReader, *, unit_of: UnitLookup | None = None,
                    proc_root: Path = DEFAULT_PROC_ROOT, own_unit: str | None = None) -> Check:
    """Read the GPUs (NVML blocks, so in a thread), name each process's unit, judge."""
    snapshot = await asyncio.to_thread(reader.read)
    units = await resolve_units([p.pid for p in snapshot.processes], unit_of, proc_root)
    return judge_gpu(snapshot, guards, units, own_unit)
