"""TEMPORARY (srv48, session 21; removed after the box call): $SPARKD_TRACE_FIRST=1 prints perf_counter spans
of each request's way to its first token and of the load's first runs to stderr."""

from __future__ import annotations

import os
import sys
import time

ON = os.environ.get("SPARKD_TRACE_FIRST") == "1"
_marks: list[tuple[str, float]] = []
_count = [0]


def start() -> None:
    if ON:
        _marks.clear()
        _marks.append(("arrival", time.perf_counter()))


def mark(name: str, sync: bool = False) -> None:
    if ON:
        if sync:
            import torch
            torch.cuda.synchronize()
        _marks.append((name, time.perf_counter()))


def done() -> None:
    """The first token: one line with each span (ms since the mark before it)."""
    if ON and _marks:
        mark("first")
        _count[0] += 1
        spans = " ".join(f"{b[0]} {1e3 * (b[1] - a[1]):.2f}" for a, b in zip(_marks, _marks[1:]))
        say(f"request {_count[0]}: {spans}; ttft {1e3 * (_marks[-1][1] - _marks[0][1]):.2f} ms")
        _marks.clear()


def timed(label: str, run):
    """run() with the device synced before and after, its time printed."""
    if not ON:
        return run()
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = run()
    torch.cuda.synchronize()
    say(f"{label} {1e3 * (time.perf_counter() - t0):.2f} ms")
    return out


def say(text: str) -> None:
    print(f"sparkd-trace: {text}", file=sys.stderr, flush=True)
