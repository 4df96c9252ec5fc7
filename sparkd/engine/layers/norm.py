"""RMSNorm as ggml computes it: mean of squares over the last dim, then scale by the weight."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., D]; normalise in float64 like ggml's double accumulator, then back.
        ms = x.double().pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(ms + self.eps).to(x.dtype)) * self.weight
