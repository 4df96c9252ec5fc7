"""DeepSeek V4 attention (llama.cpp deepseek4.cpp build_attention_impl).

One shared key/value head (the roped, normalised `kv` row is key and value), a low-rank query
with a per-head RMS norm, rope on the last n_rot dims, learned sinks and a sliding window over
the raw rows. Compressed layers also attend to compressed entries: ratio 128 (HCA) to every
complete one, ratio 4 (CSA) to the lightning indexer's top-k. The output is de-roped, then
projected per group of heads to a low rank (wo_a) and back to the model width (wo_b).

The raw rows a query reads are its window's only, so a layer keeps the last `window` of them (WindowRows, as
llama.cpp's sliding-window cache for them): since session 36, not a row per position of the context (DeepSeek V4
Flash at its 1M context: 92 GB of float32 rows before, 11 MB now).
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.kv_compressor import Compressor, rope_tail
from sparkd.engine.layers.dsv4_indexer import CompressedIndexer
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm, rms_normalize
from sparkd.engine.layers.rope import RopeConfig


def attend_extra(q: torch.Tensor, k: torch.Tensor, start: int | torch.Tensor, window: int, sinks: torch.Tensor,
                 scale: float, extra: torch.Tensor | None = None, extra_ok: torch.Tensor | None = None,
                 k_pos: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D] at positions start.. (a host int; or a static step's positions [T] on the device); k [S, D] raw
    rows (also the values) of positions k_pos [S] (None: 0..S-1; those < 0 are masked); extra the compressed
    entries: [C, D] every query may read, or [T, K, D] each query's own (the indexer's selection), with extra_ok
    ([T, C] or [T, K]) saying which each query sees. One softmax over both and the sink."""
    T, H, _ = q.shape
    pos_q = (start if isinstance(start, torch.Tensor) else torch.arange(start, start + T, device=q.device))[:, None]
    pos_k = (torch.arange(k.shape[0], device=q.device) if k_pos is None else k_pos)[None, :]
    masked = (pos_k > pos_q) | ((pos_q - pos_k) >= window) | (pos_k < 0)
    # scaled and masked in place, the parts let go once joined: a prompt holds two [H, T, S + C + 1] tensors at a
    # time at most (deepseek4.attention_floats counts them)
    parts = [torch.einsum("thd,sd->hts", q, k).mul_(scale).masked_fill_(masked, float("-inf"))]
    own = extra is not None and extra.dim() == 3  # each query's own entries
    if extra is not None and extra.shape[-2]:
        sc = torch.einsum("thd,tcd->htc" if own else "thd,cd->htc", q, extra)
        parts.append(sc.mul_(scale).masked_fill_(~extra_ok, float("-inf")))
        del sc
    parts.append(sinks.to(parts[0].dtype)[:, None, None].expand(H, T, 1))
    scores = torch.cat(parts, dim=-1)
    parts.clear()
    probs = torch.softmax(scores, dim=-1)
    del scores
    o = torch.einsum("hts,sd->thd", probs[..., :k.shape[0]], k)
    if extra is not None and extra.shape[-2]:
        o = o + torch.einsum("htc,tcd->thd" if own else "htc,cd->thd", probs[..., k.shape[0]:-1], extra)
    return o


