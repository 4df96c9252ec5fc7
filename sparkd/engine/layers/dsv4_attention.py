"""DeepSeek V4 attention (llama.cpp deepseek4.cpp build_attention_impl).

One shared key/value head (the roped, normalised `kv` row is key and value), a low-rank query
with a per-head RMS norm, rope on the last n_rot dims, learned sinks and a sliding window over
the raw rows. Compressed layers also attend to compressed entries: ratio 128 (HCA) to every
complete one, ratio 4 (CSA) to the lightning indexer's top-k. The output is de-roped, then
projected per group of heads to a low rank (wo_a) and back to the model width (wo_b).
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
    rows (also the values) of positions k_pos [S] (None: 0..S-1; those < 0 are masked); extra [C, D] compressed
    entries with extra_ok [T, C] saying which each query sees. One softmax over both and the sink."""
    T, H, _ = q.shape
    pos_q = (start if isinstance(start, torch.Tensor) else torch.arange(start, start + T, device=q.device))[:, None]
    pos_k = (torch.arange(k.shape[0], device=q.device) if k_pos is None else k_pos)[None, :]
    masked = (pos_k > pos_q) | ((pos_q - pos_k) >= window) | (pos_k < 0)
    scores = torch.einsum("thd,sd->hts", q, k).mul(scale).masked_fill(masked, float("-inf"))
    values = k
    if extra is not None and extra.shape[0]:
        sc = torch.einsum("thd,cd->htc", q, extra).mul(scale).masked_fill(~extra_ok, float("-inf"))
        scores, values = torch.cat([scores, sc], dim=-1), torch.cat([k, extra])
    sink = sinks.to(scores.dtype)[:, None, None].expand(H, T, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("hts,sd->thd", probs, values)


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
        kv = rope_tail(self.kv_norm(self.wkv(x))[:, None, :], self.rope, pos, cache=cache)  # [T, 1, Dh]
        k_all, _, start = cache.append(self.il, pos, kv, None)  # start: a host int, or a static step's pos
        rows, rows_pos = k_all[:, 0], None
        if cache.span is not None and cache.span > self.window:  # a static step reads its window's rows, not the span's
            rows_pos = start + torch.arange(1 - self.window, 1, device=x.device)  # [window], the first ones maybe < 0
            rows = rows.index_select(0, rows_pos.clamp(min=0))
        extra, ok = self._compressed(x, qr, pos, cache)
        o = attend_extra(q, rows, start, self.window, self.sinks, Dh ** -0.5, extra, ok, rows_pos)
        o = rope_tail(o, self.rope, pos, inverse=True, cache=cache)  # [T, H, Dh]
        oa = self.wo_a.grouped(o.reshape(T, self.o_groups, -1))  # [T, G, R]: group g's heads through matrix g
        return self.wo_b(oa.reshape(T, -1))

    def _compressed(self, x, qr, pos, cache) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.compressor is None:
            return None, None
        entries, visible = self.compressor(x, pos, cache.compressor_state(self.il, "attn"), cache)
        if self.indexer is None:
            return entries, visible
        chosen = self.indexer(x, qr, pos, cache.compressor_state(self.il, "indexer"), visible, cache)
        return entries, chosen
