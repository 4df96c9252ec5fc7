"""The codebooks of the i-quant families as small tensors in device memory, made once per device
from the gguf package's grids (the same data the CPU reference, quant_grids, decodes with).

Each is int8, entry e's values at [e * width, e * width + width): every grid value is a small
integer (IQ1_S -1/0/1, IQ2 8/25/43, IQ3_XXS 4..62), so a byte holds it exactly and the tables stay
in L1/L2 (IQ1_S, the largest, is 16 KiB). The sign table (ksigns) needs no memory: entry i is i
with an even-parity eighth bit, which the kernels compute (iq_common.ksigns).
"""

from __future__ import annotations

import functools

import torch
from gguf import quants as gq

# family.Family.grid names one of these gguf classes; the placeholder serves families without one
_PLACEHOLDER = "none"


def grid_table(name: str | None, device: torch.device | str) -> torch.Tensor:
    """The named family's codebook (int8, flat) on `device`, made on first use (make it before a
    CUDA graph capture: prepare() does); for None a one-byte placeholder, so every kernel gets a
    valid pointer. A cache lookup per call: the kernel wrappers call it on every launch."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one cache entry per real device
        device = torch.device("cuda", torch.cuda.current_device())
    return _table(name or _PLACEHOLDER, device)


@functools.cache
def _table(name: str, device: torch.device) -> torch.Tensor:
    if name == _PLACEHOLDER:
        return torch.zeros(1, dtype=torch.int8, device=device)
    cls = getattr(gq, name)
    cls.init_grid()
    values = torch.from_numpy(cls.grid.reshape(-1).copy())
    if not torch.equal(values, values.round()) or values.abs().max() > 127:
        raise ValueError(f"could not store the {name} grid as int8: it has values outside -127..127 "
                         f"or fractions (gguf changed its tables)")
    return values.to(torch.int8).to(device)

