"""Rope on a decode token's q and k heads plus the k/v write into the cache at the device
position, in one launch: the static (CUDA graph) decode step's rope + KV write. The reference is
layers/rope.py's apply_rope on rows of KVCache.rope's table, then KVCache.append (index_copy_).

A program per head: programs [0, H) rotate q's heads into a new tensor, programs [H, H + Hkv)
rotate k's heads and copy v's into the cache rows at pos. Rotated pairs are (i, i + n_rot/2)
(NeoX) or (2i, 2i + 1); dims past n_rot are copied. Given the q and k norms' weights (qwen3's
per-head RMSNorm before rope), each head is normalised first as kernels/rms_norm.py does it
(float64 sum of squares, x * inv then * weight), so the two norm launches fold in here too.
A sliding-window layer's cache is a ring (layers/kv_cache.py): with ring R, position pos's rows are row pos % R.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.family import KernelArgumentError

CACHE_TYPES = (torch.float32, torch.float16)  # the cache rows' types (--kv-type); computed in float32


@triton.jit
def roped_row(src, cos_row, sin_row, norm_w, eps, D, HALF, NEOX: tl.constexpr, NORM: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """The head row at src as [BLOCK_D] (0 past D): RMS-normalised with norm_w first where NORM (float64 sum of
    squares, x * inv then * weight, as kernels/rms_norm.py), then each pair (a, b) = (i, i + HALF) (NEOX) or
    (2i, 2i + 1), i < HALF, rotated to (a c - b s, a s + b c); dims past 2 HALF kept. Each element is computed
    where it lands, from the row and its pair partner's element, so the row never leaves the registers."""
    d = tl.arange(0, BLOCK_D)
    rot = d < 2 * HALF
    if NEOX:
        first = d < HALF
        pair = tl.where(first, d + HALF, d - HALF)
        j = tl.where(first, d, d - HALF)
    else:
        first = d % 2 == 0
        pair = d ^ 1
        j = d // 2
    x = tl.load(src + d, mask=d < D, other=0.0)
    y = tl.load(src + pair, mask=rot, other=0.0)
    if NORM:
        inv = (1.0 / tl.sqrt(tl.sum(x.to(tl.float64) * x.to(tl.float64), axis=0) / D + eps)).to(tl.float32)
        x = x * inv * tl.load(norm_w + d, mask=d < D, other=0.0)
        y = y * inv * tl.load(norm_w + pair, mask=rot, other=0.0)
    c = tl.load(cos_row + j, mask=rot, other=0.0)
    s = tl.load(sin_row + j, mask=rot, other=0.0)
    return tl.where(rot, tl.where(first, x * c - y * s, y * s + x * c), x)


@triton.jit
def _rope_kv(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
             q_norm_ptr, k_norm_ptr, eps,
             H, DK, DV, HALF, q_head_stride, k_head_stride, v_head_stride, q_out_head_stride,
             kc_row_stride, kc_head_stride, vc_row_stride, vc_head_stride,
             ring, NEOX: tl.constexpr, NORM: tl.constexpr, HAS_V: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_DV: tl.constexpr, RING: tl.constexpr = False, PDL: tl.constexpr = False):
    pdl.start(PDL)  # first: pdl's rule
    i = tl.program_id(0)
    pos = tl.load(pos_ptr).to(tl.int64)
    cos_row = cos_ptr + pos * HALF
    sin_row = sin_ptr + pos * HALF
    if RING:
        pos = pos % ring  # the ring row the position's rows go to
    d = tl.arange(0, BLOCK_D)
    if i < H:
        tl.store(q_out_ptr + i * q_out_head_stride + d, roped_row(
            q_ptr + i * q_head_stride, cos_row, sin_row, q_norm_ptr, eps, DK, HALF, NEOX, NORM, BLOCK_D), mask=d < DK)
    else:
        g = i - H
        row = roped_row(k_ptr + g * k_head_stride, cos_row, sin_row, k_norm_ptr, eps, DK, HALF, NEOX, NORM, BLOCK_D)
        tl.store(k_cache_ptr + pos * kc_row_stride + g * kc_head_stride + d, row.to(k_cache_ptr.dtype.element_ty),
                 mask=d < DK)  # (rounded to the cache rows' type)
        if HAS_V:
            dv = tl.arange(0, BLOCK_DV)
            row = tl.load(v_ptr + g * v_head_stride + dv, mask=dv < DV, other=0.0)
            tl.store(v_cache_ptr + pos * vc_row_stride + g * vc_head_stride + dv,
                     row.to(v_cache_ptr.dtype.element_ty), mask=dv < DV)


