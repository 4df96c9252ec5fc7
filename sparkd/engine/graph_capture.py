"""One CUDA graph capture as the engine's graphs make them (the whole-token decode and the draw in
cuda_graphs.py, the prompts' in prompt_graphs.py, the streamed step's per-layer segments in
streaming/graph_step.py), and Room: the free-memory rule the decode and prompt captures share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import gc

import torch

from sparkd.engine.errors import EngineError

T = TypeVar("T")
# device index -> a tiny graph (and its tensor) held for the process: see _anchor
_ANCHORS: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
# device index -> the side stream every warm-up runs on: cuBLAS keeps a workspace per stream it ran
# on for the process (~33 MiB on the H200), so a new stream a capture (torch's pool hands out up to
# 32) would leave one more each time
_SIDE: dict[int, torch.cuda.Stream] = {}


def capture(device, pool, warm: Callable[[], object], run: Callable[[], T],
            generator: torch.Generator | None = None,
            ready: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """(graph, run()'s outputs): warm() once on a side stream first, as capture wants (Triton
    compiles, lazy tables are made), then ready() where given (a check that may raise to call the
    capture off), then run() captured into a new graph in memory pool `pool` (None: its own; the
    caller keeps graph.pool() to share it), with `generator`'s state registered where given (each
    replay then draws from the generator's state at that moment)."""
    index = _index(device)
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(index)
    side = _SIDE[index]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm()
    torch.cuda.current_stream().wait_stream(side)
    if ready is not None:
        ready()
    _anchor(index)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


def _index(device) -> int:
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _anchor(index: int) -> None:
    """Keep one graph registered with the device's default CUDA generator for the process. A
    capture registers its graph there first, and torch (2.11, the H200 box's) allocates the
    generator's graph-side seed and offset when no graph is registered yet; if that allocation runs
    out of memory the graph is left half registered and freeing it aborts the process (~CUDAGraph:
    "The graph should be registered to the state", seen on the H200). With a graph always
    registered, a capture that fails can be dropped and its pool freed."""
    if index not in _ANCHORS:
        x = torch.zeros(1, device=torch.device("cuda", index))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.add_(1)
        _ANCHORS[index] = graph, x


def failure(exc: BaseException) -> str:
    """A failed capture's reason for a log line: the exception's type and first line."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def release(device) -> None:
    """After a capture that raised, outside the except block (the traceback's frames, and with them
    the partial graph's hold on its pool, are gone then): give the pool's and the warm-up's memory
    back to the device."""
    if torch.device(device).type == "cuda":
        gc.collect()  # a cycle through a frame may still hold the graph
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class NoRoom(EngineError):
    """A capture would leave less free device memory than the margin."""


class Room:
    """The free-memory rule around each graph capture (PromptForward's and StaticDecode's): warm(run) runs the
    warm-up with its peak measured; ready(), after it and before the capture, raises NoRoom where the capture
    (taken as the warm-up's peak) would leave less than margin bytes free; added(), after the capture, is what
    it added to the device's reserved memory. stage names the step a failure came from (a log's reason)."""

    def __init__(self, device, margin: int, what: str):
        if margin < 0:
            raise EngineError(f"could not use {what} margin of {margin} bytes: it must be 0 or more")
        self.device, self.margin, self._base, self._reserved = device, margin, 0, 0
        self.stage = "warm-up"  # PromptForward sets it back before each capture

    def warm(self, run: Callable[[], object]) -> object:
        self._base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return run()

    def ready(self) -> None:
        self.stage = "capture"
        torch.cuda.empty_cache()  # the warm-up's blocks back to the device: the capture's pool needs it
        free = torch.cuda.mem_get_info(self.device)[0]
        left = free - (torch.cuda.max_memory_allocated(self.device) - self._base)
        if left < self.margin:
            raise NoRoom(f"it would leave {mib(left)} of {mib(free)} free device memory, under the "
                          f"{mib(self.margin)} margin")
        self._reserved = torch.cuda.memory_reserved(self.device)

    def added(self) -> int:
        return torch.cuda.memory_reserved(self.device) - self._reserved


def mib(n: int, digits: int = 0) -> str:
    return f"{n / (1 << 20):.{digits}f} MiB"
