"""Causal attention of a prompt's T queries over the KV cache rows [0, start + T) in one launch,
float32 throughout: the prefill path's attention (session 11, attn11). layers/attention.py's
`attend` is the reference.

A program takes BLOCK_T queries of one head (GQA: head h reads kv head h // group, as ggml
broadcasts) and walks the keys in blocks of BLOCK_S from row 0 (or the block holding the first
row its sliding window sees) with a running max and sum (online softmax), both products as
tl.dot at input precision "ieee" (float32 FMAs, no TF32). The loop stops at the tile's last
query, so a query reads no key block past its tile: keys after a query's position (a padded
prompt's padding included) only ever add exact zeros (a masked logit's exp is 0, its block's
max leaves the running max, rescaling by exp(0) = 1). Query tiles and key blocks start at row 0
with fixed sizes, so a query row's bits depend on its own causal range only, not on T: a prompt
padded to its CUDA-graph bucket gives its real rows the eager prompt's bits.

Not the default (SPARKD_PREFILL_ATTENTION=kernel): on the H200 it takes 16x torch's GPU time as it
stands (3.8 vs 0.23 ms a layer at 512 tokens, 32 heads of 128; docs/performance.md, attn11).

An attention sink is one more logit in the denominator with no value: it starts the running max
and sum. A query whose window holds no key of a block skips it the same way (its max stays
-inf, taken as 0 for the exponentials).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels.decode_attention import shape_problem
from sparkd.engine.kernels.family import KernelArgumentError

BLOCK_T = 64  # queries a program (fixed: a row's tile and place in it must not depend on T)


@triton.jit
def _prefill_attention(q_ptr, k_ptr, v_ptr, sink_ptr, out_ptr, T, start, scale, window,
                       q_row_stride, q_head_stride, k_row_stride, k_head_stride, v_row_stride, v_head_stride,
                       out_row_stride, out_head_stride, DK, DV, GROUP: tl.constexpr, HAS_SINKS: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DK: tl.constexpr,
                       BLOCK_DV: tl.constexpr):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    rows = tile * BLOCK_T + tl.arange(0, BLOCK_T)  # queries, at positions start + rows
    live = rows < T
    pos_q = start + rows
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + rows[:, None].to(tl.int64) * q_row_stride + h * q_head_stride + dk[None, :],
                mask=live[:, None] & (dk < DK)[None, :], other=0.0)
    hi = start + tl.minimum((tile + 1) * BLOCK_T, T)  # keys [lo, hi): up to the tile's last query
    lo = tl.where(window > 0, tl.maximum(start + tile * BLOCK_T - window + 1, 0), 0)
    if HAS_SINKS:
        m = tl.load(sink_ptr + h + 0 * rows).to(tl.float32)  # exp(sink - m) = 1 in the sum
        total = tl.full([BLOCK_T], 1.0, tl.float32)
    else:
        m = tl.full([BLOCK_T], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_DV], tl.float32)
    k_base = k_ptr + kvh * k_head_stride
    v_base = v_ptr + kvh * v_head_stride
    for s0 in range((lo // BLOCK_S) * BLOCK_S, hi, BLOCK_S):
        keys = s0 + tl.arange(0, BLOCK_S)
        there = keys < hi
        k = tl.load(k_base + keys[None, :].to(tl.int64) * k_row_stride + dk[:, None],
                    mask=there[None, :] & (dk < DK)[:, None], other=0.0).to(tl.float32)  # [BLOCK_DK, BLOCK_S]
        s = tl.dot(q, k, input_precision="ieee") * scale  # [BLOCK_T, BLOCK_S]
        seen = there[None, :] & (keys[None, :] <= pos_q[:, None])
        if window > 0:
            seen = seen & ((pos_q[:, None] - keys[None, :]) < window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_exp = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet
        alpha = tl.exp(m - m_exp)
        p = tl.exp(s - m_exp[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + keys[:, None].to(tl.int64) * v_row_stride + dv[None, :],
                    mask=there[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)  # [BLOCK_S, BLOCK_DV]
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    tl.store(out_ptr + rows[:, None].to(tl.int64) * out_row_stride + h * out_head_stride + dv[None, :],
             acc / tl.where(live, total, 1.0)[:, None], mask=live[:, None] & (dv < DV)[None, :])  # (a dead row may see nothing)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                      window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, Dk] (the queries at positions start..start+T-1), k [S, Hkv, Dk], v [S, Hkv, Dv]
    with S = start + T (views of the cache; last dims contiguous) → [T, H, Dv] float32, as
    attend(q, k, v, scale, start, window, sinks)."""
    _check(q, k, v, start, sinks)
    T, H, Dk = q.shape
    _, Hkv, Dv = v.shape
    out = torch.empty(T, H, Dv, dtype=torch.float32, device=q.device)
    block_dk, block_dv = max(16, triton.next_power_of_2(Dk)), max(16, triton.next_power_of_2(Dv))
    block_s = 64 if max(block_dk, block_dv) <= 128 else 32  # k and v tiles of <= 8k values
    _prefill_attention[(triton.cdiv(T, BLOCK_T), H)](
        q, k, v, q if sinks is None else sinks, out, T, start, scale, window,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), Dk, Dv, GROUP=H // Hkv, HAS_SINKS=sinks is not None,
        BLOCK_T=BLOCK_T, BLOCK_S=block_s, BLOCK_DK=block_dk, BLOCK_DV=block_dv, num_warps=8)
    return out


def _check(q, k, v, start, sinks) -> None:
    bad = shape_problem(q, k, v, sinks, "T")
    if not bad and (not isinstance(start, int) or start < 0 or k.shape[0] != start + q.shape[0]):
        bad = "start must be a host int >= 0 with S = start + T"
    if bad:
        raise KernelArgumentError(f"could not run prefill_attention on q {list(q.shape)}, k {list(k.shape)}, "
                                  f"v {list(v.shape)}, start {start!r}: {bad}")
