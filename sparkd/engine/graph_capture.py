"""One CUDA graph capture as the engine's graphs make them (the whole-token decode and the draw in
cuda_graphs.py, the streamed step's per-layer segments in streaming/graph_step.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def capture(device, pool, warm: Callable[[], object], run: Callable[[], T],
            generator: torch.Generator | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """(graph, run()'s outputs): warm() once on a side stream first, as capture wants (Triton
    compiles, lazy tables are made), then run() captured into a new graph in memory pool `pool`
    (None: its own; the caller keeps graph.pool() to share it), with `generator`'s state
    registered where given (each replay then draws from the generator's state at that moment)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out
