"""Tickets for the "last program folds" pattern: a kernel's programs each take a ticket from an
int32 counter by an acq_rel atomic after storing their partial results; the one that draws the
last number adds the partials in a fixed order (the same bits every run, no atomic sums) and
resets the counter to zero for the next launch. The counters stay allocated, zero between
launches, so a CUDA graph replays the kernel without a zeroing launch."""

from __future__ import annotations

import torch

from sparkd.engine.kernels.family import KernelArgumentError

_BUFFERS: dict[tuple[torch.device, str], torch.Tensor] = {}


def tickets(device: torch.device, count: int, owner: str) -> torch.Tensor:
    """count zeroed int32 counters on device for `owner`'s kernel (its own, so kernels of two
    owners never share one). One kernel at a time per owner: launches on one stream."""
    t = _BUFFERS.get((device, owner))
    if t is None or t.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelArgumentError(f"could not run {owner}: its {count} fold tickets on {device} are first "
                                      f"needed inside a CUDA graph capture; run the step once before capturing")
        t = _BUFFERS[(device, owner)] = torch.zeros(max(count, 1024), dtype=torch.int32, device=device)
    return t
