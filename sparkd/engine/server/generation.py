"""One request's generation: the work run in the decode thread (tokens → reply deltas, with
timings into the metrics), and the OpenAI response bodies and stream chunks built from it."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sparkd.engine.chat import ANSWER_TAGS
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.server.metrics import EngineMetrics
from sparkd.engine.server.reply import Delta, ReplyBuilder
from sparkd.engine.server.slot import Emit
from sparkd.engine.think import find_think_tags


@dataclass
class Done:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    saw_reasoning: bool = False
    cached_tokens: int = 0  # prompt tokens the prompt cache held (not computed)

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass
class Job:
    kind: str  # "chat" | "completion"
    model: str
    request: GenerationRequest
    stop: list[str]
    include_usage: bool
    arrived: float = field(default_factory=time.perf_counter)  # the request's arrival (app: before its parsing)
    cancel: threading.Event = field(default_factory=threading.Event)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def split_reasoning(self) -> bool:
        return self.kind == "chat"


def run_job(engine: Engine, metrics: EngineMetrics, job: Job, emit: Emit) -> None:
    """In the decode thread: emit Delta objects, then one Done."""
    req = job.request
    split = job.split_reasoning and req.think is not None
    # a tiny lookup (a few short encodes) per request: the engine keeps only the think tags
    answer = find_think_tags(engine.tokenizer, ANSWER_TAGS) if split else None
    builder = ReplyBuilder(engine.tokenizer, job.stop, req.think if split else None,
                           req.starts_in_reasoning and split, answer)
    started = time.perf_counter()
    first = last = None
    tokens = engine.generate(req, job.cancel)
    try:
        for token in tokens:
            now = time.perf_counter()
            if first is None:
                first = now
                metrics.ttft.observe(now - job.arrived)
            else:
                metrics.itl.observe(now - last)
            last = now
            delta = builder.push(token)
            if delta:
                emit(delta)
            if builder.done:
                break
    finally:
        tokens.close()
    tail = builder.finish(cancelled=job.cancel.is_set())
    if tail:
        emit(tail)
    _account(metrics, len(req.prompt_ids), req.cached_tokens, builder.completion_tokens, started, first, last)
    metrics.requests.labels(builder.finish_reason).inc()
    emit(Done(builder.finish_reason, len(req.prompt_ids), builder.completion_tokens, builder.saw_reasoning,
              req.cached_tokens))


def _account(metrics: EngineMetrics, n_prompt: int, n_cached: int, n_out: int, started: float,
             first: float | None, last: float | None) -> None:
    metrics.prompt_tokens.inc(n_prompt - n_cached)
    metrics.prompt_cached_tokens.inc(n_cached)
    metrics.generated_tokens.inc(n_out)
    if first is not None:
        metrics.prompt_seconds.inc(first - started)
        metrics.decode_seconds.inc(last - first)
        if n_out > 1 and last > first:
            metrics.decode_rate.set((n_out - 1) / (last - first))


# --- response bodies ----------------------------------------------------------------------------

def final_body(job: Job, text: Delta, done: Done) -> dict[str, Any]:
    if job.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text.content}
        if done.saw_reasoning:
            message["reasoning_content"] = text.reasoning
        choice = {"index": 0, "message": message, "finish_reason": done.finish_reason, "logprobs": None}
        obj, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = {"index": 0, "text": text.content, "finish_reason": done.finish_reason, "logprobs": None}
        obj, prefix = "text_completion", "cmpl-"
    return {"id": prefix + job.id, "object": obj, "created": job.created, "model": job.model,
            "choices": [choice], "usage": done.usage()}


def chunk(job: Job, delta: Delta | None = None, finish_reason: str | None = None, first: bool = False,
          usage: dict | None = None, no_choices: bool = False) -> dict[str, Any]:
    if job.kind == "chat":
        d: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if delta is not None:
            if delta.reasoning:
                d["reasoning_content"] = delta.reasoning
            if delta.content:
                d["content"] = delta.content
        choice = {"index": 0, "delta": d, "finish_reason": finish_reason, "logprobs": None}
        obj, prefix = "chat.completion.chunk", "chatcmpl-"
    else:
        choice = {"index": 0, "text": delta.content if delta else "", "finish_reason": finish_reason,
                  "logprobs": None}
        obj, prefix = "text_completion", "cmpl-"
    body = {"id": prefix + job.id, "object": obj, "created": job.created, "model": job.model,
            "choices": [] if no_choices else [choice]}
    if job.include_usage:
        body["usage"] = usage
    return body
