"""The OpenAI-compatible HTTP API over one Engine (starlette).

Requests are validated and tokenized on the event loop, then wait for the one decode slot;
every error leaves in OpenAI's shape with a message that says what to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sparkd.engine import switches
from sparkd.engine.errors import EngineError
from sparkd.engine.runtime import Engine, GenerationRequest, NoExpertCache
from sparkd.engine.sampler import SamplingParams
from sparkd.engine.server import DEFAULT_TOP_K
from sparkd.engine.server import protocol as p
from sparkd.engine.server.generation import Done, Job, chunk, final_body, run_job
from sparkd.engine.server.metrics import EngineMetrics
from sparkd.engine.server.reply import Delta
from sparkd.engine.server.slot import DecodeSlot, Ticket

VERSION = "0.1.0"
# While loading, clients are told to come back after this long.
_LOADING_RETRY_SECONDS = 5
LOAD_STREAM_ENV = "SPARKD_LOAD_STREAM"


def load_stream_default() -> bool:
    """$SPARKD_LOAD_STREAM: "1", "on" (or unset) has the load open what a streamed response opens first
    (_open_task_group); "0" or "off" leaves it to the first streamed request (before session 21)."""
    return switches.flag(LOAD_STREAM_ENV, True)


@dataclass
class ServerConfig:
    model_name: str
    api_key: str | None = None
    reasoning_budget: int | None = None
    max_queue: int = 16
    top_k: int = DEFAULT_TOP_K  # for requests that send none (serve --top-k)


@dataclass
class LoadState:
    status: str = "loading"  # loading | ready | error
    progress: float = 0.0
    error: str | None = None
    loaded_at: int = 0


class EngineServer:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine, self.config = engine, config
        self.state = LoadState()
        self.metrics = EngineMetrics(self._cache_stats, self._memory_plan, self._graph_stats, self._store_stats,
                                     self._decode_graph_stats)
        self.slot = DecodeSlot(config.max_queue, self._slot_changed)
        self.openapi = p.openapi_schema("sparkd-engine", VERSION)

    # --- loading (called from a thread by serve, or directly by tests) ---------------------------

    def load(self, progress=None) -> None:
        def report(done: int, total: int) -> None:
            self.state.progress = done / total if total else 1.0
            self.metrics.load_progress.set(self.state.progress)
            if progress is not None:
                progress(done, total)
        try:
            self.engine.load(report)
        except Exception as exc:
            self.state.status, self.state.error = "error", str(exc)
            raise
        if load_stream_default():  # what the first streamed response would import, now
            anyio.run(_open_task_group)
        self.state.progress, self.state.status, self.state.loaded_at = 1.0, "ready", int(time.time())
        self.metrics.load_progress.set(1.0)
        self.metrics.ready.set(1)

    def _graph_stats(self) -> dict | None:
        return self.engine.prompt_graph_stats() if self.engine.loaded else None

    def _decode_graph_stats(self) -> dict | None:
        return self.engine.decode_graph_stats() if self.engine.loaded else None

    def _store_stats(self) -> dict | None:
        return self.engine.prompt_store_stats() if self.engine.loaded else None

    def _cache_stats(self) -> dict | None:
        return self.engine.cache_stats() if self.engine.loaded else None

    def _memory_plan(self) -> dict:
        return self.engine.memory_plan() if self.engine.loaded else {}

    def _slot_changed(self, running: int, queued: int) -> None:
        self.metrics.running.set(running)
        self.metrics.queued.set(queued)

    # --- checks ---------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if not header or scheme.lower() != "bearer":
            raise p.ApiError(401, "could not authenticate: missing API key (send 'Authorization: Bearer <key>')",
                             type_="authentication_error", code="missing_api_key")
        if not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise p.ApiError(401, "could not authenticate: wrong API key", type_="authentication_error",
                             code="invalid_api_key")

    def _require_ready(self) -> None:
        if self.state.status == "ready":
            return
        if self.state.status == "loading":
            raise p.ApiError(503, f"could not serve the request: the model is loading "
                             f"({self.state.progress:.0%}); retry later", type_="unavailable_error",
                             code="model_loading", headers={"Retry-After": str(_LOADING_RETRY_SECONDS)})
        raise p.ApiError(503, f"could not serve the request: the model failed to load: {self.state.error}",
                         type_="unavailable_error", code="model_load_failed")

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise p.ApiError(404, f"could not find model {name!r}: this server serves "
                             f"{self.config.model_name!r} (see GET /v1/models)",
                             type_="not_found_error", param="model", code="model_not_found")

    def _build_job(self, kind: str, body: p._Sampling, prompt_ids: list[int], inside: bool, arrived: float) -> Job:
        e, n_ctx = self.engine, self.engine.n_ctx
        name, limit = body.token_limit()
        if limit is not None and limit <= 0:
            raise p.ApiError(400, f"could not use {name}={limit}: it must be at least 1", param=name,
                             code="invalid_value")
        if body.n not in (None, 1):
            raise p.ApiError(400, f"could not use n={body.n}: this server returns one choice per request",
                             param="n", code="invalid_value")
        if not prompt_ids:
            raise p.ApiError(400, "could not use an empty prompt: give at least one token", param="prompt",
                             code="invalid_value")
        if len(prompt_ids) >= n_ctx:
            raise p.ApiError(400, f"could not fit the prompt: it has {len(prompt_ids)} tokens and the context is "
                             f"{n_ctx} tokens (shorten it, or start the server with a larger --ctx)",
                             param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
        room = n_ctx - len(prompt_ids)
        sampling = SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                                  top_p=1.0 if body.top_p is None else body.top_p,
                                  top_k=self.config.top_k if body.top_k is None else body.top_k, seed=body.seed)
        req = GenerationRequest(prompt_ids=prompt_ids, max_tokens=min(limit or room, room), sampling=sampling,
                                logit_bias=self._logit_bias(body.logit_bias), think=e.think,
                                starts_in_reasoning=inside, reasoning_budget=self.config.reasoning_budget)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Job(kind, self.config.model_name, req, body.stop_list(), include_usage, arrived)

    def _logit_bias(self, bias: dict[str, float] | None) -> dict[int, float]:
        out = {}
        for key, value in (bias or {}).items():
            if not key.isdigit() or int(key) >= self.engine.cfg.n_vocab:
                raise p.ApiError(400, f"could not use logit_bias key {key!r}: expected a token id in "
                                 f"[0, {self.engine.cfg.n_vocab})", param="logit_bias", code="invalid_value")
            if not -100 <= value <= 100:
                raise p.ApiError(400, f"could not use logit_bias[{key}]={value}: it must be in [-100, 100]",
                                 param="logit_bias", code="invalid_value")
            out[int(key)] = float(value)
        return out

    # --- endpoints ------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        arrived = time.perf_counter()  # the time to first token counts the body's parsing and the template too
        self._authorize(request)
        body = p.parse_body(await request.body(), p.ChatRequest)
        self._require_ready()
        self._check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        ids, inside = await asyncio.to_thread(self.engine.chat_prompt, messages)
        return await self._respond(request, self._build_job("chat", body, ids, inside, arrived), body.stream)

    async def completions(self, request: Request) -> Response:
        arrived = time.perf_counter()  # the time to first token counts the body's parsing and the encode too
        self._authorize(request)
        body = p.parse_body(await request.body(), p.CompletionRequest)
        self._require_ready()
        self._check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            bad = [t for t in prompt if not 0 <= t < self.engine.cfg.n_vocab]
            if bad:
                raise p.ApiError(400, f"could not use prompt token ids {bad[:5]}: the vocabulary has "
                                 f"{self.engine.cfg.n_vocab} tokens", param="prompt", code="invalid_value")
            ids = list(prompt)
        else:
            if isinstance(prompt, list) and len(prompt) != 1:
                raise p.ApiError(400, f"could not use {len(prompt)} prompts: this server takes one per request",
                                 param="prompt", code="invalid_value")
            ids = await asyncio.to_thread(self.engine.text_prompt, prompt if isinstance(prompt, str) else prompt[0])
        return await self._respond(request, self._build_job("completion", body, ids, False, arrived), body.stream)

    async def _respond(self, request: Request, job: Job, stream: bool) -> Response:
        try:
            ticket = self.slot.admit()
        except p.ApiError:
            self.metrics.rejected.inc()
            raise
        if stream:
            return _EventStream(self._sse(ticket, job), lambda: self.slot.abandon(ticket))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job.cancel))
        text, done = Delta(), None
        try:
            async with contextlib.aclosing(self._events(ticket, job)) as events:
                async for event in events:
                    if isinstance(event, Done):
                        done = event
                    else:
                        text += event
        finally:
            watcher.cancel()
        return JSONResponse(final_body(job, text, done))

    def _events(self, ticket: Ticket, job: Job) -> AsyncIterator[Any]:
        return self.slot.run(ticket, lambda emit: run_job(self.engine, self.metrics, job, emit), job.cancel)

    async def _sse(self, ticket: Ticket, job: Job) -> AsyncIterator[str]:
        yield _sse(chunk(job, first=True))
        try:
            async with contextlib.aclosing(self._events(ticket, job)) as events:
                async for event in events:
                    if isinstance(event, Done):
                        yield _sse(chunk(job, finish_reason=event.finish_reason))
                        if job.include_usage:
                            yield _sse(chunk(job, usage=event.usage(), no_choices=True))
                    else:
                        yield _sse(chunk(job, event))
        except EngineError as exc:  # the stream already said 200: report in band, then end it
            yield _sse(p.ApiError(500, f"could not finish the generation: {exc}", type_="server_error").body())
        yield "data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        data = {"id": self.config.model_name, "object": "model", "created": self.state.loaded_at,
                "owned_by": "sparkd", "meta": {"n_ctx": self.engine.n_ctx, "status": self.state.status}}
        return JSONResponse({"object": "list", "data": [data]})

    async def health(self, request: Request) -> Response:
        s = self.state
        body: dict[str, Any] = {"status": s.status, "model": self.config.model_name}
        if s.status == "loading":
            body["progress"] = round(s.progress, 4)
        elif s.status == "error":
            body["error"] = s.error
        else:
            body.update(n_ctx=self.engine.n_ctx, kv_type=self.engine.kv_type, running=self.slot.running,
                        queued=self.slot.queued, memory_plan=self.engine.memory_plan())
        return JSONResponse(body, status_code=200 if s.status == "ready" else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def admin_cache(self, request: Request) -> Response:
        self._authorize(request)
        body = p.parse_body(await request.body(), p.CacheRequest)
        budget = _size_bytes(body.budget)
        self._require_ready()
        try:
            done = await asyncio.to_thread(self.engine.resize_cache, budget)
        except NoExpertCache as exc:
            raise p.ApiError(409, str(exc), type_="conflict_error", code="no_expert_cache") from None
        except EngineError as exc:  # below top-k or above what the plan allocated
            raise p.ApiError(400, str(exc), param="budget", code="invalid_budget") from None
        return JSONResponse({"budget": done["cache_bytes"], **done})

    async def admin_cache_get(self, request: Request) -> Response:
        """The cache size now, so sparkd's shrink_cache action can grow it back afterwards."""
        self._authorize(request)
        self._require_ready()
        stats = self.engine.cache_stats()
        if stats is None:
            raise p.ApiError(409, "could not read the expert cache: this engine keeps every routed expert "
                             "resident, so there is no expert cache", type_="conflict_error", code="no_expert_cache")
        return JSONResponse({"budget": stats["cache_bytes"], "cache_bytes": stats["cache_bytes"],
                             "allocated_bytes": self.engine.memory_plan()["expert_cache"]})

    async def openapi_endpoint(self, request: Request) -> Response:
        return JSONResponse(self.openapi)

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/admin/cache", self.admin_cache, methods=["POST"]),
            Route("/admin/cache", self.admin_cache_get, methods=["GET"]),
            Route("/openapi.json", self.openapi_endpoint, methods=["GET"]),
        ]
        handlers = {p.ApiError: _api_error, HTTPException: _http_error, EngineError: _engine_error,
                    Exception: _internal_error}
        return Starlette(routes=routes, exception_handlers=handlers)


