"""The sparkd main loop: pick a backend, adopt and autostart, serve the control socket, tell
systemd (sd_notify), and on SIGTERM/SIGINT leave engines running unless the policy says otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from pathlib import Path

from .control import ControlServer
from .guard_wiring import guard_context
from .logfmt import log_event
from .metrics.server import MetricsError, MetricsServer, parse_listen, supervisor_metrics
from .notify import Notifier
from .placement import PID1_COMM, select_placement
from .placement.base import ServiceStatus
from .policy import Policy
from .state import StateStore
from .supervisor import PreflightFn, Supervisor
from .watch import EventLog, Holds, SupervisorControl, WatchManager

log = logging.getLogger("sparkd")


def _ready_status(supervisor: Supervisor) -> str:
    running = sum(1 for r in supervisor.state.services.values() if r.running)
    enforced = "enforced" if supervisor.placement.memory_enforced else "NOT enforced"
    return f"{running} service(s) running; placement {supervisor.placement.name}; memory limits {enforced}"


async def _wait_for_signal() -> int:
    loop = asyncio.get_running_loop()
    received: asyncio.Future[int] = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _start_metrics(supervisor: Supervisor, listen: str) -> MetricsServer | None:
    """The /metrics endpoint; an empty daemon.metrics_listen turns it off. A busy port is logged and
    metrics stay off: guarding the engines matters more than exporting numbers about them."""
    if not listen:
        log_event(log, "metrics_off", reason="daemon.metrics_listen is empty")
        return None
    server = supervisor_metrics(supervisor, listen)
    try:
        await server.start()
    except MetricsError as exc:
        log_event(log, "metrics_off", logging.ERROR, error=exc)
        return None
    return server


def build_watchers(policy: Policy, supervisor: Supervisor, guard_ctx) -> WatchManager:
    state_dir = policy.daemon.state_dir
    events = EventLog(state_dir, max_bytes=policy.events.max_bytes, keep=policy.events.keep)
    return WatchManager(policy, SupervisorControl(supervisor, guard_ctx), events, Holds(state_dir), state_dir=state_dir)


async def run_daemon(
    policy: Policy,
    *,
    preflight: PreflightFn,
    notifier: Notifier,
    pid1_comm_path: Path = PID1_COMM,
    bus_address: str | None = None,
) -> None:
    supervisor: Supervisor | None = None
    if policy.daemon.metrics_listen:
        parse_listen(policy.daemon.metrics_listen)  # a malformed value is a policy error: fail before placing anything

    def relay(status: ServiceStatus) -> None:
        if supervisor is not None:
            supervisor.on_change(status)

    placement, reason = await select_placement(
        policy.daemon, on_change=relay, pid1_comm_path=pid1_comm_path, bus_address=bus_address
    )
    log_event(log, "placement", backend=placement.name, reason=reason, memory_enforced=placement.memory_enforced,
              why_not_enforced=placement.why_not_enforced or None)
    try:
        ctx = guard_context(placement)
        guarded = functools.partial(preflight, ctx=ctx)
        supervisor = Supervisor(policy, placement, guarded, StateStore(policy.daemon.state_dir), placement_reason=reason,
                                engine_executable=policy.daemon.engine_executable)
        supervisor.watchers = build_watchers(policy, supervisor, ctx)
        await supervisor.watchers.start()
        await supervisor.open()
        control = ControlServer(supervisor, policy.daemon.control_socket, policy.daemon.socket_group)
        await control.start()
        metrics = await _start_metrics(supervisor, policy.daemon.metrics_listen)
        try:
            notifier.ready(_ready_status(supervisor))
            log_event(log, "ready", status=_ready_status(supervisor))
            watchdog = asyncio.create_task(notifier.watchdog_loop())
            sig = await _wait_for_signal()
            log_event(log, "signal", signal=signal.Signals(sig).name)
            notifier.stopping()
            watchdog.cancel()
            await supervisor.shutdown()
        finally:
            if metrics is not None:
                await metrics.close()
            await control.close()
    finally:
        if supervisor is not None and supervisor.watchers is not None:
            await supervisor.watchers.close()
        await placement.close()
    log_event(log, "exited")
