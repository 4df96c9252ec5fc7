"""The control socket: HTTP/JSON on a unix socket (mode 0660, root and daemon.socket_group).

Endpoints: GET /v1/status, POST /v1/services/{name}/start, POST /v1/services/{name}/stop,
GET /v1/preflight[?service=NAME], GET /v1/events[?after=SEQ&since=UNIXTIME&limit=N&wait=SECONDS]
(wait: long-poll until an event newer than after exists), POST /v1/clear[?service=NAME] (lift the
start holds of the watchers). Errors are {"error": {"type", "message", ...}} with an HTTP
status: 404 unknown service, 409 refused by the guards, 500 failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import stat
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .errors import ControlError, GuardRefusal, SparkdError
from .logfmt import log_event
from .supervisor import Supervisor, UnknownService

log = logging.getLogger("sparkd.control")
SOCKET_MODE = 0o660
# A long-poll for events answers at least this often, so a client notices a dead sparkd.
MAX_EVENTS_WAIT_SECONDS = 30.0


def _error(exc: SparkdError) -> JSONResponse:
    body: dict = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, UnknownService):
        code = 404
    elif isinstance(exc, GuardRefusal):
        code = 409
        body["culprits"] = exc.culprits
    else:
        code = 500
    return JSONResponse({"error": body}, status_code=code)


def _no_watchers() -> JSONResponse:
    body = {"type": "ControlError", "message": "could not answer: this sparkd runs without watchers"}
    return JSONResponse({"error": body}, status_code=503)


def create_app(supervisor: Supervisor) -> Starlette:
    async def call(request: Request, coro_fn, *args) -> JSONResponse:
        try:
            return JSONResponse(await coro_fn(*args))
        except SparkdError as exc:
            log_event(log, "request_failed", logging.WARNING, path=request.url.path, error=exc)
            return _error(exc)

    async def status(request: Request) -> JSONResponse:
        return await call(request, supervisor.status)

    async def start(request: Request) -> JSONResponse:
        return await call(request, supervisor.start, request.path_params["name"])

    async def stop(request: Request) -> JSONResponse:
        return await call(request, supervisor.stop, request.path_params["name"])

    async def preflight(request: Request) -> JSONResponse:
        return await call(request, supervisor.preflight, request.query_params.get("service"))

    async def events(request: Request) -> JSONResponse:
        try:
            q = request.query_params
            after = int(q.get("after", 0))
            since = float(q["since"]) if "since" in q else None
            limit = int(q.get("limit", 1000))
            wait_seconds = min(float(q.get("wait", 0)), MAX_EVENTS_WAIT_SECONDS)
        except ValueError as exc:
            body = {"type": "ControlError", "message": f"could not read the events query: {exc}"}
            return JSONResponse({"error": body}, status_code=400)
        if supervisor.watchers is None:
            return _no_watchers()
        log_ = supervisor.watchers.events
        if wait_seconds > 0:
            await log_.wait(after, wait_seconds)
        found = await asyncio.to_thread(log_.read, since=since, after_seq=after, limit=limit)
        return JSONResponse({"events": found, "last_seq": log_.last_seq})

    async def clear(request: Request) -> JSONResponse:
        if supervisor.watchers is None:
            return _no_watchers()
        service = request.query_params.get("service")
        removed = supervisor.watchers.holds.clear(service)
        supervisor.watchers.events.append("warning", type="cleared_holds", service=service,
                                          result=f"start holds lifted: {', '.join(removed) or 'none'}")
        return JSONResponse({"cleared": removed, "message": f"start holds lifted: {', '.join(removed) or 'none were set'}"})

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log_event(log, "request_crashed", logging.ERROR, path=request.url.path, error=repr(exc))
        body = {"type": "InternalError", "message": f"could not handle {request.url.path}: {exc!r}; see the sparkd log"}
        return JSONResponse({"error": body}, status_code=500)

    routes = [
        Route("/v1/status", status, methods=["GET"]),
        Route("/v1/services/{name}/start", start, methods=["POST"]),
        Route("/v1/services/{name}/stop", stop, methods=["POST"]),
        Route("/v1/preflight", preflight, methods=["GET"]),
        Route("/v1/events", events, methods=["GET"]),
        Route("/v1/clear", clear, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={Exception: unexpected})


def _group_id(socket_group: str | None) -> int | None:
    if socket_group is None:
        return None
    try:
        return grp.getgrnam(socket_group).gr_gid
    except KeyError:
        raise ControlError(
            f"could not set the control socket's group: group {socket_group!r} (daemon.socket_group) does not exist; "
            f"create it (groupadd {socket_group}) or change the policy"
        ) from None


def _clear_stale(path: Path) -> None:
    """Remove a socket left by a killed sparkd; refuse when another sparkd still answers on it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError(f"could not create control socket {path}: the path exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise ControlError(f"could not create control socket {path}: another sparkd is listening on it")


def bind_control_socket(path: Path, socket_group: str | None) -> socket.socket:
    """A listening-ready unix socket at path, mode 0660, group socket_group; never briefly wider."""
    gid = _group_id(socket_group)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        _clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600: nobody else can connect before chown/chmod
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        raise ControlError(f"could not create control socket {path}: {exc.strerror or exc}") from exc
    return sock


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # sparkd's own loop owns SIGTERM/SIGINT (engines keep running, sd_notify STOPPING=1).
        yield


class ControlServer:
    def __init__(self, supervisor: Supervisor, socket_path: Path, socket_group: str | None = None):
        self.socket_path = Path(socket_path)
        self._socket_group = socket_group
        config = uvicorn.Config(create_app(supervisor), log_config=None, access_log=False, lifespan="off")
        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        sock = bind_control_socket(self.socket_path, self._socket_group)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise ControlError(f"could not serve control socket {self.socket_path}: the server exited")
            await asyncio.sleep(0.01)
        log_event(log, "listening", socket=self.socket_path, mode=oct(SOCKET_MODE), group=self._socket_group or "root")

    async def close(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await self._task
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
