"""The decoder stack every architecture here shares, and the builder helpers they use.

A block is: x += post_attn_norm?(attn(attn_norm(x))); x += post_ffn_norm?(ffn(ffn_norm(x))).
Architectures differ in the attention module (GQA or MLA), the FFN (dense, MoE, shared experts)
and small options, so each arch module is mostly a mapping from GGUF names to these parts.

What a block hands the next is the "stream": here the residual x [T, D]. Kimi K3 and DeepSeek V4
hand more (their AttnRes checkpoints, their hyper-connection copies): their decoders say what
their stream is (enter, leave) and their blocks take and give it, in the two halves a streamed
step's graph segments cut at the router (attn_add_norm, add_ffn: streaming/graph_step.py).
"""

from __future__ import annotations

import torch
from torch import nn

from sparkd.engine import switches
from sparkd.engine.kernels import fused
from sparkd.engine.layers.attention import Attention
from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.ffn import GatedFFN
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.embedding import KernelEmbedding
from sparkd.engine.layers.linear import KernelLinear, Linear
from sparkd.engine.layers.moe import MoE, Router
from sparkd.engine.layers.norm import RMSNorm, add_norm
from sparkd.engine.layers.qlinear import QuantLinear, QuantRows
from sparkd.engine.models.config import ModelConfig, RopeConfig
from sparkd.engine.models.weights import Weights


