"""The codebooks of the i-quant families as small tensors in device memory, made once per device
from the gguf package's grids (the same data the CPU reference, quant_grids, decodes with).

Each is float32, entry e's values at [e * width, e * width + width): the kernels load the values
they multiply (4 at a time, vectorized) with no integer-to-float step, which offline sm_90 SASS
showed to cost more than the 4x larger table (IQ1_S, the largest, is 64 KiB; the others 4 to 16
KiB, all L2-resident). The sign table (ksigns) needs no memory: entry i is i with an even-parity
eighth bit, which the kernels compute (iq_common.ksigns).

The integer steps (Family.idot) multiply the codebook's values as int8 with dp4a instead: grid_words
is the same codebook as int8 bytes (every entry fits: 0 to 62, IQ1_S -1 to 1) packed little-endian
into int32 words, entry e's values at bytes [e * width, e * width + width), so an entry of 8 values
is two words and one of 4 values one.
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
    return _table(name or _PLACEHOLDER, _real(device))


def grid_words(name: str | None, device: torch.device | str) -> torch.Tensor:
    """grid_table's codebook for the integer steps: int8 values packed 4 to an int32 word (flat), made
    and cached the same way; for None a one-word placeholder."""
    return _table(name or _PLACEHOLDER, _real(device), torch.int32)


def _real(device: torch.device | str) -> torch.device:
    """device, "cuda" made the current device's index: one cache entry per real device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@functools.cache
def _table(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if name == _PLACEHOLDER:
        return torch.zeros(1, dtype=dtype, device=device)
    cls = getattr(gq, name)
    cls.init_grid()
    values = cls.grid.reshape(-1)
    if dtype == torch.int32:  # int8 bytes viewed as words (every codebook's size is a multiple of 4)
        return torch.from_numpy(values.astype("int8")).view(torch.int32).to(device)
    return torch.from_numpy(values.astype("float32")).to(device)
