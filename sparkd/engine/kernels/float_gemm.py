"""y = x @ W.T (+ b) for a float weight over several rows, with each row's bits independent of the
row count (session 11, attn11): the prompt path's float GEMMs (the MoE router's F32 gate, an F16
or F32 projection kept as float rows) through Triton instead of cuBLAS, which picks its kernel and
summation order by the shape, so a prompt padded to its CUDA-graph bucket got other last bits than
the eager prompt. Fixed tiles from row 0 and a fixed K loop: an output's sum runs in one order
whatever T is. tl.dot at input precision "ieee" (float32 FMAs, as cuBLAS's float32 GEMM without
TF32); the weight is read in its dtype (float32, float16 or bfloat16) and multiplied in float32.
Not the default (SPARKD_PREFILL_FLOAT_GEMM=kernel): 0.15 ms a [T, 2048] x [2048, 128] gate on the
H200 at any T up to 1024, against cuBLAS's 0.015-0.024 (docs/performance.md, attn11).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.family import KernelArgumentError

BLOCK_M, BLOCK_N, BLOCK_K = 32, 64, 32  # fixed: a row's tile and the K order must not depend on T


@triton.jit
def _float_gemm(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, x_row_stride, w_row_stride, y_row_stride,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_row_stride + kk[None, :],
                    mask=(rows < M)[:, None] & (kk < K)[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_row_stride + kk[:, None],
                    mask=(cols < N)[None, :] & (kk < K)[:, None], other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None].to(tl.int64) * y_row_stride + cols[None, :], acc,
             mask=(rows < M)[:, None] & (cols < N)[None, :])


def float_gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32, w [N, K] (float32, float16 or bfloat16), bias [N] or None → [M, N] float32,
    as F.linear(x, w.float(), bias)."""
    _check(x, w, bias)
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    _float_gemm[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
        x, w, x if bias is None else bias, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4)
    return y


def _check(x, w, bias) -> None:
    bad = None
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        bad = "x must be [M, K] and w [N, K]"
    elif x.dtype != torch.float32 or w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        bad = "x must be float32 and w float32, float16 or bfloat16"
    elif x.stride(-1) != 1 or w.stride(-1) != 1:
        bad = "x and w must have a contiguous last dim"
    elif bias is not None and bias.shape != (w.shape[0],):
        bad = "bias must be [N]"
    if bad:
        raise KernelArgumentError(f"could not run float_gemm on x {list(x.shape)} {x.dtype}, "
                                  f"w {list(w.shape)} {w.dtype}: {bad}")
