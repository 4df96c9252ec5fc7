"""Attention of one query token over a static span of cached keys, masked by the query's
device position: the static (CUDA graph) decode step's attention in one launch, float32
throughout. layers/attention.py's `attend` is the reference.

A program per query head reads its KV head (GQA: head h reads kv head h // group, as ggml
broadcasts) in blocks of keys with a running max and sum (online softmax). Keys past the
position and, with a sliding window, keys at or beyond `window` positions back are skipped: the
loop runs over [lo, pos] only, so a short sequence in a long bucket reads few rows. An attention
sink is one more logit in the denominator with no value: it starts the running max and sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError


@triton.jit
def _decode_attention(q_ptr, k_ptr, v_ptr, pos_ptr, sink_ptr, out_ptr, span, scale, window,
                      q_head_stride, k_row_stride, k_head_stride, v_row_stride, v_head_stride,
                      out_head_stride, DK, DV, GROUP: tl.constexpr, HAS_SINKS: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    h = tl.program_id(0)
    kvh = h // GROUP
    pos = tl.load(pos_ptr).to(tl.int32)
    hi = tl.minimum(pos + 1, span)  # keys [lo, hi) are visible
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + h * q_head_stride + dk, mask=dk < DK, other=0.0)
    if HAS_SINKS:
        m = tl.load(sink_ptr + h).to(tl.float32)  # exp(sink - m) = 1 in the sum
        total = tl.full([], 1.0, tl.float32)
    else:
        m = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    k_base = k_ptr + kvh * k_head_stride
    v_base = v_ptr + kvh * v_head_stride
    for start in range((lo // BLOCK_S) * BLOCK_S, hi, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        seen = (rows >= lo) & (rows < hi)
        k = tl.load(k_base + rows[:, None].to(tl.int64) * k_row_stride + dk[None, :],
                    mask=seen[:, None] & (dk < DK)[None, :], other=0.0)
        s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_S]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: every block holds a visible key
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        total = total * alpha + tl.sum(p, axis=0)
        v = tl.load(v_base + rows[:, None].to(tl.int64) * v_row_stride + dv[None, :],
                    mask=seen[:, None] & (dv < DV)[None, :], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + h * out_head_stride + dv, acc / total, mask=dv < DV)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     scale: float, window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [1, H, Dk], k [S, Hkv, Dk], v [S, Hkv, Dv] (views of the cache; last dims contiguous),
    pos [1] the query's position on the device (< S) → [1, H, Dv] float32, as
    attend(q, k, v, scale, pos, window, sinks)."""
    _check(q, k, v, pos, sinks)
    _, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    out = torch.empty(1, H, Dv, dtype=torch.float32, device=q.device)
    block_dk, block_dv = triton.next_power_of_2(Dk), triton.next_power_of_2(Dv)
    block_s = max(16, min(64, 8192 // max(block_dk, block_dv)))  # a [BLOCK_S, D] tile of ~8k values
    _decode_attention[(H,)](
        q, k, v, pos, q if sinks is None else sinks, out, S, scale, window,
        q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(1), Dk, Dv,
        GROUP=H // Hkv, HAS_SINKS=sinks is not None, BLOCK_S=block_s, BLOCK_DK=block_dk,
        BLOCK_DV=block_dv, num_warps=4, **pdl.launch(q.device))
    return out


def _check(q, k, v, pos, sinks) -> None:
    bad = shape_problem(q, k, v, sinks, "1")
    if not bad and (pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64)):
        bad = "pos must be one integer position"
    if bad:
        raise KernelArgumentError(f"could not run decode_attention on q {list(q.shape)}, k {list(k.shape)}, "
                                  f"v {list(v.shape)}: {bad}")


def shape_problem(q, k, v, sinks, rows: str) -> str | None:
    """What is wrong with an attention kernel's q [rows, H, Dk], k, v [S, Hkv, D] and sinks [H] (None: nothing);
    rows "1": one query row (the decode), "T": any (prefill_attention)."""
    if q.dim() != 3 or (rows == "1" and q.shape[0] != 1) or k.dim() != 3 or v.dim() != 3:
        return f"q must be [{rows}, H, Dk] and k, v [S, Hkv, D]"
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        return "k and v must share [S, Hkv], q and k their Dk, and H be a multiple of Hkv"
    if any(t.dtype != torch.float32 or t.stride(-1) != 1 for t in (q, k, v)):
        return "q, k and v must be float32 with a contiguous last dim"
    if sinks is not None and (sinks.shape != (q.shape[1],) or sinks.dtype != torch.float32):
        return "sinks must be float32 [H]"
    return None
