"""Multi-head latent attention (DeepSeek V2/V3, Kimi K2) with the compressed latent KV cache.

Only the normalised KV latent (rank R) and the shared rope key (P dims) are cached per position.
Queries are absorbed into latent space through wk_b, attention runs as MQA over the latent, and
wv_b expands the result per head — llama.cpp's MLA path, so the cache is R + P values per token (float16
with --kv-type f16, the default on CUDA: the models name these rows typed, layers/kv_cache.py).

A one-token step (the static CUDA-graph step and, as GQA's, the eager one unless $SPARKD_FUSED_EAGER=0) attends
with kernels/decode_attention.py over the cache rows up to its device position: over float16 rows its "grouped"
rule reads each latent row once for all the heads (session 31), the values inside the keys.

A prompt of MHA_ROWS tokens or more on CUDA (session 32, $SPARKD_MLA_PROMPT) instead expands the cached latent
rows to each head's keys (Dn + P) and values (Dv) through wk_b and wv_b and attends as plain multi-head attention
through attend_sdpa (torch's memory-efficient kernel): 192/128 wide, not 576/512, and no [H, T, S] scores in
memory, for the expansion's GEMMs over the S rows. The same sums in another order: float32 rounding apart, and
without wk_b's and wv_b's rounding of q and o (there is no latent q or o to round). H200, 128 heads: 67.6 against
453.9 ms a layer for an 8000-token prompt; a prompt's 64 tokens over 7488 cached rows lose (7.7 against 6.3 ms).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sparkd.engine import switches
from sparkd.engine.kernels import fused
from sparkd.engine.layers import attention as attention_layer
from sparkd.engine.layers.act_round import round_activations
from sparkd.engine.layers.attention import attend, attend_sdpa
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.linear import Linear
from sparkd.engine.layers.norm import RMSNorm
from sparkd.engine.layers.rope import apply_rope
from sparkd.engine.layers.rope import RopeConfig


# a prompt's attention on CUDA from MHA_ROWS tokens on: "mha" (default) over per-head keys and values expanded from
# the latent rows (in float16 over a float16 cache where SPARKD_SDPA_PRECISION is half: _expanded); "absorbed" over the
# latent rows themselves (attend, before session 32)
MLA_PROMPT = switches.choice("SPARKD_MLA_PROMPT", ("mha", "absorbed"), "mha")
MHA_ROWS = 128
# heads expanded at a time (session 38): [S, 16, Dn + P] keys and [S, 16, Dv] values, not all heads' (DeepSeek V3's
# 128: 43 GB at 131072 positions, so its prompts there ran in chunks of 16 tokens)
EXPAND_HEADS = 16
MHA_DEVICES = ("cuda",)  # the CPU keeps the absorbed form, llama.cpp's (its oracle tests compare the logits)


def mla_scale(rope: RopeConfig, head_dim_k: int, yarn_log_mul: float) -> float:
    """llama.cpp's pre-scaled kq_scale: yarn's magnitude correction folded into the softmax scale."""
    inv = 1.0 / rope.freq_scale
    attn_factor_org = rope.attn_factor * (1.0 + 0.1 * math.log(inv))
    mscale = attn_factor_org * (1.0 + 0.1 * yarn_log_mul * math.log(inv))
    return mscale * mscale / math.sqrt(head_dim_k)


class MLAttention(nn.Module):
    def __init__(self, il: int, n_head: int, qk_nope: int, qk_rope: int, kv_rank: int,
                 rope: RopeConfig | None, scale: float, wq_a: Linear | None, q_a_norm: RMSNorm | None,
                 wq_b: Linear, wkv_a: Linear, kv_a_norm: RMSNorm, wk_b: Linear, wv_b: Linear, wo: Linear,
                 selector: nn.Module | None = None, out_gate: Linear | None = None):
        super().__init__()
        self.il, self.n_head, self.qk_nope, self.qk_rope, self.kv_rank = il, n_head, qk_nope, qk_rope, kv_rank
        self.rope, self.scale = rope, scale
        self.wq_a, self.q_a_norm, self.wq_b = wq_a, q_a_norm, wq_b  # wq_b is attn_q when no q_lora
        self.wkv_a, self.kv_a_norm, self.wo = wkv_a, kv_a_norm, wo
        # head h's k matrix [R, Dn] is wk_b's rows h*R ..., its v matrix [Dv, R] wv_b's rows h*Dv ... (Weights.stacked:
        # the file's blocks on the GPU path, where a token's products are one grouped GEMV each)
        self.wk_b, self.wv_b = wk_b, wv_b
        # sparse attention: selector(x, q latent, pos, cache) → [T, S] keys each query may read (None: all)
        self.selector = selector
        self.out_gate = out_gate  # Kimi K3: heads' output *= sigmoid(out_gate(x)) before wo

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        # T tokens, H heads, R latent rank, Dn/P nope/rope dims, Dv value dims
        T = x.shape[0]
        q_lat_in = x if self.wq_a is None else self.q_a_norm(self.wq_a(x))
        keep = None if self.selector is None else self.selector(x, q_lat_in, pos, cache)
        q = self.wq_b(q_lat_in).view(T, self.n_head, self.qk_nope + self.qk_rope)
        q_nope, q_pe = q[..., : self.qk_nope], q[..., self.qk_nope:]  # [T, H, Dn], [T, H, P]
        kv = self.wkv_a(x)  # [T, R + P]
        latent = self.kv_a_norm(kv[:, : self.kv_rank])  # [T, R]
        k_pe = kv[:, None, self.kv_rank:]  # [T, 1, P]
        if self.rope is not None:  # None: nope-only MLA (Kimi K3), the P dims stay unrotated
            cos, sin = cache.rope(self.rope, pos)
            k_pe = apply_rope(k_pe, cos, sin, self.rope.neox)
            q_pe = apply_rope(q_pe, cos, sin, self.rope.neox)
        k_new = torch.cat([latent[:, None, :], k_pe], dim=-1)  # [T, 1, R + P]
        k_all, _, start = cache.append(self.il, pos, k_new, None)
        if T >= MHA_ROWS and keep is None and x.device.type in MHA_DEVICES and MLA_PROMPT == "mha":
            o = self._expanded(q_nope, q_pe, k_all, start, cache.masks)
        else:
            o = self._absorbed(q_nope, q_pe, k_all, start, keep, pos, cache)
        o = o.reshape(T, -1)  # [T, H * Dv]
        if self.out_gate is not None:
            o = o * torch.sigmoid(self.out_gate(x))
        return self.wo(o)

    def _absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, k_all: torch.Tensor, start, keep,
                  pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The queries absorbed into latent space, attention over the cache's latent rows k_all [S, 1, R + P]
        (their first R columns the values), wv_b after → [T, H, Dv]."""
        q_lat = self._per_head(self.wk_b, q_nope)  # [T, H, R]
        q_all = torch.cat([q_lat, q_pe], dim=-1)  # [T, H, R + P]
        # the decode kernel serves the static (CUDA graph) step and, unless switched off, the eager one
        one = q_all.shape[0] == 1 and fused.one_token(cache.span is not None)
        if one and keep is None and fused.active("attention", q_all) and q_all.dtype == torch.float32:
            from sparkd.engine.kernels.decode_attention import decode_attention

            k_all, _, dpos = cache.decode_rows(self.il, pos)  # the values: each row's first R columns
            o = decode_attention(q_all, k_all, k_all[..., : self.kv_rank], dpos, self.scale)
        else:
            o = attend(q_all, k_all, k_all[..., : self.kv_rank], self.scale, start, keep=keep,
                       masks=cache.masks)  # [T, H, R]
        return self._per_head(self.wv_b, o)  # [T, H, Dv]

    def _per_head(self, w: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [T, H, in] through each head's matrix of w → [T, H, out]: a token's in one grouped launch, several
        tokens' over w's values (dequantized once, not a launch per head)."""
        if x.shape[0] == 1:
            return w.grouped(x)
        heads = w.dense().view(self.n_head, -1, x.shape[-1])
        return torch.einsum("thi,hoi->tho", round_activations(x, w.act_fmt), heads)

    def _expanded(self, q_nope: torch.Tensor, q_pe: torch.Tensor, k_all: torch.Tensor, start, masks) -> torch.Tensor:
        """A prompt's attention as multi-head attention: the cache's latent rows k_all [S, 1, R + P] expanded to the
        heads' keys [S, H, Dn + P] and values [S, H, Dv], EXPAND_HEADS heads at a time → [T, H, Dv]. Where
        SDPA_PRECISION is half (the default; session 45, the default here since session 46) the expansion runs in the
        cache rows' type: over float16 rows wk_b and wv_b are rounded to float16 once a layer and the keys and values
        are float16, which attend_sdpa takes on its half path as it takes GQA's cache rows (H100, DeepSeek V3's heads
        at 8000 tokens: 69.8 -> 22.1 ms a layer). Under float32 the rows are widened to float32."""
        half = attention_layer.SDPA_PRECISION == "half"
        rows = k_all[:, 0] if half else k_all[:, 0].to(q_nope.dtype)
        wk_b = self.wk_b.dense().view(self.n_head, self.kv_rank, self.qk_nope).to(rows.dtype)
        wv_b = self.wv_b.dense().view(self.n_head, -1, self.kv_rank).to(rows.dtype)
        q = torch.cat([q_nope, q_pe], dim=-1)
        out = q.new_empty(q.shape[0], self.n_head, wv_b.shape[1])
        for h in range(0, self.n_head, EXPAND_HEADS):
            heads = slice(h, h + EXPAND_HEADS)
            k, v = expand_rows(rows, wk_b[heads], wv_b[heads])
            out[:, heads] = attend_sdpa(q[:, heads], k, v, self.scale, start, masks=masks)
        return out


def expand_rows(rows: torch.Tensor, wk_b: torch.Tensor, wv_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA's cached rows [S, R + P] (latent, then the shared rope key) as heads' keys [S, h, Dn + P] and values
    [S, h, Dv] through wk_b [h, R, Dn] and wv_b [h, Dv, R], in their type."""
    S, R = rows.shape[0], wk_b.shape[1]
    latent = rows[:, :R]
    k_pe = rows[:, None, R:].expand(S, wk_b.shape[0], rows.shape[1] - R)
    k = torch.cat([torch.einsum("sr,hrd->shd", latent, wk_b), k_pe], dim=-1)
    return k, torch.einsum("sr,hvr->shv", latent, wv_b)
