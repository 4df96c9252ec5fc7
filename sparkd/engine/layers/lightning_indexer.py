"""DeepSeek Sparse Attention's lightning indexer (GLM-5 `glm-dsa`): which past positions each
query's MLA attention may read.

    score[t, s] = sum_h relu(q[t, h] . k[s]) * w[t, h] / sqrt(Dh * H)

q (H heads of Dh) comes from the query latent through indexer.attn_q_b, the single key head from
the block input through indexer.attn_k and a LayerNorm; both are roped (normal pairs) on their
first n_rot dims. w = indexer.proj(x). Each query keeps its top_k best causally visible positions,
all of them while fewer than top_k are visible — llama.cpp's ggml_top_k over the masked scores.

llama.cpp also multiplies q and k by a Walsh-Hadamard matrix before the keys are cached; it is
orthonormal, so q . k is unchanged (it is there to make quantized key caches accurate) and we skip
it. The keys are cached per position as the cache's side rows ("dsa_keys", layer). GLM-5.2's
"shared" layers have no indexer: they reuse the selection of the previous full layer in the same
forward pass, which the full layer leaves in cache.scratch.

Static decode (KVCache.span set: a CUDA graph's step, or a streamed step's segment; session 32) writes the key at
the device position and scores the span's keys, those past the position masked: the selection of the eager step
(the top_k best visible positions, or every visible one while fewer are), without a host position.
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import LayerNorm
from sparkd.engine.layers.rope import apply_rope
from sparkd.engine.layers.rope import RopeConfig

SIDE_KEYS = "dsa_keys"
_SELECTION = "dsa_keep"


def select_top_k(scores: torch.Tensor, pos: torch.Tensor, top_k: int) -> torch.Tensor:
    """scores: [T, S] for queries at positions pos [T] (on scores' device) → [T, S] bool, the kept positions."""
    S = scores.shape[1]
    visible = torch.arange(S, device=scores.device)[None, :] <= pos[:, None]
    ids = scores.masked_fill(~visible, float("-inf")).topk(min(top_k, S), dim=-1).indices
    chosen = torch.zeros_like(visible).scatter_(1, ids, True)
    return chosen & visible  # picks among -inf (fewer visible than top_k) stay causally masked


class LightningIndexer(nn.Module):
    def __init__(self, il: int, n_head: int, head_dim: int, top_k: int, rope: RopeConfig,
                 wq_b: Linear, wk: Linear, k_norm: LayerNorm, weights_proj: Linear):
        super().__init__()
        self.il, self.n_head, self.head_dim, self.top_k = il, n_head, head_dim, top_k
        self.rope = rope
        self.wq_b, self.wk, self.k_norm, self.weights_proj = wq_b, wk, k_norm, weights_proj

    def forward(self, x: torch.Tensor, q_lat: torch.Tensor, pos: torch.Tensor,
                cache: KVCache) -> torch.Tensor | None:
        # x: [T, D] block input (normed), q_lat: [T, Rq] query latent → kept positions [T, S]
        T = x.shape[0]
        q = self.wq_b(q_lat).view(T, self.n_head, self.head_dim)
        k = self.k_norm(self.wk(x)).view(T, 1, self.head_dim)
        cos, sin = cache.rope(self.rope, pos)
        q = apply_rope(q, cos, sin, neox=False)
        k = apply_rope(k, cos, sin, neox=False)
        k_all, pos = cache.append_side(SIDE_KEYS, self.il, pos, k[:, 0])  # [S, Dh], positions on x's device
        keep = None  # up to top_k positions every visible one is kept: the causal mask alone
        if k_all.shape[0] > self.top_k:
            w = self.weights_proj(x) * (self.head_dim * self.n_head) ** -0.5  # [T, H]
            per_head = torch.einsum("thd,sd->ths", q, k_all).relu()  # [T, H, S]
            keep = select_top_k(torch.einsum("ths,th->ts", per_head, w), pos, self.top_k)
        cache.scratch[_SELECTION] = keep
        return keep


class SharedSelection(nn.Module):
    """A GLM-5.2 "shared" layer: the selection of the previous full indexer layer."""

    def forward(self, x: torch.Tensor, q_lat: torch.Tensor, pos: torch.Tensor,
                cache: KVCache) -> torch.Tensor | None:
        return cache.scratch[_SELECTION]
