"""Competitors guard: evict (or refuse to start beside) what the policy names in guards.competitors.

A unit is stopped through the unit manager (systemd over D-Bus), never SIGKILLed: a killed ollama
runner keeps its GPU memory. A bare process gets SIGTERM and term_timeout to exit; SIGKILL only
when kill_after_timeout says so. Every eviction is reported as a culprit with what was done.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Protocol

import psutil

from ..policy import Competitor, GuardsPolicy
from .report import Check, Culprit

# After SIGKILL the kernel frees a process at once unless it is stuck in the driver; this bounds
# the wait for that case so a stuck process is reported instead of hanging the start.
KILL_WAIT_SECONDS = 5.0


class UnitManager(Protocol):
    """What the guard needs from systemd (sparkd.system.systemd_bus.SystemdBus provides it)."""

    async def unit_active(self, unit: str) -> bool: ...

    async def stop_and_disable(self, unit: str) -> None: ...

    async def stop_unit(self, unit: str) -> None: ...


def find_processes(name: str, exclude_pids: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Processes whose name (comm, completed from argv[0] when truncated) is exactly name."""
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == name and proc.pid not in exclude_pids:
            found.append(proc)
    return found


async def handle_unit(index: int, comp: Competitor, manager: UnitManager | None, no_manager_reason: str,
                      dry_run: bool) -> Check:
    unit, key = comp.unit, f"guards.competitors[{index}].action"
    name = f"competitor[{unit}]"
    if comp.action == "ignore":
        return Check(name, "ok", f"{unit} ignored by policy", (), key)
    if manager is None:
        return Check(name, "skipped", f"could not check {unit}: {no_manager_reason or 'no systemd unit manager'}", (), key)
    try:
        active = await manager.unit_active(unit)
    except Exception as exc:
        return Check(name, "warning", f"could not check whether {unit} is active: {exc}", (), key)
    if not active:
        return Check(name, "ok", f"{unit} is not active", (), key)
    culprit = Culprit(None, unit, unit)
    if comp.action == "refuse":
        return Check(name, "refused", f"{unit} is active and the policy refuses to start beside it", (culprit,), key)
    verb = "stop and disable" if comp.action == "stop_and_disable" else "stop"
    if dry_run:
        return Check(name, "warning", f"{unit} is active: a start would {verb} it", (culprit,), key)
    try:
        if comp.action == "stop_and_disable":
            await manager.stop_and_disable(unit)
        else:
            await manager.stop_unit(unit)
    except Exception as exc:
        return Check(name, "refused", f"could not {verb} {unit}: {exc}", (culprit,), key)
    done = "stopped and disabled" if comp.action == "stop_and_disable" else "stopped"
    return Check(name, "ok", f"{unit} was active: {done}", (Culprit(None, unit, unit, None, done),), key)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _signal_and_wait(procs: list[psutil.Process], sig: int, timeout_seconds: float) -> tuple[list, list[str]]:
    """Send sig to each, wait up to timeout_seconds; (survivors, errors)."""
    errors = []
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            errors.append(f"could not send {signal.Signals(sig).name} to pid {proc.pid}: permission denied")
    await asyncio.to_thread(psutil.wait_procs, procs, timeout_seconds)
    return [p for p in procs if _alive(p)], errors


async def handle_process(index: int, comp: Competitor, dry_run: bool, gpu_mib_by_pid: dict[int, int | None]) -> Check:
    base = f"guards.competitors[{index}]"
    name, key = f"competitor[{comp.process}]", f"{base}.action"
    procs = await asyncio.to_thread(find_processes, comp.process, frozenset({os.getpid()}))
    if not procs:
        return Check(name, "ok", f"no process named {comp.process}", (), key)

    def culprits(detail: str, only=None) -> tuple[Culprit, ...]:
        chosen = procs if only is None else only
        return tuple(Culprit(p.pid, comp.process, None, gpu_mib_by_pid.get(p.pid), detail) for p in chosen)

    pids = ", ".join(str(p.pid) for p in procs)
    if comp.action == "ignore":
        return Check(name, "ok", f"{comp.process} (pid {pids}) ignored by policy", culprits("ignored"), key)
    if comp.action == "refuse":
        return Check(name, "refused", f"{comp.process} (pid {pids}) is running and the policy refuses to start beside it",
                     culprits("running"), key)
    if dry_run:
        return Check(name, "warning", f"{comp.process} (pid {pids}) is running: a start would send it SIGTERM",
                     culprits("running"), key)
    return await _evict(name, base, comp, procs, culprits)


async def _evict(name: str, base: str, comp: Competitor, procs: list[psutil.Process], culprits) -> Check:
    survivors, errors = await _signal_and_wait(procs, signal.SIGTERM, comp.term_timeout)
    if errors:
        return Check(name, "refused", "; ".join(errors), culprits("SIGTERM refused"), f"{base}.action")
    if not survivors:
        return Check(name, "ok", f"sent SIGTERM to {comp.process}: all exited", culprits("SIGTERM, exited"), f"{base}.action")
    left = ", ".join(str(p.pid) for p in survivors)
    if not comp.kill_after_timeout:
        return Check(name, "refused",
                     f"{comp.process} (pid {left}) still running {comp.term_timeout:g} s after SIGTERM and "
                     f"{base}.kill_after_timeout is false (a killed GPU process may keep its memory)",
                     culprits("survived SIGTERM", survivors), f"{base}.kill_after_timeout")
    survivors, errors = await _signal_and_wait(survivors, signal.SIGKILL, KILL_WAIT_SECONDS)
    if survivors or errors:
        left = ", ".join(str(p.pid) for p in survivors)
        why = "; ".join(errors) or f"pid {left} still present {KILL_WAIT_SECONDS:g} s after SIGKILL"
        return Check(name, "refused", f"could not evict {comp.process}: {why}", culprits("survived SIGKILL", survivors),
                     f"{base}.kill_after_timeout")
    return Check(name, "ok", f"{comp.process} ignored SIGTERM for {comp.term_timeout:g} s: sent SIGKILL, all exited",
                 culprits("SIGTERM ignored, SIGKILL, exited"), f"{base}.kill_after_timeout")


async def check_competitors(guards: GuardsPolicy, *, unit_manager: UnitManager | None = None,
                            no_unit_manager_reason: str = "", dry_run: bool = False,
                            gpu_mib_by_pid: dict[int, int | None] | None = None) -> list[Check]:
    """One Check per entry of guards.competitors, in policy order (evictions happen in that order)."""
    checks = []
    for index, comp in enumerate(guards.competitors):
        if comp.unit is not None:
            checks.append(await handle_unit(index, comp, unit_manager, no_unit_manager_reason, dry_run))
        else:
            checks.append(await handle_process(index, comp, dry_run, gpu_mib_by_pid or {}))
    return checks
