"""Scaled dot-product attention with llama.cpp's options, and the GQA attention block.

Options: grouped KV heads, q/k RMS norms, partial rotary, sliding window (standard: a key is
visible when pos_q - pos_k < window), attention sinks (one extra logit per head in the softmax
denominator), biases on q/k/v/o.

On the kernel path (q, k, v all KernelLinear of one type) the three projections become one stack
of their rows (KernelLinear.stack): x is quantized once and multiplied in one launch, the same
bits as three. The environment variable SPARKD_FUSED_QKV=0 (read when a layer is built) or
Attention(fuse_qkv=False) keeps three.
"""

from __future__ import annotations


import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sparkd.engine import switches
from sparkd.engine.kernels import fused
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import KernelLinear, Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.rope import apply_rope
from sparkd.engine.layers.rope import RopeConfig


def hidden_keys(start: int | torch.Tensor, T: int, S: int, window: int, device: torch.device,
                key_pos: torch.Tensor | None = None) -> torch.Tensor:
    """[T, S] bool: True where a query (at start + t, or at start[t] on the device) may not read key s: a future
    key, or one window or more behind it. Key s is at position s, or key_pos[s] on the device (a ring's rows,
    KVCache.ring_append: negative, none)."""
    pos_q = (start if isinstance(start, torch.Tensor) else torch.arange(start, start + T, device=device))[:, None]
    pos_k = (torch.arange(S, device=device) if key_pos is None else key_pos)[None, :]
    masked = pos_k > pos_q
    if key_pos is not None:
        masked |= pos_k < 0
    if window:
        masked |= (pos_q - pos_k) >= window
    return masked


def forward_mask(masks: dict | None, visible: bool, start: int | torch.Tensor, T: int, S: int, window: int,
                 device: torch.device, key_pos: torch.Tensor | None = None, sink: bool = False) -> torch.Tensor:
    """hidden_keys (visible: its complement, SDPA's attn_mask), taken from masks (one forward's, KVCache.masks)
    where a layer before made it: one [T, S] mask a forward and window, not one a layer (2 MB each at 1008 x 2048).
    (A host start is in the key: a ring layer's is its own, KVCache.ring_append.) sink: [T, 1 + S], a first key
    every query reads (attend_sdpa's sink key)."""
    key = (visible, window, T, S, start if isinstance(start, int) else None, key_pos is not None, sink)
    if masks is not None and key in masks:
        return masks[key]
    hidden = hidden_keys(start, T, S, window, device, key_pos)
    mask = ~hidden if visible else hidden
    if sink:
        mask = F.pad(mask, (1, 0), value=visible)
    if masks is not None:
        masks[key] = mask
    return mask


