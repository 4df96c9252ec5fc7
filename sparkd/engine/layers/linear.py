"""Linear projection over a resident weight; the place a quantized kernel will slot in later."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparkd.engine.layers.act_round import round_activations


class Linear(nn.Module):
    """y = round(x) @ W.T + b, with x rounded as llama.cpp's matmul for W's file type does
    (act_fmt, see act_round; None keeps f32 activations)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 act_fmt: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.act_fmt = act_fmt

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(round_activations(x, self.act_fmt), self.weight, self.bias)
