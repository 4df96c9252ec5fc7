"""Dequantize-and-multiply straight from GGUF blocks: GEMV for decode, a small GEMM for prefill.

Weights stay raw GGUF bytes ([rows, cols] in torch order, rows one after another); each program
dequantizes a tile of rows one 256-value group at a time in registers, so no dequantized copy
of a weight ever exists in memory. The quant family is a compile-time argument (its `dequant`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import dispatch

# Rows per program and warps: a GEMV program reads BLOCK_N rows of one group at a time.
GEMV_BLOCK_N, GEMV_WARPS = 8, 4
GEMM_BLOCK_N, GEMM_BLOCK_T, GEMM_WARPS = 32, 16, 4


@triton.jit
def row_dot(w_ptr, row_off, rmask, x_ptr, K, DEQ: tl.constexpr, NSUB: tl.constexpr,
            SUBLEN: tl.constexpr):
    """sum_k W[row, k] * x[k] for a tile of rows: float32 [BN]."""
    s = tl.arange(0, NSUB)[None, :, None]
    i = tl.arange(0, SUBLEN)[None, None, :]
    acc = tl.zeros(rmask.shape, tl.float32)
    for g in range(0, tl.cdiv(K, NSUB * SUBLEN)):
        k0 = g * (NSUB * SUBLEN) + s * SUBLEN  # [1, NSUB, 1] first column of each sub-block
        kmask = k0 < K
        w = DEQ(w_ptr, row_off, g, rmask[:, None, None] & kmask)
        x = tl.load(x_ptr + k0 + i, mask=kmask & (i < SUBLEN), other=0.0)
        acc += tl.sum(tl.sum(w * x, 2), 1)
    return acc


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, y_ptr, N, K, row_bytes, DEQ: tl.constexpr, NSUB: tl.constexpr,
                 SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    row_off = (rows.to(tl.int64) * row_bytes)[:, None, None]
    acc = row_dot(w_ptr, row_off, rmask, x_ptr, K, DEQ, NSUB, SUBLEN)
    tl.store(y_ptr + rows, acc, mask=rmask)


@triton.jit
def _gemm_kernel(w_ptr, x_ptr, y_ptr, N, K, T, row_bytes, stride_xt, stride_yt,
                 DEQ: tl.constexpr, NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_T: tl.constexpr, PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    toks = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask, tmask = rows < N, toks < T
    row_off = (rows.to(tl.int64) * row_bytes)[:, None, None]
    s = tl.arange(0, NSUB)[None, :, None]
    kk = tl.arange(0, NSUB * SUBLEN)[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    for g in range(0, tl.cdiv(K, NSUB * SUBLEN)):
        kmask = g * (NSUB * SUBLEN) + s * SUBLEN < K
        w = tl.reshape(DEQ(w_ptr, row_off, g, rmask[:, None, None] & kmask), (BLOCK_N, NSUB * SUBLEN))
        cols = g * (NSUB * SUBLEN) + kk
        x = tl.load(x_ptr + toks[:, None].to(tl.int64) * stride_xt + cols,
                    mask=tmask[:, None] & (cols < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    y = y_ptr + toks[:, None].to(tl.int64) * stride_yt + rows[None, :]
    tl.store(y, acc, mask=tmask[:, None] & rmask[None, :])


def _checked(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor, x_dims: int, what: str):
    """The checks GEMV and GEMM share; returns (family, rows, cols, bytes per row)."""
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(weight, what)
    dispatch.check_activations(x, cols, what)
    dispatch.device_of(weight, x, what)
    if x.dim() != x_dims or weight.numel() != rows * row_bytes:
        x_shape = f"[{cols}]" if x_dims == 1 else f"[T, {cols}]"
        raise dispatch.KernelArgumentError(
            f"could not run {what}: need x {x_shape} and {rows * row_bytes} weight bytes for "
            f"[{rows}, {cols}], got x {list(x.shape)} and {weight.numel()} bytes")
    return fam, rows, cols, row_bytes


def gemv(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor,
         out: torch.Tensor | None = None, block_n: int = GEMV_BLOCK_N, num_warps: int = GEMV_WARPS
         ) -> torch.Tensor:
    """y = W @ x for one token. weight: raw GGUF bytes of W [rows, cols]; x float32 [cols];
    out (optional) float32 [rows] on x's device."""
    what = f"the {qtype.name} GEMV"
    fam, rows, cols, row_bytes = _checked(weight, qtype, shape, x, 1, what)
    dispatch.check_out(out, (rows,), x.device, what)
    y = torch.empty(rows, dtype=torch.float32, device=x.device) if out is None else out
    _gemv_kernel[(triton.cdiv(rows, block_n),)](
        weight, x, y, rows, cols, row_bytes, DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen,
        BLOCK_N=block_n, num_warps=num_warps)
    return y


def gemm(weight: torch.Tensor, qtype, shape: tuple[int, int], x: torch.Tensor,
         precision: str = "tf32", out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T for a few tokens. weight: raw GGUF bytes of W [rows, cols]; x float32 [T, cols].

    precision is tl.dot's input_precision: "tf32" (fast, ~1e-3 relative) or "ieee" (float32)."""
    what = f"the {qtype.name} GEMM"
    if precision not in ("tf32", "ieee"):
        raise dispatch.KernelArgumentError(f"could not run {what}: precision {precision!r} is not "
                                           f"'tf32' or 'ieee'")
    fam, rows, cols, row_bytes = _checked(weight, qtype, shape, x, 2, what)
    n_tok = x.shape[0]
    dispatch.check_out(out, (n_tok, rows), x.device, what)
    y = torch.empty(n_tok, rows, dtype=torch.float32, device=x.device) if out is None else out
    if n_tok == 0:
        return y
    grid = (triton.cdiv(rows, GEMM_BLOCK_N), triton.cdiv(n_tok, GEMM_BLOCK_T))
    _gemm_kernel[grid](weight, x, y, rows, cols, n_tok, row_bytes, x.stride(0), y.stride(0),
                       DEQ=fam.dequant, NSUB=fam.nsub, SUBLEN=fam.sublen, BLOCK_N=GEMM_BLOCK_N,
                       BLOCK_T=GEMM_BLOCK_T, PRECISION=precision, num_warps=GEMM_WARPS)
    return y
