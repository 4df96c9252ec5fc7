"""GET /metrics over TCP on daemon.metrics_listen (default 127.0.0.1:9464), in the daemon's loop.

Each scrape first asks the placement backend for every service's state (in the loop: the systemd
backend talks D-Bus there), then renders the registry in a worker thread so slow NVML or file
reads never stall the control socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import SparkdError
from ..logfmt import log_event
from ..system.gpu import GpuReader
from ..usage import find_cgroup2_mount
from .collector import SparkdCollector
from .counters import SparkdCounters
from .source import SupervisorSource

log = logging.getLogger("sparkd.metrics")
LISTEN_KEY = "daemon.metrics_listen"


class MetricsError(SparkdError):
    """The metrics endpoint cannot be configured or bound."""


def parse_listen(value: str) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464', ':9464' (all addresses) -> (host, port); port 0 picks a free one."""
    host, sep, port_text = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise MetricsError(f"could not parse {LISTEN_KEY} {value!r}: expected HOST:PORT such as 127.0.0.1:9464")
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise MetricsError(f"could not parse {LISTEN_KEY} {value!r}: {host!r} is not an IP address "
                               "(use an address, not a host name, so the bind does not depend on DNS)") from None
    return host or "0.0.0.0", int(port_text)


def bind_listen(value: str) -> socket.socket:
    host, port = parse_listen(value)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MetricsError(f"could not listen for metrics on {value} ({LISTEN_KEY}): {exc.strerror or exc}; "
                           "pick a free port or stop what holds it") from exc
    return sock


def create_app(registry: CollectorRegistry, source: SupervisorSource, counters: SparkdCounters) -> Starlette:
    async def metrics(request: Request) -> Response:
        try:
            await source.refresh()
        except SparkdError as exc:  # serve the last known states rather than nothing
            counters.scrape_error("placement")
            log_event(log, "metrics_source_failed", logging.WARNING, source="placement", error=exc)
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield  # sparkd's own loop owns SIGTERM/SIGINT


class MetricsServer:
    def __init__(self, listen: str, registry: CollectorRegistry, source: SupervisorSource, counters: SparkdCounters):
        self.listen = listen
        config = uvicorn.Config(create_app(registry, source, counters), log_config=None, access_log=False,
                                lifespan="off")
        self._server = _Server(config)
        self._task: asyncio.Task | None = None
        self.port: int | None = None

    async def start(self) -> None:
        sock = bind_listen(self.listen)
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise MetricsError(f"could not serve metrics on {self.listen}: the server exited")
            await asyncio.sleep(0.01)
        log_event(log, "metrics_listening", listen=self.listen, port=self.port)

    async def close(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await self._task


def supervisor_metrics(supervisor: Any, listen: str, *, gpu_reader: GpuReader | None = None,
                       cgroup2_mount: Path | None = None) -> MetricsServer:
    """The daemon's metrics endpoint over a running Supervisor (its policy, state, backend, counters)."""
    mount = cgroup2_mount if cgroup2_mount is not None else find_cgroup2_mount()
    source = SupervisorSource(supervisor, mount)
    registry = CollectorRegistry()
    registry.register(SparkdCollector(source, supervisor.counters, gpu_reader=(gpu_reader or GpuReader()).read,
                                      reserve_bytes=supervisor.policy.guards.reserve,
                                      started_at=supervisor.started_at))
    return MetricsServer(listen, registry, source, supervisor.counters)