MQA_HEADS = 16  # attend's query heads a score tensor over one KV head (MQA: MLA's latent head)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, start: int | torch.Tensor,
           window: int = 0, sinks: torch.Tensor | None = None,
           keep: torch.Tensor | None = None, masks: dict | None = None,
           key_pos: torch.Tensor | None = None) -> torch.Tensor:
    """q: [T, H, Dk], k: [S, Hkv, Dk], v: [S, Hkv, Dv] with S = start + T → [T, H, Dv].
    start may instead be the queries' positions [T] on the device (static decode: S is a fixed
    span and keys past a query's position are masked like future ones), and key_pos [S] the keys' (hidden_keys).

    keep: [T, S] bool, the only keys each query may read besides the causal mask (sparse attention).
    masks: the forward's masks the layers share (KVCache.masks; forward_mask), None: this call's own.
    """
    T, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    group = H // Hkv  # query head h reads kv head h // group, as ggml broadcasts
    k, v = k.to(q.dtype), v.to(q.dtype)  # (float16 cache rows widened first: Hkv heads, not H)
    masked = forward_mask(masks, False, start, T, S, window, q.device, key_pos)
    if keep is not None:
        masked = masked | ~keep
    if Hkv == 1:  # MQA (MLA's latent head): every query head reads the one head, not 64-128 copies of it (session 32),
        # MQA_HEADS heads' scores at a time (session 38: [16, T, S], not [128, T, S]; the same bits on the CPU)
        out = q.new_empty(T, H, Dv)
        for h in range(0, H, MQA_HEADS):
            heads = slice(h, h + MQA_HEADS)
            scores = (torch.einsum("thd,sd->hts", q[:, heads], k[:, 0]) * scale).masked_fill_(masked, float("-inf"))
            out[:, heads] = torch.einsum("hts,sd->thd", _softmax(scores, None if sinks is None else sinks[heads]),
                                         v[:, 0])
        return out
    # GQA: the query heads of one group index j at a time (query head h = kv * group + j) against the KV heads as
    # they are (session 38): no rows repeated per query head (4 [S, H, D] copies before, 2.1 GB each on gpt-oss-120b at
    # 131072 positions) and [Hkv, T, S] scores at once, not [H, T, S]. A product a group index keeps the per-head
    # products' shape, so their bits: one over group * T rows (a grouped einsum) rounds a decode step's otherwise and
    # moved a CPU oracle's greedy decode
    qg, kt = q.view(T, Hkv, group, Dk), k.permute(1, 2, 0)
    out = q.new_empty(T, Hkv, group, Dv)
    sinks_g = None if sinks is None else sinks.view(Hkv, group)  # [kv, j]: query head kv * group + j's sink
    for j in range(group):
        scores = torch.bmm(qg[:, :, j].transpose(0, 1), kt).mul_(scale).masked_fill_(masked, float("-inf"))
        probs = _softmax(scores, None if sinks_g is None else sinks_g[:, j])
        out[:, :, j] = torch.einsum("hts,shd->thd", probs, v)
    return out.view(T, H, Dv)


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the keys (the last dim) of scores [..., T, S], with one more logit a head (sinks: scores' head
    dims) in the denominator."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    S = scores.shape[-1]
    sink = sinks.to(scores.dtype)[..., None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S]


# torch's memory-efficient kernel first (float32 as 3xTF32 on the tensor cores: float32's error, without the
# [H, T, S] scores in memory); where it cannot take the inputs, its math kernel (attend's ops)
SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# attend_sdpa's operands on CUDA where the cache keeps float16 rows: "half" (default since session 45) the queries
# times the scale rounded to float16 over the cache's rows as they are, float32 sums inside the kernel (llama.cpp's
# attention on CUDA: float16 K and V, its KQ on float16 operands); "float32" the queries' float32, the keys and values
# widened to it (3xTF32). H100, gpt-oss-20b's heads: 2.2x / 3.0x at 2000 / 8000 tokens, 1.4x over the 128 window,
# 3.4e-4 of float32's output; the 4-layer gpt-oss-20b F16 file's prompt 1.08x / 1.21-1.30x, its logits moved no more
# than a one-ulp nudge of float32's queries moves them (that random file amplifies either to 0.2-0.4; session 45)
SDPA_PRECISION = switches.choice("SPARKD_SDPA_PRECISION", ("float32", "half"), "half")


SINK_DIMS = 8  # attend_sdpa's key dimensions added for sinks: one holds the sink, the rest keep Dk a multiple of 8