class WindowRows:
    """One layer's raw key rows of the last `window` positions, a ring: slot p % window holds position p's row, and
    `pos` the position each slot holds (-1: none yet, masked by attend_extra)."""

    def __init__(self, window: int, dim: int, device: torch.device | str = "cpu"):
        self.rows = torch.zeros(window, dim, device=device)
        self.pos = torch.full((window,), -1, dtype=torch.long, device=device)

    def reset(self) -> None:
        self.pos.fill_(-1)  # (the rows need no clearing: no slot is read before it is written)

    def write(self, pos: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows [n, dim] of positions pos [n] on the device, n at most the window (each its own slot)."""
        slots = pos % self.pos.shape[0]
        self.rows.index_copy_(0, slots, rows)
        self.pos.index_copy_(0, slots, pos)


class DSV4Attention(nn.Module):
    def __init__(self, il: int, n_head: int, head_dim: int, rms_eps: float, window: int,
                 rope: RopeConfig, wq_a: Linear, q_a_norm: RMSNorm, wq_b: Linear, wkv: Linear,
                 kv_norm: RMSNorm, sinks: torch.Tensor, wo_a: Linear, o_groups: int,
                 wo_b: Linear, compressor: Compressor | None = None,
                 indexer: CompressedIndexer | None = None):
        super().__init__()
        self.il, self.n_head, self.head_dim, self.eps, self.window = il, n_head, head_dim, rms_eps, window
        self.rope = rope
        self.wq_a, self.q_a_norm, self.wq_b, self.wkv, self.kv_norm = wq_a, q_a_norm, wq_b, wkv, kv_norm
        self.sinks = nn.Parameter(sinks, requires_grad=False)
        self.wo_a, self.o_groups, self.wo_b = wo_a, o_groups, wo_b  # wo_a: G matrices [R, H/G * Dh] stacked
        self.compressor, self.indexer = compressor, indexer

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        T, H, Dh = x.shape[0], self.n_head, self.head_dim
        qr = self.q_a_norm(self.wq_a(x))
        q = rope_tail(rms_normalize(self.wq_b(qr).view(T, H, Dh), self.eps), self.rope, pos, cache=cache)
        kv = rope_tail(self.kv_norm(self.wkv(x))[:, None, :], self.rope, pos, cache=cache)[:, 0]  # [T, Dh]
        rows, rows_pos, start = self._window(kv, pos, cache)
        extra, ok = self._compressed(x, qr, pos, cache)
        o = attend_extra(q, rows, start, self.window, self.sinks, Dh ** -0.5, extra, ok, rows_pos)
        o = rope_tail(o, self.rope, pos, inverse=True, cache=cache)  # [T, H, Dh]
        oa = self.wo_a.grouped(o.reshape(T, self.o_groups, -1))  # [T, G, R]: group g's heads through matrix g
        return self.wo_b(oa.reshape(T, -1))

    def _window(self, kv: torch.Tensor, pos: torch.Tensor, cache: KVCache):
        """(the raw rows this step attends over, their positions on the device, start: a host int, or a static
        step's position [1] on the device) with kv [T, Dh] written into the layer's window: a token's first (the
        window then holds every row it reads); a prompt's after its queries read the window's rows and its own."""
        win = cache.window_rows(self.il)
        if cache.span is not None:
            win.write(pos, kv)
            return win.rows, win.pos, pos
        start, T = int(pos[0]), kv.shape[0]
        new = torch.arange(start, start + T, device=kv.device)  # (made there: no host copy)
        if T == 1:
            win.write(new, kv)
            return win.rows, win.pos, start
        rows, rows_pos = torch.cat([win.rows, kv]), torch.cat([win.pos, new])
        keep = min(T, self.window)
        win.write(new[-keep:], kv[-keep:])
        return rows, rows_pos, start

    def _compressed(self, x, qr, pos, cache) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """attend_extra's (extra, extra_ok): the compressed entries and which each query sees; a CSA layer past its
        indexer's top-k, each query's selected entries only (not every entry masked: at DeepSeek V4 Flash's 64k
        context a token's attention read 16384 entries a CSA layer, 512 now)."""
        if self.compressor is None:
            return None, None
        entries, visible = self.compressor(x, pos, cache.compressor_state(self.il, "attn"), cache)
        if self.indexer is None:
            return entries, visible
        picked = self.indexer(x, qr, pos, cache.compressor_state(self.il, "indexer"), visible, cache)
        if picked is None:  # no more entries than the top-k: every visible one is selected
            return entries, visible
        ids, ok = picked
        return entries[ids], ok  # [T, K, D]
