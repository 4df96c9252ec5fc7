"""RMSNorm in one kernel: x / sqrt(mean(x²) + eps) * weight per row, the mean of squares
accumulated in float64 as ggml (and layers/norm.py, the reference) does.

On a decode step torch spends six kernels per norm (cast, square, mean, add, rsqrt, two
multiplies) and a layer has four to six norms (attn, ffn, q and k per head); this is one launch
per norm, a program per row. add_rms_norm takes the residual add before the norm in as well.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError


@triton.jit
def _rms_norm_rows(x_ptr, w_ptr, out_ptr, res_ptr, sum_ptr, n_cols, x_row_stride, out_row_stride,
                   eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=live, other=0.0)
    if HAS_RES:  # the residual add before the norm: x + h is the block's new stream, kept too
        x = x + tl.load(res_ptr + row * n_cols + cols, mask=live, other=0.0)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=live)
    xd = x.to(tl.float64)
    mean_sq = tl.sum(xd * xd, axis=0) / n_cols
    inv = (1.0 / tl.sqrt(mean_sq + eps)).to(tl.float32)  # back to x's type before scaling, as torch
    w = tl.load(w_ptr + cols, mask=live, other=0.0)
    tl.store(out_ptr + row * out_row_stride + cols, x * inv * w, mask=live)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] float32 (last dim contiguous), weight [D] float32 → a new tensor like x."""
    return _launch(x, None, weight, eps)[1]


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, rms_norm(x + h)) in one launch: a block's residual add and the norm after it.
    x, h [..., D] float32 of one shape."""
    if h.shape != x.shape or h.dtype != x.dtype:
        raise KernelArgumentError(f"could not run add_rms_norm: x {x.dtype} {list(x.shape)} and h "
                                  f"{h.dtype} {list(h.shape)} must match")
    return _launch(x, h, weight, eps)


def _launch(x, h, weight, eps) -> tuple[torch.Tensor | None, torch.Tensor]:
    D = x.shape[-1]
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.shape != (D,):
        raise KernelArgumentError(f"could not run rms_norm: x {x.dtype} {list(x.shape)} and weight "
                                  f"{weight.dtype} {list(weight.shape)} must be float32 with the "
                                  f"weight as long as x's last dim")
    rows = x.reshape(-1, D) if x.stride(-1) == 1 else x.contiguous().reshape(-1, D)  # a view when it can be
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    res = None if h is None else h.reshape(-1, D).contiguous()
    total = None if h is None else torch.empty_like(out)
    block = triton.next_power_of_2(D)
    if rows.shape[0]:
        _rms_norm_rows[(rows.shape[0],)](rows, weight.contiguous(), out, out if res is None else res,
                                         out if total is None else total, D, rows.stride(0), out.stride(0),
                                         eps, HAS_RES=res is not None, BLOCK=block,
                                         num_warps=4 if block <= 1024 else 8)
    return None if total is None else total.view(x.shape), out.view(x.shape)