def rope_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, cos: torch.Tensor,
            sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
            neox: bool, norms: tuple[torch.Tensor, torch.Tensor, float] | None = None, ring: int = 0) -> torch.Tensor:
    """q [1, H, Dk], k [1, Hkv, Dk], v [1, Hkv, Dv] or None; cos, sin [C, n_rot/2] the tables of
    every position; pos [1] on the device; k_cache [C, Hkv, Dk], v_cache [C, Hkv, Dv] (contiguous
    rows, float32 or float16: the rows rounded as they are stored); norms (q weight [Dk], k weight
    [Dk], eps) to RMS-normalise each head first; ring: the caches' rows R where they are a ring (0: none). Writes
    rope(k) and v at row pos (pos % R) of the caches → rope(q) as a new [1, H, Dk] tensor."""
    _check(q, k, v, cos, sin, k_cache, v_cache, norms, ring)
    _, H, Dk = q.shape
    Hkv, half = k.shape[1], cos.shape[1]
    Dv = 0 if v is None else v.shape[2]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    vs = (0, 0, 0) if v is None else (v.stride(1), v_cache.stride(0), v_cache.stride(1))
    q_w, k_w, eps = (q, q, 0.0) if norms is None else norms
    _rope_kv[(H + Hkv,)](
        q, k, k if v is None else v, cos, sin, pos, q_out, k_cache, k_cache if v_cache is None else v_cache,
        q_w, k_w, eps, H, Dk, Dv, half, q.stride(1), k.stride(1), vs[0], q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), vs[1], vs[2], ring,
        NEOX=neox, NORM=norms is not None, HAS_V=v is not None, BLOCK_D=triton.next_power_of_2(Dk),
        BLOCK_DV=triton.next_power_of_2(max(Dv, 1)), RING=ring > 0, num_warps=1, **pdl.launch(q.device))
    return q_out


def _check(q, k, v, cos, sin, k_cache, v_cache, norms, ring) -> None:
    bad = problem(q, k, v, cos, sin, k_cache, v_cache, norms, ring)
    if bad:
        raise KernelArgumentError(f"could not run rope_kv on q {list(q.shape)}, k {list(k.shape)}: {bad}")


def problem(q, k, v, cos, sin, k_cache, v_cache, norms, ring: int = 0) -> str | None:
    """What is wrong with rope_kv's arguments (None: nothing); rope_attention's check too."""
    weights = () if norms is None else norms[:2]
    others = [t for t in (q, k, v, cos, sin, *weights) if t is not None]
    caches = [t for t in (k_cache, v_cache) if t is not None]
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != 1 or k.shape[0] != 1 or q.shape[2] != k.shape[2]:
        return "q must be [1, H, Dk] and k [1, Hkv, Dk]"
    if (v is None) != (v_cache is None) or (v is not None and v.shape[:2] != k.shape[:2]):
        return "v and v_cache come together, v as [1, Hkv, Dv]"
    if any(t.stride(-1) != 1 for t in others + caches) or any(t.dtype != torch.float32 for t in others) \
            or any(t.dtype not in CACHE_TYPES for t in caches):
        return "every tensor must be float32 (the caches float32 or float16) with a contiguous last dim"
    if cos.shape != sin.shape or 2 * cos.shape[1] > q.shape[2] or not cos.is_contiguous():
        return f"cos/sin {list(cos.shape)} must be contiguous [C, n_rot/2] with n_rot <= Dk"
    if ring and (ring != k_cache.shape[0] or (v_cache is not None and v_cache.shape[0] != ring)):
        return f"a ring of {ring} rows must be the caches' rows ({k_cache.shape[0]})"
    if k_cache.shape[1:] != k.shape[1:] or (v is not None and v_cache.shape[1:] != v.shape[1:]):
        return f"cache rows {list(k_cache.shape[1:])} must match the new rows"
    if any(w.shape != (q.shape[2],) for w in weights):
        return f"norm weights {[list(w.shape) for w in weights]} must be [Dk]"
    return None
