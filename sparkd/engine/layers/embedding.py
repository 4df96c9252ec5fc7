"""The token embedding kept as the file's blocks on the GPU path: a lookup dequantizes the looked-up rows only
(kernels/dequantize.py, one launch, the ids read on the device: a graph replays it). Before session 35 the GPU path
held the embedding as float32: 3.7 GB for DeepSeek V3's 129280 x 7168, 4.7 GB for Kimi K3's, where their Q4_K
blocks are 0.5 and 0.66 GB; on a DGX Spark the rest is expert cache."""

from __future__ import annotations

import torch
from torch import nn


class KernelEmbedding(nn.Module):
    """rows [V, D] of raw blocks of a kernel family (GGUF layout); self[ids] -> float32 [*ids.shape, D]."""

    def __init__(self, raw: torch.Tensor, qtype, shape: tuple[int, int]):
        super().__init__()
        self.register_buffer("raw", raw)  # uint8 GGUF blocks of the [V, D] rows
        self.qtype, self.shape = qtype, tuple(shape)

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        from sparkd.engine.kernels.dequantize import dequantize

        rows = dequantize(self.raw, self.qtype, self.shape, ids.reshape(-1))
        return rows.view(*ids.shape, self.shape[1])
