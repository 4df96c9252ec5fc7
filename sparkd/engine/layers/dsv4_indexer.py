"""DeepSeek V4's lightning indexer over compressed entries (llama.cpp build_lid_top_k): picks, per
query, the top-k compressed entries a CSA layer attends to.

score[t, c] = Σ_h relu(q[t, h] · k[c]) * w[t, h], w = proj(x) / sqrt(heads · head_dim), with the
indexer query projected from the normalised low-rank query and roped like the compressed keys;
entries not yet complete at t's position never count. (llama.cpp multiplies q and k by the same
orthonormal Hadamard matrix first; dot products do not change. Exact ties, e.g. two entries
whose relu terms are all 0, break by sort order, which differs from ggml's partial_sort.)
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.kv_compressor import Compressor, CompressorState, rope_tail
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.rope import RopeConfig


class CompressedIndexer(nn.Module):
    def __init__(self, n_head: int, head_dim: int, top_k: int, wq_b: Linear, proj: Linear,
                 compressor: Compressor, rope: RopeConfig):
        super().__init__()
        self.n_head, self.head_dim, self.top_k = n_head, head_dim, top_k
        self.wq_b, self.proj, self.compressor, self.rope = wq_b, proj, compressor, rope

    def forward(self, x: torch.Tensor, qr: torch.Tensor, pos: torch.Tensor, st: CompressorState,
                visible: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each query's top-k entries: (ids [T, top_k] into the C entries so far, selected [T, top_k]: those of them
        visible [T, C] to the query); None where there are no more than top_k entries (every visible one is
        selected: nothing to score). The compressor's state advances either way. cache: its rope table
        (rope_tail)."""
        keys = self.compressor(x, pos, st, cache)[0]  # [C, Di]
        if keys.shape[0] <= self.top_k:
            return None
        T = x.shape[0]
        q = rope_tail(self.wq_b(qr).view(T, self.n_head, self.head_dim), self.rope, pos, cache=cache)
        w = self.proj(x) * (self.head_dim * self.n_head) ** -0.5  # [T, Hi]
        # relu(q . k) * w summed over the heads, in place: one [T, Hi, C] at a time, let go once summed
        score = torch.einsum("thd,cd->thc", q, keys).relu_().mul_(w[..., None]).sum(1)
        score = score.masked_fill_(~visible, float("-inf"))  # [T, C]
        ids = score.topk(self.top_k, dim=1).indices
        return ids, visible.gather(1, ids)
