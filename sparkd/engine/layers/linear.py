"""Linear projections: over a resident float weight (Linear), or straight from raw GGUF blocks
through the Triton kernels (KernelLinear, the GPU path)."""

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


class KernelLinear(nn.Module):
    """y = round(x) @ W.T + b with W kept as its raw GGUF blocks and multiplied by the Triton
    kernels (sparkd.engine.kernels): the GEMV for one token, the GEMM (float32, "ieee") for
    several. The blocks live where the module is moved (a CUDA device; on the CPU only under
    TRITON_INTERPRET=1, for tests)."""

    def __init__(self, raw: torch.Tensor, qtype, shape: tuple[int, int], bias: torch.Tensor | None = None,
                 act_fmt: str | None = None):
        super().__init__()
        self.register_buffer("raw", raw)  # uint8 GGUF blocks of W [out, in]
        self.qtype, self.shape = qtype, tuple(shape)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.act_fmt = act_fmt

    @property
    def out_features(self) -> int:
        return self.shape[0]

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        return round_activations(x, self.act_fmt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from sparkd.engine.kernels.matmul import GemvConfig, gemm, gemv

        lead = x.shape[:-1]
        h = x.reshape(-1, self.shape[1]).float().contiguous()
        if h.shape[0] == 1:
            # the interpreter (CPU, tests) runs programs one by one: few, wide tiles
            cfg = None if h.is_cuda else GemvConfig(block_n=64)
            # integer kernels (Q8_0, Q4_K) quantize x themselves, as round_x would
            y = gemv(self.raw, self.qtype, self.shape, h[0], config=cfg, round_x=self._round)[None]
        else:
            y = gemm(self.raw, self.qtype, self.shape, self._round(h).contiguous(), precision="ieee")
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.shape[0])
