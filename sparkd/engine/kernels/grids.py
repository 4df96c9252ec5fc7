"""The codebooks of the i-quant families as small tensors in device memory, made once per device
from the gguf package's grids (the same data the CPU reference, quant_grids, decodes with).

Each is float32, entry e's values at [e * width, e * width + width): the kernels load the values
they multiply (4 at a time, vectorized) with no integer-to-float step, which offline sm_90 SASS
showed to cost more than the 4x larger table (IQ1_S, the largest, is 64 KiB; the others 4 to 16
KiB, all L2-resident). The sign table (ksigns) needs no memory: entry i is i with an even-parity
eighth bit, which the kernels compute (iq_common.ksigns).
"""

from __future__ import annotations

import functools

import torch
from gguf import quants as gq

# family.Family.grid names one of these gguf classes; the placeholder serves families without one
_PLACEHOLDER = "none"


def grid_table(name: str | None, device: torch.device | str) -> torch.Tensor:
    """The named family's codebook (float32, flat) on `device`, made on first use (make it before a
    CUDA graph capture: prepare() does); for None a one-value placeholder, so every kernel gets a
    valid float32 pointer. A cache lookup per call: the kernel wrappers call it on every launch."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one cache entry per real device
        device = torch.device("cuda", torch.cuda.current_device())
    return _table(name or _PLACEHOLDER, device)


@functools.cache
def _table(name: str, device: torch.device) -> torch.Tensor:
    if name == _PLACEHOLDER:
        return torch.zeros(1, dtype=torch.float32, device=device)
    cls = getattr(gq, name)
    cls.init_grid()
    return torch.from_numpy(cls.grid.reshape(-1).astype("float32")).to(device)
