"""RMSNorm and LayerNorm as ggml computes them (double accumulators), then the weight (and bias)."""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.kernels import fused


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) over the last dim, without a weight (ggml_rms_norm): the fused RMSNorm kernel with
    a weight of ones where it runs (DeepSeek V4's hyper-connections and query heads: one launch, not eight)."""
    if fused.active("rms_norm", x) and x.dtype == torch.float32:
        from sparkd.engine.kernels.rms_norm import rms_norm

        return rms_norm(x, _ones(x.shape[-1], x.device), eps)
    return rms_normalize_torch(x, eps)


def rms_normalize_torch(x: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_normalize in torch (the reference), the mean of squares in float64 as ggml's accumulator."""
    ms = x.double().pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype)


_ONES: dict[tuple[torch.device, int], torch.Tensor] = {}  # (device, width) -> ones, made on the first (eager) call


def _ones(n: int, device: torch.device) -> torch.Tensor:
    key = (torch.device(device), n)
    if key not in _ONES:
        _ONES[key] = torch.ones(n, device=device)
    return _ONES[key]


class RMSNorm(nn.Module):
    """quant_fmt: the int8 block format (act_quant's) of the integer GEMV that reads this norm's
    output next (set by link_norm_quant); where the fused norm_quant kernel runs, a one-row
    output then carries its QuantX for that GEMV (act_quant.attach)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.quant_fmt: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., D]; normalise in float64 like ggml's double accumulator, then back.
        if self.quant_on(x):
            from sparkd.engine.kernels import act_quant
            from sparkd.engine.kernels.rms_norm import rms_norm_quant

            return act_quant.attach(*rms_norm_quant(x, self.weight, self.eps, self.quant_fmt), self.quant_fmt)
        if self.fused_on(x):
            from sparkd.engine.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps)  # one launch instead of eight
        return rms_normalize_torch(x, self.eps) * self.weight

    def fused_on(self, x: torch.Tensor) -> bool:
        """Whether this norm of x runs as the fused kernel (kernels/fused.py)."""
        return fused.active("rms_norm", x) and x.dtype == self.weight.dtype == torch.float32

    def quant_on(self, x: torch.Tensor) -> bool:
        """Whether this norm of x also writes x's int8 blocks: one row (a decode step) of a width
        the format's blocks divide, with rms_norm and norm_quant switched on."""
        if self.quant_fmt is None or not fused.active("norm_quant", x) or not self.fused_on(x):
            return False
        from sparkd.engine.kernels.act_quant import BLOCKS  # triton: only where a kernel runs

        D = x.shape[-1]
        return x.numel() == D and D % BLOCKS[self.quant_fmt] == 0


def add_norm(x: torch.Tensor, h: torch.Tensor, norm: nn.Module, parts: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, norm(x + h)): a residual add and the norm after it, one launch for an RMSNorm where
    the fused kernels run. parts: x one row [1, D], h [S, D] the split-K partials of the GEMV that
    made h's row (KernelLinear.forward_parts), added in order (in that launch where it runs)."""
    many = parts and h.shape[0] > 1
    if not many and parts:
        h = h.view(x.shape)  # one part: the row itself
    if isinstance(norm, RMSNorm) and norm.fused_on(x) and (many or h.shape == x.shape) and h.dtype == x.dtype:
        if norm.quant_on(x):
            from sparkd.engine.kernels import act_quant
            from sparkd.engine.kernels.rms_norm import add_rms_norm_quant

            total, normed, q = add_rms_norm_quant(x, h, norm.weight, norm.eps, norm.quant_fmt, parts=many)
            return total, act_quant.attach(normed, q, norm.quant_fmt)
        from sparkd.engine.kernels.rms_norm import add_rms_norm

        return add_rms_norm(x, h, norm.weight, norm.eps, parts=many)
    if many:
        from sparkd.engine.kernels.matmul import sum_parts

        h = sum_parts(h).view(x.shape)
    x = x + h
    return x, norm(x)


class LayerNorm(nn.Module):
    """LayerNorm as ggml_norm computes it (mean and variance over the last dim), then w, b."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.double().mean(-1, keepdim=True).to(x.dtype)
        var = centred.double().pow(2).mean(-1, keepdim=True)
        y = centred * torch.rsqrt(var + self.eps).to(x.dtype) * self.weight
        return y if self.bias is None else y + self.bias