class Block(nn.Module):
    """One layer over the stream; forward is attn_add_norm then add_ffn, the halves a streamed step's graph
    segments run apart (the router between them: route)."""

    def __init__(self, attn_norm: nn.Module, attn: nn.Module, ffn_norm: nn.Module, ffn: nn.Module,
                 post_attn_norm: nn.Module | None = None, post_ffn_norm: nn.Module | None = None):
        super().__init__()
        self.attn_norm, self.attn, self.ffn_norm, self.ffn = attn_norm, attn, ffn_norm, ffn
        self.post_attn_norm, self.post_ffn_norm = post_attn_norm, post_ffn_norm

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        x, normed = self.attn_add_norm(x, pos, cache)
        return self.add_ffn(x, normed, self.ffn)

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module | None]]:
        """(norm, the projection or MoE that reads its output first): the pairs whose norm may write that reader's
        x blocks (cuda_graphs.link_norm_quant); every other integer reader of the same output takes them too."""
        attn, ffn, pairs = self.attn, self.ffn, []
        if type(attn) is Attention:
            pairs.append((self.attn_norm, next((m for m in (attn.wqkv, attn.wqk, attn.wq) if m is not None), None)))
        if isinstance(ffn, GatedFFN):
            pairs.append((self.ffn_norm, ffn.gate))
        elif type(ffn) is MoE:
            pairs.append((self.ffn_norm, ffn))
        return pairs

    def route(self, mid, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MoE router's (weights, ids) on the FFN's input; mid: what attn_add_norm handed add_ffn."""
        return self.ffn.router(normed)

    def residual(self, stream) -> torch.Tensor:
        """The stream entering the block as one residual [T, D] (the prefetch guesses' input)."""
        return stream

    def add_ffn(self, x: torch.Tensor, normed: torch.Tensor, ffn) -> torch.Tensor:
        """x + the FFN's output on normed (its post norm applied): ffn(normed, residual=None) is self.ffn
        or what stands in for it (a streamed step's MoE on experts already selected, graph_step)."""
        if self.post_ffn_norm is None and getattr(self.ffn, "takes_residual", False):
            return ffn(normed, residual=x)  # x + ffn, the add inside the MoE's last launch
        h = ffn(normed)
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        return x + h

    def attn_add_norm(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + attention's h, the FFN norm of that): x += h, then the norm, one kernel when fused;
        for one token with fused "norm_fold" that kernel also adds the output projection's split-K
        partials (Attention.forward parts), so the projection's launch has no fold of its own."""
        parts = (x.shape[0] == 1 and self.post_attn_norm is None and isinstance(self.attn, Attention)
                 and isinstance(self.ffn_norm, RMSNorm) and self.ffn_norm.fused_on(x) and fused.active("norm_fold", x))
        h = self.attn(self.attn_norm(x), pos, cache, **({"parts": True} if parts else {}))
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        return add_norm(x, h, self.ffn_norm, parts=parts)


class Decoder(nn.Module):
    """tokens → logits for one sequence, with an incremental KV cache."""

    def __init__(self, cfg: ModelConfig, tok_embd: torch.Tensor | QuantRows | KernelEmbedding, blocks: list[Block],
                 output_norm: nn.Module, output: Linear, embd_scale: float = 1.0,
                 kv_shapes: list[tuple[int, int, int]] | None = None,
                 side_shapes: dict[tuple[str, int], tuple[int, ...]] | None = None,
                 state_shapes: dict[int, list[tuple[int, ...]]] | None = None,
                 kv_typed: list[bool] | None = None):
        super().__init__()
        self.cfg = cfg
        # [V, D]; QuantRows when the trunk stays quantized, KernelEmbedding on the GPU path (indexing dequantizes the
        # rows either way)
        kept = isinstance(tok_embd, (QuantRows, KernelEmbedding))
        self.tok_embd = tok_embd if kept else nn.Parameter(tok_embd, requires_grad=False)
        self.blocks = nn.ModuleList(blocks)
        self.output_norm = output_norm
        self.output = output  # [V, D]; may share its weight with tok_embd
        self.embd_scale = embd_scale
        self.kv_shapes = kv_shapes or [(cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v)] * cfg.n_layer
        self.side_shapes = side_shapes  # per-position state beyond K/V (see KVCache)
        self.state_shapes = state_shapes  # recurrent layers' per-sequence state (see KVCache)
        self.kv_typed = kv_typed  # the layers whose rows take --kv-type (KVCache's typed; None: those with values)
        self.rope_tables: dict = {}  # every cache's rope tables (KVCache.rope_table), made once per context

    def new_cache(self, max_ctx: int | None = None, kv_dtype: torch.dtype | None = None) -> KVCache:
        """A cache of max_ctx positions (None: the training context); kv_dtype: the type of the rows of the layers
        kv_typed names, GQA's K/V and MLA's latent (None: float32; layers/kv_cache.py)."""
        return KVCache(max_ctx or self.cfg.n_ctx_train, self.kv_shapes, side=self.side_shapes,
                       device=self.tok_embd.device, state_shapes=self.state_shapes, rope_tables=self.rope_tables,
                       kv_dtype=kv_dtype, typed=self.kv_typed,
                       windows=[getattr(b.attn, "window", 0) for b in self.blocks])

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, last: bool = False) -> torch.Tensor:
        """tokens: [T] ids following the cache's n_past positions → logits [T, V] on the CPU
        (where sampling runs), wherever the network is; last: the last token's only, [1, V]."""
        logits = self.run(tokens, positions(tokens, cache), cache, last)
        cache.n_past += tokens.shape[0]
        return logits.cpu()

    def run(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache,
            last: bool | torch.Tensor = False) -> torch.Tensor:
        """tokens [T] at positions pos [T] → logits [T, V] where the network is ([1, V], the last
        token's, if last; last may instead be a row index [1] on the device: that token's, as a
        padded prompt's graph takes its last real token); the cache's n_past is the caller's to
        advance (a static decode step passes device positions)."""
        stream = self.enter(tokens)
        # the attention masks, made by the first layer of each window: new each forward (they follow the
        # positions; a graph's capture makes its own from the device positions it replays with)
        cache.masks = {}
        try:
            for block in self.blocks:
                stream = block(stream, pos, cache)
        finally:
            cache.masks = None  # a layer called alone makes its own
        return self.head(self.leave(stream, last))

    def enter(self, tokens: torch.Tensor):
        """The stream the first block takes for tokens [T] (on the host or the device): here their rows [T, D]."""
        x = self.embed(tokens)
        return x * self.embd_scale if self.embd_scale != 1.0 else x

    def leave(self, stream, last: bool | torch.Tensor = False) -> torch.Tensor:
        """The last block's stream → the hidden states the head takes: [T, D], or one row as run's last says."""
        return pick(stream, last)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The token rows [T, D] on the network's device (tokens may be on the host)."""
        return self.tok_embd[tokens.to(self.tok_embd.device)]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden state [T, D] → logits [T, V] on the network's device."""
        logits = self.output(self.output_norm(x))
        if cap := self.cfg.logit_softcap:
            logits = torch.tanh(logits / cap) * cap
        return logits


def pick(x: torch.Tensor, last: bool | torch.Tensor) -> torch.Tensor:
    """x's rows run's `last` asks for: all, the last one, or the one a device row index names."""
    if isinstance(last, torch.Tensor):
        return x.index_select(0, last)
    return x[-1:] if last else x


def prompt_last_only() -> bool:
    """SPARKD_PROMPT_LOGITS: "last" (session 9), a prompt's forward makes the logits of its last
    token only, the row generation samples from (the output projection then runs the GEMV, as
    llama.cpp's does); "all": every token's, [T, V] copied to the host, the way before."""
    return switches.choice("SPARKD_PROMPT_LOGITS", ("last", "all"), "last") == "last"


def positions(tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The positions [T] of tokens that follow the cache's n_past, on the host: rope angles are
    computed there (rope_cos_sin) and layers read the start with int(); device masks build their
    own aranges."""
    return torch.arange(cache.n_past, cache.n_past + tokens.shape[0], device="cpu")


def gqa_attention(w: Weights, cfg: ModelConfig, il: int, rope: RopeConfig | None = None,
                  window: int = 0, qk_norm: bool = True, sinks: bool = False) -> Attention:
    p = f"blk.{il}"
    return Attention(
        il, cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, rope or cfg.rope,
        w.linear(f"{p}.attn_q", (cfg.n_head * cfg.head_dim_k, cfg.n_embd)),
        w.linear(f"{p}.attn_k", (cfg.n_head_kv * cfg.head_dim_k, cfg.n_embd)),
        w.linear(f"{p}.attn_v", (cfg.n_head_kv * cfg.head_dim_v, cfg.n_embd)),
        w.linear(f"{p}.attn_output", (cfg.n_embd, cfg.n_head * cfg.head_dim_v)),
        q_norm=w.maybe_norm(f"{p}.attn_q_norm", cfg.rms_eps) if qk_norm else None,
        k_norm=w.maybe_norm(f"{p}.attn_k_norm", cfg.rms_eps) if qk_norm else None,
        scale=cfg.attn_scale or None, window=window,
        sinks=w.get(f"{p}.attn_sinks.weight") if sinks else None)


def dense_ffn(w: Weights, prefix: str, act: str = "silu", suffix: str = "") -> GatedFFN:
    return GatedFFN(w.linear(f"{prefix}.ffn_gate{suffix}"), w.linear(f"{prefix}.ffn_up{suffix}"),
                    w.linear(f"{prefix}.ffn_down{suffix}"), act)


def moe_ffn(w: Weights, cfg: ModelConfig, il: int, store: ExpertStore, act: str = "silu") -> MoE:
    p = f"blk.{il}"
    router = Router(
        w.linear(f"{p}.ffn_gate_inp", (cfg.n_expert, cfg.n_embd)), cfg.n_expert_used, cfg.gating,
        norm_w=cfg.expert_weights_norm, scale=cfg.expert_weights_scale,
        sel_bias=w.maybe(f"{p}.exp_probs_b.bias"),
        n_groups=cfg.n_expert_groups, n_group_used=cfg.n_group_used)
    shared = dense_ffn(w, p, suffix="_shexp") if w.has(f"{p}.ffn_gate_shexp.weight") else None
    return MoE(il, router, store, act, shared)


def head(w: Weights) -> tuple[torch.Tensor | QuantRows | KernelEmbedding, Linear | QuantLinear | KernelLinear]:
    """(token embedding, output projection); the output falls back to the tied embedding (its blocks or values)."""
    emb = w.embedding("token_embd.weight")
    if w.has("output.weight"):
        return emb, w.linear("output")
    fmt = w.act_format("token_embd.weight")
    if isinstance(emb, KernelEmbedding):
        return emb, KernelLinear(emb.raw, emb.qtype, emb.shape, act_fmt=fmt)
    return emb, QuantLinear(emb, act_fmt=fmt) if isinstance(emb, QuantRows) else Linear(emb, act_fmt=fmt)
