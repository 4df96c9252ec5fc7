"""RMSNorm as ggml computes it: mean of squares over the last dim, then scale by the weight."""

from __future__ import annotations

import torch
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) over the last dim, without a weight (ggml_rms_norm)."""
    ms = x.double().pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., D]; normalise in float64 like ggml's double accumulator, then back.
        return rms_normalize(x, self.eps) * self.weight