def with_sink_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v with each head's sink as a key (session 41): key 0 of every KV head is the unit vector of one more
    dimension, in which query head h holds sinks[h] / scale, so its scaled score is the sink's logit, and its value is
    0. The softmax's denominator then has the sink's term besides the keys', as attend's _softmax, and no scores are
    held. q [T, H, Dk + SINK_DIMS], k [1 + S, Hkv, Dk + SINK_DIMS], v [1 + S, Hkv, Dv] in q's dtype (the cache's
    float16 rows widened by the copy)."""
    T, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    qs = q.new_zeros(T, H, Dk + SINK_DIMS)
    qs[..., :Dk] = q
    qs[..., Dk] = sinks.to(q.dtype) / scale
    ks = q.new_zeros(1 + S, Hkv, Dk + SINK_DIMS)
    ks[1:, :, :Dk] = k
    ks[0, :, Dk] = 1.0
    vs = q.new_empty(1 + S, Hkv, Dv)
    vs[0] = 0.0
    vs[1:] = v
    return qs, ks, vs


def attend_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, start: int | torch.Tensor = 0,
                window: int = 0, masks: dict | None = None, key_pos: torch.Tensor | None = None,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
    """attend without keep through torch's scaled_dot_product_attention (SDPA_BACKENDS): q [T, H, Dk],
    k [S, Hkv, Dk], v [S, Hkv, Dv] → [T, H, Dv]. start as attend's: a host start (S = start + T) or the queries'
    positions [T] on the device (a continued prompt graph: S a span, keys past a query's position masked). From
    position 0 without a window the kernel's own causal mask; from a host start past 0 without a window (an eager
    continuation: the prompt cache past the graphs' 2048 rows, a streamed prompt's later chunks) SDPA's
    bottom-right causal mask (no mask in memory, the key blocks past the diagonal skipped; CONTINUE_ATTENTION
    "sdpa-mask" takes the boolean one there); else a boolean [T, S] mask (key s visible to the query at p: s <= p
    and p - s < window). All three give the same bits for the same keys (H200, prefill31: 36 shapes; the GPU
    test), so a continued graph that ends at its span keeps the eager continuation's bits. A sliding window from a
    host start over more than window_block(window) queries runs in blocks instead (attend_window_blocks: its rows
    past the first block within attend's float64 bound, not compared bit for bit with the boolean mask's). masks and
    key_pos as attend's. sinks [H] (gpt-oss): with_sink_key's key first, the bottom-right causal mask over it from position 0
    without a window, else the boolean mask with its column (past position 0 the bottom-right mask over the one more
    key gave other bits than the boolean mask a continued graph takes: H100, session 41)."""
    if SDPA_PRECISION == "half" and q.is_cuda and q.dtype == torch.float32 and k.dtype == torch.float16:
        # scaled first: float16's range then holds scores, not sqrt(Dk) times them
        return attend_sdpa((q * scale).half(), k, v, 1.0, start, window, masks, key_pos, sinks).float()
    if window and isinstance(start, int) and q.shape[0] > window_block(window):
        return attend_window_blocks(q, k, v, scale, start, window, masks, sinks)
    sink = sinks is not None
    if sink:
        q, k, v = with_sink_key(q, k, v, sinks, scale)
    T, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    group = H // Hkv
    # GQA as a batch of Hkv KV heads of `group` query heads each, the keys and values broadcast over the group with
    # stride 0: no rows repeated per query head. The memory-efficient kernel takes that form (torch says so) and on
    # the H100 it was as fast as the rows repeated or faster (8000 x 8000, 32 / 4 heads: 11.5 vs 11.8 ms, 252 vs
    # 504 MiB; bench/sdpa_gqa_bench.py, session 40). Float16 cache rows are widened first: Hkv heads, not H.
    q4 = q.view(T, Hkv, group, Dk).permute(1, 2, 0, 3)
    k4 = k.to(q.dtype).permute(1, 0, 2)[:, None].expand(Hkv, group, S, Dk)
    v4 = v.to(q.dtype).permute(1, 0, 2)[:, None].expand(Hkv, group, S, Dv)
    host = isinstance(start, int) and not window
    # the kernel's own causal mask from 0 (not over a sink key: key 0 then sits before every query); the bottom-right
    # mask from 0 with a sink key, and past 0 without one (CONTINUE_ATTENTION); the boolean mask everywhere else
    causal = host and start == 0 and not sink
    if causal:
        mask = None
    elif host and (start == 0 if sink else CONTINUE_ATTENTION == "sdpa"):
        # imported here: torch.nn.attention.bias imports triton, which CPU-path modules must not at import time
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(T, S)
    else:
        mask = forward_mask(masks, True, start, T, S - 1 if sink else S, window, q.device, key_pos, sink)
    with sdpa_kernel(SDPA_BACKENDS):
        o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=causal, scale=scale)
    return o.permute(2, 0, 1, 3).reshape(T, H, Dv)


# a windowed prompt's queries a block (attend_window_blocks), at least the window: the H100, gpt-oss-20b's heads, its
# 128 window over 8000 queries: 2.50 ms at 128, 3.18 at 256, 4.62 at 512, 50.7 whole (bench/gpu_box/sink_sdpa_bench.py)
WINDOW_BLOCK = 128


def window_block(window: int) -> int:
    """attend_window_blocks' queries a block for a sliding window: WINDOW_BLOCK, or the window where it is wider (so
    the keys of the blocks past the first start at key 0 or later)."""
    return max(WINDOW_BLOCK, window)


def attend_window_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, start: int, window: int,
                         masks: dict | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """attend_sdpa over a sliding window from a host start, in blocks of B = window_block(window) queries each over
    only the keys its window reaches (B + window - 1), not every key: O(T x (B + window)) work, where the boolean
    [T, S] mask made the kernel read every key block (gpt-oss's 128-wide window layers, session 42). The first block
    runs attend_sdpa's boolean mask (the keys from 0); the rest run as one batch of blocks, [Hkv x blocks] broadcast
    over each KV head's query group, under one [B, keys] mask every block shares; sinks as with_sink_key's key first
    in every block. The last block's padding queries are dropped; its keys past the last are clamped to it (future
    keys to every real query: masked)."""
    T, H, Dk = q.shape
    S, Hkv, Dv = v.shape
    B, group, E = window_block(window), H // Hkv, window - 1  # E: the keys before a query its window reaches
    out = q.new_empty(T, H, Dv)
    out[:B] = attend_sdpa(q[:B], k[:start + B], v[:start + B], scale, start, window, masks, None, sinks)
    nb, L, s = -(-(T - B) // B), B + E, int(sinks is not None)  # blocks past the first, keys a block, a sink key
    # block b's keys: from key start + B * (b + 1) - E (>= 0: B >= window) on, L of them
    first = start + B - E + B * torch.arange(nb, device=q.device)
    keys = (first[:, None] + torch.arange(L, device=q.device)).clamp_(max=S - 1)  # [nb, L]
    Dq = Dk + s * SINK_DIMS
    kb, vb = q.new_zeros(Hkv, nb, s + L, Dq), q.new_zeros(Hkv, nb, s + L, Dv)  # [KV head, block, key, dim]
    kb[:, :, s:, :Dk] = k.permute(1, 0, 2)[:, keys]
    vb[:, :, s:] = v.permute(1, 0, 2)[:, keys]
    qb = q.new_zeros(Hkv, nb, group, B, Dq)  # [KV head, block, group index, query, dim]
    view = qb.permute(1, 3, 0, 2, 4)  # [block, query, KV head, group index, dim]: qb's rows in q's order
    full = (nb - 1) * B  # the queries of the blocks before the last
    view[:nb - 1, ..., :Dk] = q[B:B + full].view(nb - 1, B, Hkv, group, Dk)
    view[nb - 1, :T - B - full, ..., :Dk] = q[B + full:].view(-1, Hkv, group, Dk)
    if s:  # with_sink_key's key, first in every block
        qb[..., Dk] = (sinks.to(q.dtype) / scale).view(Hkv, 1, group, 1)
        kb[:, :, 0, Dk] = 1.0
    mask = _block_mask(masks, B, E, s, q.device)
    with sdpa_kernel(SDPA_BACKENDS):
        o = F.scaled_dot_product_attention(qb.view(Hkv * nb, group, B, Dq),
                                           kb.view(Hkv * nb, 1, s + L, Dq).expand(-1, group, -1, -1),
                                           vb.view(Hkv * nb, 1, s + L, Dv).expand(-1, group, -1, -1),
                                           attn_mask=mask, scale=scale)
    o = o.view(Hkv, nb, group, B, Dv).permute(1, 3, 0, 2, 4)  # [block, query, KV head, group index, dim]
    out[B:B + full].view(nb - 1, B, Hkv, group, Dv).copy_(o[:nb - 1])
    out[B + full:].view(-1, Hkv, group, Dv).copy_(o[nb - 1, :T - B - full])
    return out


def _block_mask(masks: dict | None, B: int, E: int, sink: int, device: torch.device) -> torch.Tensor:
    """attend_window_blocks' [B, sink + B + E] visible mask (from masks where a layer before made it): query i of a
    block reads its keys i to i + E (the block's first query sits at key E), and the sink key first where there is
    one."""
    key = ("blocks", B, E, sink)
    if masks is not None and key in masks:
        return masks[key]
    i, j = torch.arange(B, device=device)[:, None], torch.arange(B + E, device=device)[None, :]
    mask = F.pad((j >= i) & (j <= i + E), (sink, 0), value=True)
    if masks is not None:
        masks[key] = mask
    return mask


FUSE_QKV_ENV = "SPARKD_FUSED_QKV"


# a prompt's attention on CUDA (several tokens): "sdpa" (default, session 14, prefill29) attend_sdpa, torch's
# memory-efficient kernel, for a prompt from position 0 and for one continuing the cache with CONTINUE_SDPA_ROWS
# queries or more (CONTINUE_ATTENTION; sinks as a key since session 41, attend before); "torch" attend's ~30 ops
# (the way before: the [H, T, S] float32 scores in memory, growing as T x S); "kernel" (session 11, attn11)
# kernels/prefill_attention in one launch, each query row's bits whatever the prompt's length (a prompt padded to its
# graph bucket keeps the eager prompt's bits), but 16x torch's GPU time on the H200 as it stands (performance.md)
PREFILL_ATTENTION = switches.choice("SPARKD_PREFILL_ATTENTION", ("sdpa", "kernel", "torch"), "sdpa")
# a prompt continuing the cache (a host start past 0: the prompt cache's next turn eagerly, a streamed prompt's
# later chunks; or a continued prompt graph's device positions) under sdpa: "sdpa" (default, session 15,
# prefill31) attend_sdpa from CONTINUE_SDPA_ROWS queries on, attend below (the kernel runs a block per 64 queries
# and head: few queries over many keys leave the GPU idle), its eager continuations through SDPA's bottom-right
# causal mask (session 17; prefill31: 1.08-1.75x over the boolean mask, the same bits; the H200, 12 layers, a chat's
# turn of 4096 tokens with 1024 cached: 124.3 ms to its first token against 156.3, the whole prompt 153.9); "sdpa-mask" the
# same with the boolean mask for every continuation (session 15-16); "torch": attend at every length (session 14).
# H200, one layer of 32 heads over 4 KV heads of 128 over 512-4096 cached keys: attend / sdpa 0.49-0.79x at 16-64
# queries, 1.01-1.12x at 128, 1.21-1.75x at 192-2048, eager and in a continued graph
CONTINUE_ATTENTION = switches.choice("SPARKD_CONTINUE_ATTENTION", ("sdpa", "sdpa-mask", "torch"), "sdpa")
CONTINUE_SDPA_ROWS = 128


def continue_sdpa(rows: int) -> bool:
    """Whether a prompt of `rows` queries (a continued graph's: its bucket) continuing the cache on CUDA runs
    attend_sdpa (no [H, rows, S] scores in memory)."""
    return PREFILL_ATTENTION == "sdpa" and CONTINUE_ATTENTION != "torch" and rows >= CONTINUE_SDPA_ROWS


def fuse_qkv_default() -> bool:
    """$SPARKD_FUSED_QKV: "0" or "off" builds q, k and v as three projections; "1", "on" (or unset) stacks them."""
    return switches.flag(FUSE_QKV_ENV, True)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads and a KV cache.

    fuse_qkv (None: fuse_qkv_default()): stack wq, wk, wv into one wqkv where KernelLinear.stack
    can, else wq and wk into wqk (a Q4_K_M file's attn_v is often Q6_K); the stacked ones are None."""

    def __init__(self, il: int, n_head: int, n_head_kv: int, head_dim: int, rope: RopeConfig,
                 wq: Linear, wk: Linear, wv: Linear, wo: Linear,
                 q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None,
                 scale: float | None = None, window: int = 0, sinks: torch.Tensor | None = None,
                 fuse_qkv: bool | None = None):
        super().__init__()
        self.il, self.n_head, self.n_head_kv, self.head_dim = il, n_head, n_head_kv, head_dim
        self.rope, self.window = rope, window
        self.scale = scale if scale else head_dim ** -0.5
        fuse = fuse_qkv_default() if fuse_qkv is None else fuse_qkv
        self.wqkv = KernelLinear.stack([wq, wk, wv]) if fuse else None
        self.wqk = KernelLinear.stack([wq, wk]) if fuse and self.wqkv is None else None
        if self.wqkv is not None or self.wqk is not None:
            wq = wk = None  # their rows live in the stack now
        if self.wqkv is not None:
            wv = None
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.q_norm, self.k_norm = q_norm, k_norm
        self.sinks = None if sinks is None else nn.Parameter(sinks, requires_grad=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, parts: bool = False) -> torch.Tensor:
        # x: [T, D]; pos: [T] absolute positions; parts (one token): the output projection's split-K
        # partials [S, D] for the norm after it to add (KernelLinear.forward_parts)
        T = x.shape[0]
        q, k, v = self._qkv(x)
        q = q.view(T, self.n_head, self.head_dim)
        k = k.view(T, self.n_head_kv, self.head_dim)
        v = v.view(T, self.n_head_kv, -1)
        # the decode kernels serve the static (CUDA graph) step and, unless switched off, the eager one
        one = T == 1 and fused.one_token(cache.span is not None)
        if one and self._one_launch(x, q, k, v, pos, cache):
            o = self._rope_attention(q, k, v, pos, cache)
        else:
            o = self._attend(x, q, k, v, pos, cache, one)
        o = o.reshape(T, -1)
        if parts and T == 1 and isinstance(self.wo, KernelLinear):
            return self.wo.forward_parts(o)
        return self.wo(o)  # (parts: one token's [1, D], a single part)

    def _attend(self, x, q, k, v, pos, cache, one: bool) -> torch.Tensor:
        """Rope, the KV write and attention as separate steps: the decode kernels (rope_kv, decode_attention)
        where switched on, else torch (the prompt's kernels for T > 1) → [T, H, Dv]."""
        T = x.shape[0]
        if one and fused.active("rope_kv", x) and self._rope_kv_fits(q, k, v):
            q, k_all, v_all, start = self._rope_kv(q, k, v, pos, cache)
            key_pos = cache.ring_keys(self.il, start) if cache.ring[self.il] else None
        else:
            q, k = self._qk_norms(q, k)
            cos, sin = cache.rope(self.rope, pos)
            q = apply_rope(q, cos, sin, self.rope.neox)
            k = apply_rope(k, cos, sin, self.rope.neox)
            if cache.ring[self.il]:  # start: the ring's rows read, or positions (static) with the keys' (key_pos)
                k_all, v_all, start, key_pos = cache.ring_append(self.il, pos, k, v)
            else:
                k_all, v_all, start = cache.append(self.il, pos, k, v)  # start: host int, or positions (static)
                key_pos = None
        if one and fused.active("attention", x) and v_all is not None and q.dtype == torch.float32:
            from sparkd.engine.kernels.decode_attention import decode_attention

            k_all, v_all, dpos = cache.decode_rows(self.il, pos)
            o = decode_attention(q, k_all, v_all, dpos, self.scale, self.window, self.sinks, ring=cache.ring[self.il])
        elif (T > 1 and PREFILL_ATTENTION == "kernel" and x.is_cuda and isinstance(start, int)
              and v_all is not None and q.dtype == torch.float32):
            from sparkd.engine.kernels.prefill_attention import prefill_attention

            o = prefill_attention(q, k_all, v_all, start, self.scale, self.window, self.sinks)
        elif (T > 1 and PREFILL_ATTENTION == "sdpa" and x.is_cuda and v_all is not None
              and (isinstance(start, int) and start == 0 or continue_sdpa(T)) and q.dtype == torch.float32):
            o = attend_sdpa(q, k_all, v_all, self.scale, start, self.window, cache.masks, key_pos, self.sinks)
        else:
            o = attend(q, k_all, v_all, self.scale, start, self.window, self.sinks, masks=cache.masks,
                       key_pos=key_pos)  # [T, H, Dv]
        return o

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.wqkv is not None:
            return self.wqkv(x).split(self.wqkv.parts, dim=-1)  # views of one [T, q+k+v] result
        if self.wqk is not None:
            return *self.wqk(x).split(self.wqk.parts, dim=-1), self.wv(x)
        return self.wq(x), self.wk(x), self.wv(x)

    def _one_launch(self, x, q, k, v, pos, cache) -> bool:
        """Whether a one-token step runs rope, the KV write and attention in one launch (kernels/rope_attention):
        rope_attention, rope_kv and attention switched on, a value cache, rows rope_kv takes, and a static step's
        bucket of at most fused.ROPE_ATTENTION_SPAN rows. An eager step (its position a host value) counts the rows
        up to its position instead, so it takes the static step's launches, and bits, at every position: the
        buckets double from a power of two, so that span is a bucket's end."""
        rows = cache.span if cache.span is not None else int(pos[0]) + 1
        return (all(fused.active(name, x) for name in ("rope_attention", "rope_kv", "attention"))
                and cache.v[self.il] is not None and self._rope_kv_fits(q, k, v)
                and rows <= fused.ROPE_ATTENTION_SPAN)

    def _rope_kv_fits(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        return (all(t.dtype == torch.float32 and t.stride(-1) == 1 for t in (q, k, v))
                and self.rope.n_rot <= self.head_dim)

    def _qk_norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = q if self.q_norm is None else self.q_norm(q)
        return q, k if self.k_norm is None else self.k_norm(k)

    def _rope_kv(self, q, k, v, pos, cache):
        """q/k norms (where both exist), rope on q and k and the k/v rows written at pos, in one
        launch (see kernels/rope_kv)."""
        from sparkd.engine.kernels.rope_kv import rope_kv

        q, k, norms = self._norms_folded(q, k)
        cos, sin = cache.rope_table(self.rope)
        k_all, v_all, dpos = cache.decode_rows(self.il, pos)
        q = rope_kv(q, k, v, cos, sin, dpos, cache.k[self.il], cache.v[self.il], self.rope.neox, norms,
                    ring=cache.ring[self.il])
        return q, k_all, v_all, dpos

    def _rope_attention(self, q, k, v, pos, cache):
        """The q/k norms, rope, the k/v rows written at pos and attention, in one launch (kernels/rope_attention)."""
        from sparkd.engine.kernels.rope_attention import rope_attention

        q, k, norms = self._norms_folded(q, k)
        cos, sin = cache.rope_table(self.rope)
        k_all, v_all, dpos = cache.decode_rows(self.il, pos)
        return rope_attention(q, k, v, cos, sin, dpos, k_all, v_all, self.rope.neox, norms, self.scale,
                              self.window, self.sinks, ring=cache.ring[self.il])

    def _norms_folded(self, q, k):
        """(q, k, norms): the q/k RMSNorms' (weights, eps) for a decode kernel to apply where both fold (float32
        weights of one head's width, one eps), else q and k normalised here and norms None."""
        qn, kn = self.q_norm, self.k_norm
        fold = (isinstance(qn, RMSNorm) and isinstance(kn, RMSNorm) and qn.eps == kn.eps
                and qn.weight.dtype == kn.weight.dtype == torch.float32
                and qn.weight.shape == kn.weight.shape == (self.head_dim,))
        if fold:
            return q, k, (qn.weight, kn.weight, qn.eps)
        return *self._qk_norms(q, k), None
