"""Rope on a decode token's q and k heads plus the k/v write into the cache at the device
position, in one launch: the static (CUDA graph) decode step's rope + KV write. The reference is
layers/rope.py's apply_rope on rows of KVCache.rope's table, then KVCache.append (index_copy_).

A program per head: programs [0, H) rotate q's heads into a new tensor, programs [H, H + Hkv)
rotate k's heads and copy v's into the cache rows at pos. Rotated pairs are (i, i + n_rot/2)
(NeoX) or (2i, 2i + 1); dims past n_rot are copied. Given the q and k norms' weights (qwen3's
per-head RMSNorm before rope), each head is normalised first as kernels/rms_norm.py does it
(float64 sum of squares, x * inv then * weight), so the two norm launches fold in here too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError


@triton.jit
def _rotate(src, dst, cos_row, sin_row, norm_w, eps, D, HALF, NEOX: tl.constexpr, NORM: tl.constexpr,
            BLOCK_D: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr):
    j = tl.arange(0, BLOCK_HALF)
    live = j < HALF
    if NEOX:
        ia, ib = j, j + HALF
    else:
        ia, ib = 2 * j, 2 * j + 1
    r = 2 * HALF + tl.arange(0, BLOCK_REST)
    a = tl.load(src + ia, mask=live, other=0.0)
    b = tl.load(src + ib, mask=live, other=0.0)
    rest = tl.load(src + r, mask=r < D, other=0.0)
    if NORM:
        d = tl.arange(0, BLOCK_D)
        row = tl.load(src + d, mask=d < D, other=0.0).to(tl.float64)
        inv = (1.0 / tl.sqrt(tl.sum(row * row, axis=0) / D + eps)).to(tl.float32)
        a = a * inv * tl.load(norm_w + ia, mask=live, other=0.0)
        b = b * inv * tl.load(norm_w + ib, mask=live, other=0.0)
        rest = rest * inv * tl.load(norm_w + r, mask=r < D, other=0.0)
    c = tl.load(cos_row + j, mask=live, other=0.0)
    s = tl.load(sin_row + j, mask=live, other=0.0)
    tl.store(dst + ia, a * c - b * s, mask=live)
    tl.store(dst + ib, a * s + b * c, mask=live)
    tl.store(dst + r, rest, mask=r < D)


@triton.jit
def _rope_kv(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
             q_norm_ptr, k_norm_ptr, eps,
             H, DK, DV, HALF, q_head_stride, k_head_stride, v_head_stride, q_out_head_stride,
             kc_row_stride, kc_head_stride, vc_row_stride, vc_head_stride,
             NEOX: tl.constexpr, NORM: tl.constexpr, HAS_V: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    i = tl.program_id(0)
    pos = tl.load(pos_ptr).to(tl.int64)
    cos_row = cos_ptr + pos * HALF
    sin_row = sin_ptr + pos * HALF
    if i < H:
        _rotate(q_ptr + i * q_head_stride, q_out_ptr + i * q_out_head_stride, cos_row, sin_row,
                q_norm_ptr, eps, DK, HALF, NEOX, NORM, BLOCK_D, BLOCK_HALF, BLOCK_REST)
    else:
        g = i - H
        _rotate(k_ptr + g * k_head_stride, k_cache_ptr + pos * kc_row_stride + g * kc_head_stride,
                cos_row, sin_row, k_norm_ptr, eps, DK, HALF, NEOX, NORM, BLOCK_D, BLOCK_HALF, BLOCK_REST)
        if HAS_V:
            d = tl.arange(0, BLOCK_DV)
            row = tl.load(v_ptr + g * v_head_stride + d, mask=d < DV, other=0.0)
            tl.store(v_cache_ptr + pos * vc_row_stride + g * vc_head_stride + d, row, mask=d < DV)


def rope_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, cos: torch.Tensor,
            sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
            neox: bool, norms: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
    """q [1, H, Dk], k [1, Hkv, Dk], v [1, Hkv, Dv] or None; cos, sin [C, n_rot/2] the tables of
    every position; pos [1] on the device; k_cache [C, Hkv, Dk], v_cache [C, Hkv, Dv] (contiguous
    rows); norms (q weight [Dk], k weight [Dk], eps) to RMS-normalise each head first. Writes
    rope(k) and v at row pos of the caches → rope(q) as a new [1, H, Dk] tensor."""
    _check(q, k, v, cos, sin, k_cache, v_cache, norms)
    _, H, Dk = q.shape
    Hkv, half = k.shape[1], cos.shape[1]
    Dv = 0 if v is None else v.shape[2]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    vs = (0, 0, 0) if v is None else (v.stride(1), v_cache.stride(0), v_cache.stride(1))
    q_w, k_w, eps = (q, q, 0.0) if norms is None else norms
    _rope_kv[(H + Hkv,)](
        q, k, k if v is None else v, cos, sin, pos, q_out, k_cache, k_cache if v_cache is None else v_cache,
        q_w, k_w, eps, H, Dk, Dv, half, q.stride(1), k.stride(1), vs[0], q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), vs[1], vs[2],
        NEOX=neox, NORM=norms is not None, HAS_V=v is not None, BLOCK_D=triton.next_power_of_2(Dk),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(max(Dk - 2 * half, 1)),
        BLOCK_DV=triton.next_power_of_2(max(Dv, 1)), num_warps=1, **pdl.launch(q.device))
    return q_out


def _check(q, k, v, cos, sin, k_cache, v_cache, norms) -> None:
    bad = None
    weights = () if norms is None else norms[:2]
    tensors = [t for t in (q, k, v, cos, sin, k_cache, v_cache, *weights) if t is not None]
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != 1 or k.shape[0] != 1 or q.shape[2] != k.shape[2]:
        bad = "q must be [1, H, Dk] and k [1, Hkv, Dk]"
    elif (v is None) != (v_cache is None) or (v is not None and v.shape[:2] != k.shape[:2]):
        bad = "v and v_cache come together, v as [1, Hkv, Dv]"
    elif any(t.dtype != torch.float32 or t.stride(-1) != 1 for t in tensors):
        bad = "every tensor must be float32 with a contiguous last dim"
    elif cos.shape != sin.shape or 2 * cos.shape[1] > q.shape[2] or not cos.is_contiguous():
        bad = f"cos/sin {list(cos.shape)} must be contiguous [C, n_rot/2] with n_rot <= Dk"
    elif k_cache.shape[1:] != k.shape[1:] or (v is not None and v_cache.shape[1:] != v.shape[1:]):
        bad = f"cache rows {list(k_cache.shape[1:])} must match the new rows"
    elif any(w.shape != (q.shape[2],) for w in weights):
        bad = f"norm weights {[list(w.shape) for w in weights]} must be [Dk]"
    if bad:
        raise KernelArgumentError(f"could not run rope_kv on q {list(q.shape)}, k {list(k.shape)}: {bad}")