class _EventStream(StreamingResponse):
    """SSE response that gives its queue place back if the client left before it started."""

    def __init__(self, body: AsyncIterator[str], abandon) -> None:
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._abandon = abandon

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._abandon()


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """The body is read already, so the next ASGI message is the client hanging up."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def _size_bytes(value: int | str) -> int:
    from sparkd.engine.cli import parse_size

    if isinstance(value, int):
        if value <= 0:
            raise p.ApiError(400, f"could not use budget={value}: it must be a positive number of bytes",
                             param="budget", code="invalid_value")
        return value
    try:
        return parse_size(value)
    except Exception as exc:
        raise p.ApiError(400, f"could not use budget={value!r}: {exc}", param="budget", code="invalid_value") from None


async def _open_task_group() -> None:
    """What a streamed response opens first (starlette's StreamingResponse: an anyio task group), in a throwaway
    loop at load: anyio imports its asyncio backend and the names behind its task group on first use, and a
    server's first streamed request paid that before its first token (H200 box, session 21: 61-88 ms of a 77-109
    ms time to first token, later requests' 12-17 ms; a CPU server 22 ms)."""
    async with anyio.create_task_group():
        pass


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _api_error(request: Request, exc: p.ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    err = p.ApiError(exc.status_code, f"could not serve {request.method} {request.url.path}: {exc.detail}",
                     code="not_found" if exc.status_code == 404 else None)
    return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)


async def _engine_error(request: Request, exc: EngineError) -> Response:
    """Engine errors raised while preparing a request (a template refusing the roles, a text
    the tokenizer cannot encode) are the request's fault."""
    return JSONResponse(p.ApiError(400, str(exc)).body(), status_code=400)


async def _internal_error(request: Request, exc: Exception) -> Response:
    err = p.ApiError(500, f"could not serve the request: internal error {type(exc).__name__}: {exc}",
                     type_="server_error")
    return JSONResponse(err.body(), status_code=500)
