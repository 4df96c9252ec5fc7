"""RMSNorm in one kernel: x / sqrt(mean(x²) + eps) * weight per row, the mean of squares
accumulated in float64 as ggml (and layers/norm.py, the reference) does.

On a decode step torch spends six kernels per norm (cast, square, mean, add, rsqrt, two
multiplies) and a layer has four to six norms (attn, ffn, q and k per head); this is one launch
per norm, a program per row. add_rms_norm takes the residual add before the norm in as well.

The *_quant variants also write the normed row as act_quant's int8 blocks (QuantX) for the
integer GEMV that reads it next, so that GEMV's own x quantization launch goes away. act_quant's
rounding needs enable_fp_fusion=False, and every launch here runs so, with or without the quant:
with fusion on, the compiler accumulates each thread's squares with float64 FMAs (seen in the
sm_90 PTX), without it as a multiply then an add, so the two would not always give the same
float bits. Since session 5 the plain norm runs without FMAs too (the float64 mean of squares may
differ from session 4's in its last bit, the float32 output very rarely; both are within the
tests' 1e-6 of the torch reference), and the norm with and without the quant agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import act_quant, pdl
from sparkd.engine.kernels.family import KernelArgumentError


@triton.jit
def _rms_norm_rows(x_ptr, w_ptr, out_ptr, res_ptr, sum_ptr, q_ptr, d_ptr, s_ptr, n_cols, x_row_stride,
                   out_row_stride, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, QBLOCK: tl.constexpr,
                   K8: tl.constexpr, PARTS: tl.constexpr = 0, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=live, other=0.0)
    if HAS_RES:  # the residual add before the norm: x + h is the block's new stream, kept too
        if PARTS > 1:  # h: one row's split-K partials [PARTS, n_cols] added in order from 0.0 (fold_part's bits)
            h = tl.zeros((BLOCK,), tl.float32)
            for s in tl.static_range(PARTS):
                h += tl.load(res_ptr + s * n_cols + cols, mask=live, other=0.0)
        else:
            h = tl.load(res_ptr + row * n_cols + cols, mask=live, other=0.0)
        x = x + h
        tl.store(sum_ptr + row * n_cols + cols, x, mask=live)
    xd = x.to(tl.float64)
    mean_sq = tl.sum(xd * xd, axis=0) / n_cols
    inv = (1.0 / tl.sqrt(mean_sq + eps)).to(tl.float32)  # back to x's type before scaling, as torch
    w = tl.load(w_ptr + cols, mask=live, other=0.0)
    y = x * inv * w
    tl.store(out_ptr + row * out_row_stride + cols, y, mask=live)
    if QBLOCK > 0:  # the row's quant blocks, as act_quant.quantize would write them from y
        P: tl.constexpr = BLOCK // QBLOCK
        n_blocks = n_cols // QBLOCK
        b = tl.arange(0, P)[:, None]  # [P, 1] block index in the row
        act_quant.store_blocks(q_ptr + row * (n_cols // 4), d_ptr + row * n_blocks, s_ptr + row * (n_cols // 32),
                               tl.reshape(y, (P, QBLOCK)), b, b < n_blocks, K8)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] float32 (last dim contiguous), weight [D] float32 → a new tensor like x."""
    return _launch(x, None, weight, eps)[1]


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, parts: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, rms_norm(x + h)) in one launch: a block's residual add and the norm after it.
    x, h [..., D] float32 of one shape; parts: x one row [1, D] and h [S, D], the split-K partials
    of the GEMV that made h's row (matmul.gemv(parts=True)), added in order in this launch (the
    bits of x + matmul.sum_parts(h))."""
    _check_pair(x, h, parts)
    return _launch(x, h, weight, eps, parts=parts)[:2]


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str
                   ) -> tuple[torch.Tensor, act_quant.QuantX]:
    """(rms_norm(x), act_quant.quantize(its rows, fmt)) in one launch; D a multiple of fmt's block."""
    _, out, q = _launch(x, None, weight, eps, fmt)
    return out, q


def add_rms_norm_quant(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str,
                       parts: bool = False) -> tuple[torch.Tensor, torch.Tensor, act_quant.QuantX]:
    """add_rms_norm's pair and the normed rows quantized to fmt, in one launch (parts: add_rms_norm's)."""
    _check_pair(x, h, parts)
    return _launch(x, h, weight, eps, fmt, parts)


def _check_pair(x: torch.Tensor, h: torch.Tensor, parts: bool = False) -> None:
    if parts:
        D = x.shape[-1]
        if x.numel() != D or h.dim() != 2 or h.shape[1] != D or not h.shape[0] or h.dtype != x.dtype:
            raise KernelArgumentError(f"could not run add_rms_norm on partials: need x one row of D values and h "
                                      f"[S, D] of x's dtype, got x {x.dtype} {list(x.shape)} and h {h.dtype} "
                                      f"{list(h.shape)}")
    elif h.shape != x.shape or h.dtype != x.dtype:
        raise KernelArgumentError(f"could not run add_rms_norm: x {x.dtype} {list(x.shape)} and h "
                                  f"{h.dtype} {list(h.shape)} must match")


def _launch(x, h, weight, eps, fmt: str | None = None, parts: bool = False):
    D = x.shape[-1]
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.shape != (D,):
        raise KernelArgumentError(f"could not run rms_norm: x {x.dtype} {list(x.shape)} and weight "
                                  f"{weight.dtype} {list(weight.shape)} must be float32 with the "
                                  f"weight as long as x's last dim")
    if fmt is not None and (fmt not in act_quant.BLOCKS or D % act_quant.BLOCKS[fmt]):
        raise KernelArgumentError(f"could not run rms_norm with the {fmt!r} quantization: need a format of "
                                  f"{sorted(act_quant.BLOCKS)} whose block divides the row width {D}")
    rows = x.reshape(-1, D) if x.stride(-1) == 1 else x.contiguous().reshape(-1, D)  # a view when it can be
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    res = None if h is None else h.reshape(-1, D).contiguous()  # (parts: [S, D], S rows summed into x's one)
    total = None if h is None else torch.empty_like(out)
    q = None if fmt is None else act_quant.empty(rows.shape[0], D, fmt, x.device)
    block = triton.next_power_of_2(D)
    if rows.shape[0]:
        _rms_norm_rows[(rows.shape[0],)](rows, weight.contiguous(), out, out if res is None else res,
                                         out if total is None else total,
                                         *((out, out, out) if q is None else (q.words, q.scales, q.sums)),
                                         D, rows.stride(0), out.stride(0), eps, HAS_RES=res is not None,
                                         BLOCK=block, QBLOCK=0 if q is None else act_quant.BLOCKS[fmt],
                                         K8=fmt == act_quant.Q8_K,
                                         PARTS=res.shape[0] if parts and res.shape[0] > 1 else 0,
                                         num_warps=4 if block <= 1024 else 8,
                                         enable_fp_fusion=False,  # see the module's doc
                                         **pdl.launch(x.device))
    return None if total is None else total.view(x.shape), out.view(x.shape), q
