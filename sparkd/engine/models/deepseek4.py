"""DeepSeek V4 Flash (llama.cpp `deepseek4`): hyper-connection residual streams, single-KV-head
attention with a sliding window and sinks, per-layer KV compression (0: window only, 4: CSA with
the lightning indexer's top-k, 128: HCA), sqrt-softplus routed experts with hash routing on the
first layers, one shared expert, clamped SwiGLU. The MTP (next-n) layers are not run."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch
from torch import nn

from sparkd.engine.errors import ModelError
from sparkd.engine.layers.dsv4_attention import DSV4Attention, WindowRows
from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.ffn import GatedFFN, swiglu_limited
from sparkd.engine.layers.hyper_conn import HyperConnection, HyperHead
from sparkd.engine.layers.kv_cache import KVCache
from sparkd.engine.layers.kv_compressor import Compressor, CompressorState
from sparkd.engine.layers.dsv4_indexer import CompressedIndexer
from sparkd.engine.layers.moe import MoE, Router
from sparkd.engine.models.config import GATING_SQRT_SOFTPLUS, ModelConfig, RopeConfig, base_config, gating_name
from sparkd.engine.models.decoder import Block, Decoder, head, pick
from sparkd.engine.models.weights import Weights

ARCH = "deepseek4"
CSA_RATIO, HCA_RATIO = 4, 128
KV_TYPED = False  # --kv-type: its cache (windows of raw rows, compressor state) stays f32 (plan.cache_kv_type)


def _per_layer(v: Any, n: int, what: str, path: str | None) -> tuple[float, ...]:
    vals = tuple(v) if isinstance(v, (list, tuple)) else (v,) * n
    if len(vals) < n:
        raise ModelError(f"could not configure {ARCH} model {path}: {what} has {len(vals)} entries "
                         f"for {n} layers", path=path)
    return vals[:n]


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=False, path=path)
    n = kw["n_layer"]
    if m.int_("{arch}.nextn_predict_layers", 0):
        raise ModelError(f"could not configure {ARCH} model {path}: it has multi-token-prediction "
                         "(next-n) layers, which are not supported; use the main model's GGUF", path=path)
    gating = gating_name(m, GATING_SQRT_SOFTPLUS)
    if gating != GATING_SQRT_SOFTPLUS:
        raise ModelError(f"could not configure {ARCH} model {path}: {ARCH}.expert_gating_func is "
                         f"{gating}, only sqrt-softplus (4) is defined for DeepSeek V4", path=path)
    ratios = tuple(int(r) for r in _per_layer(m.get("{arch}.attention.compress_ratios", required=True),
                                               n, "attention.compress_ratios", path))
    if bad := sorted({r for r in ratios if r not in (0, CSA_RATIO, HCA_RATIO)}):
        raise ModelError(f"could not configure {ARCH} model {path}: compression ratios {bad} are not "
                         f"supported (only 0, {CSA_RATIO} and {HCA_RATIO}, as in llama.cpp)", path=path)
    clamp = _per_layer(m.get("{arch}.swiglu_clamp_exp", 0.0), n, "swiglu_clamp_exp", path)
    hc = m.int_("{arch}.hyper_connection.count")
    if hc != 4:
        raise ModelError(f"could not configure {ARCH} model {path}: hyper_connection.count is {hc}; "
                         "llama.cpp's DeepSeek V4 graph requires 4", path=path)
    n_swa = m.int_("{arch}.attention.sliding_window")
    if n_swa < 1:
        raise ModelError(f"could not configure {ARCH} model {path}: attention.sliding_window is {n_swa}; the raw "
                         "rows' window must hold at least the token's own row", path=path)
    kw.update(
        gating=gating, q_lora_rank=m.int_("{arch}.attention.q_lora_rank"), n_swa=n_swa,
        extra=dict(
            ratios=ratios, clamp_exp=clamp,
            clamp_shexp=_per_layer(m.get("{arch}.swiglu_clamp_shexp", clamp), n, "swiglu_clamp_shexp", path),
            hc=hc, hc_iters=m.int_("{arch}.hyper_connection.sinkhorn_iterations"),
            hc_eps=m.float_("{arch}.hyper_connection.epsilon"),
            n_hash=m.int_("{arch}.hash_layer_count", 0),
            o_groups=m.int_("{arch}.attention.output_group_count"),
            o_lora_rank=m.int_("{arch}.attention.output_lora_rank"),
            compress_base=m.float_("{arch}.attention.compress_rope_freq_base"),
            idx_heads=m.int_("{arch}.attention.indexer.head_count"),
            idx_dim=m.int_("{arch}.attention.indexer.key_length"),
            idx_top_k=m.int_("{arch}.attention.indexer.top_k")))
    return ModelConfig(**kw)


def rope_configs(cfg: ModelConfig) -> tuple[RopeConfig, RopeConfig]:
    """(window-only layers: plain rope at freq_base; compressed layers and the indexer: the
    compress base with the model's yarn settings, magnitude scale cancelled as the reference does)."""
    r = cfg.rope
    plain = RopeConfig(n_rot=r.n_rot, base=r.base, neox=False)
    attn = 1.0 if r.ext_factor == 0.0 else 1.0 / (1.0 + 0.1 * math.log(1.0 / r.freq_scale))
    comp = dataclasses.replace(r, base=cfg.extra["compress_base"], attn_factor=attn)
    return plain, comp


def _compressor(w: Weights, cfg: ModelConfig, prefix: str, ratio: int, dim: int, rope: RopeConfig) -> Compressor:
    return Compressor(ratio, dim, ratio == CSA_RATIO, w.linear(f"{prefix}_kv"), w.linear(f"{prefix}_gate"),
                      w.get(f"{prefix}_ape.weight"), w.norm(f"{prefix}_norm", cfg.rms_eps), rope)


def _attention(w: Weights, cfg: ModelConfig, il: int) -> DSV4Attention:
    p, x = f"blk.{il}", cfg.extra
    ratio = x["ratios"][il]
    plain, comp_rope = rope_configs(cfg)
    comp = _compressor(w, cfg, f"{p}.attn_compressor", ratio, cfg.head_dim_k, comp_rope) if ratio else None
    indexer = None
    if ratio == CSA_RATIO:
        indexer = CompressedIndexer(
            x["idx_heads"], x["idx_dim"], x["idx_top_k"], w.linear(f"{p}.indexer.attn_q_b"),
            w.linear(f"{p}.indexer.proj"),
            _compressor(w, cfg, f"{p}.indexer_compressor", ratio, x["idx_dim"], comp_rope), comp_rope)
    return DSV4Attention(
        il, cfg.n_head, cfg.head_dim_k, cfg.rms_eps, cfg.n_swa, comp_rope if ratio else plain,
        w.linear(f"{p}.attn_q_a"), w.norm(f"{p}.attn_q_a_norm", cfg.rms_eps), w.linear(f"{p}.attn_q_b"),
        w.linear(f"{p}.attn_kv"), w.norm(f"{p}.attn_kv_a_norm", cfg.rms_eps), w.get(f"{p}.attn_sinks.weight"),
        w.linear(f"{p}.attn_output_a"), x["o_groups"], w.linear(f"{p}.attn_output_b"), comp, indexer)


def _ffn(w: Weights, cfg: ModelConfig, il: int, store: ExpertStore) -> tuple[MoE, torch.Tensor | None]:
    p, x = f"blk.{il}", cfg.extra
    hashed = il < x["n_hash"]
    router = Router(w.linear(f"{p}.ffn_gate_inp", (cfg.n_expert, cfg.n_embd)), cfg.n_expert_used, cfg.gating,
                    norm_w=cfg.expert_weights_norm, scale=cfg.expert_weights_scale,
                    sel_bias=None if hashed else w.get(f"{p}.exp_probs_b.bias"))
    act_sh = swiglu_limited(x["clamp_shexp"][il]) if x["clamp_shexp"][il] > 1e-6 else "silu"
    shared = GatedFFN(w.linear(f"{p}.ffn_gate_shexp"), w.linear(f"{p}.ffn_up_shexp"),
                      w.linear(f"{p}.ffn_down_shexp"), act_sh)
    act = swiglu_limited(x["clamp_exp"][il]) if x["clamp_exp"][il] > 1e-6 else "silu"
    table = w.get(f"{p}.ffn_gate_tid2eid.weight").long() if hashed else None  # [V, A]
    return MoE(il, router, store, act, shared), table


class DSV4Block(Block):
    """Its stream: (the hc copies [T, hc, D], the tokens [T] on the device, which the hash layers route by)."""

    def __init__(self, hc_attn: HyperConnection, attn_norm: nn.Module, attn: DSV4Attention,
                 hc_ffn: HyperConnection, ffn_norm: nn.Module, ffn: MoE, hash_table: torch.Tensor | None):
        super().__init__(attn_norm, attn, ffn_norm, ffn)
        self.hc_attn, self.hc_ffn = hc_attn, hc_ffn
        self.register_buffer("hash_table", hash_table, persistent=False)  # [V, A] expert ids or None

    def forward(self, stream, pos: torch.Tensor, cache: KVCache):
        mid, normed = self.attn_add_norm(stream, pos, cache)
        ids = self._hashed(mid[-1])
        return self.add_ffn(mid, normed, lambda h: self.ffn(h, ids))

    def attn_add_norm(self, stream, pos: torch.Tensor, cache: KVCache):
        x, tokens = stream
        h, post, comb = self.hc_attn.pre(x)
        x = HyperConnection.post(self.attn(self.attn_norm(h), pos, cache), x, post, comb)
        h, post, comb = self.hc_ffn.pre(x)
        return (x, post, comb, tokens), self.ffn_norm(h)

    def add_ffn(self, mid, normed: torch.Tensor, ffn):
        x, post, comb, tokens = mid
        return HyperConnection.post(ffn(normed), x, post, comb), tokens

    def norm_readers(self) -> list[tuple[nn.Module, nn.Module | None]]:
        # the attention norm's output is read by q's and kv's projections, the compressors' and the indexer's
        return super().norm_readers() + [(self.attn_norm, self.attn.wq_a), (self.attn.q_a_norm, self.attn.wq_b)]

    def route(self, mid, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ffn.router(normed, self._hashed(mid[-1]))

    def residual(self, stream) -> torch.Tensor:
        # the copies' mean: the FFN's input mixes them with positive weights, and its norm drops the scale
        return stream[0].mean(1)

    def _hashed(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The hash layers' fixed expert ids [T, A] for tokens, None for a routed layer."""
        return None if self.hash_table is None else self.hash_table[tokens]


class DSV4Cache(KVCache):
    """Every layer's window of raw key rows (WindowRows: the last `window` positions' only, the rows attention reads)
    plus each compressed layer's compressor states; no row per position."""

    def __init__(self, max_ctx: int, n_layer: int, window: int, dim: int, compressors: dict,
                 device: torch.device | str = "cpu", rope_tables: dict | None = None):
        super().__init__(max_ctx, [], device=device, rope_tables=rope_tables)
        self.windows = [WindowRows(window, dim, device) for _ in range(n_layer)]
        self.states: dict[tuple[int, str], CompressorState] = {
            key: c.new_state(max_ctx, device) for key, c in compressors.items()}

    def window_rows(self, il: int) -> WindowRows:
        return self.windows[il]

    @property
    def rewind_limit(self) -> int:
        return 0  # a compressor ring holds the latest positions' rows, not those of a shorter prefix

    def reset(self) -> None:
        super().reset()
        for w in self.windows:
            w.reset()
        for st in self.states.values():
            st.reset()

    def sequence_state(self) -> list[torch.Tensor]:
        return super().sequence_state() + self._window_state() + self._compressor_state(None)

    def prefix_state(self, n: int) -> list[torch.Tensor]:
        return super().sequence_state() + self._window_state() + self._compressor_state(n)

    def _window_state(self) -> list[torch.Tensor]:
        return [t for w in self.windows for t in (w.rows, w.pos)]

    def _compressor_state(self, n: int | None) -> list[torch.Tensor]:
        """Each compressor's rings and entries; with n, the entries positions [0, n) completed only
        (n // ratio of max_ctx // ratio + 1 rows: a prefix's snapshot need not copy the rest)."""
        return [t for s in self.states.values()
                for t in (s.kv, s.score, s.entries if n is None else s.entries[:n // s.ratio])]

    def compressor_state(self, il: int, kind: str) -> CompressorState:
        return self.states[il, kind]


class DSV4Decoder(Decoder):
    def __init__(self, cfg: ModelConfig, tok_embd: torch.Tensor, blocks: list[DSV4Block],
                 hc_head: HyperHead, output_norm: nn.Module, output):
        super().__init__(cfg, tok_embd, blocks, output_norm, output)
        self.hc_head = hc_head

    def new_cache(self, max_ctx: int | None = None, kv_dtype: torch.dtype | None = None) -> DSV4Cache:
        # kv_dtype: not taken; the window rows stay float32 (a few hundred KB a layer)
        comps = {}
        for b in self.blocks:
            if b.attn.compressor is not None:
                comps[b.attn.il, "attn"] = b.attn.compressor
            if b.attn.indexer is not None:
                comps[b.attn.il, "indexer"] = b.attn.indexer.compressor
        return DSV4Cache(max_ctx or self.cfg.n_ctx_train, self.cfg.n_layer, self.cfg.n_swa, self.cfg.head_dim_k, comps,
                         device=self.tok_embd.device, rope_tables=self.rope_tables)

    def enter(self, tokens: torch.Tensor):
        tokens = tokens.to(self.tok_embd.device)  # the hash layers index their tables with them
        return self.embed(tokens)[:, None, :].expand(-1, self.cfg.extra["hc"], -1), tokens  # [T, hc, D]

    def leave(self, stream, last: bool | torch.Tensor = False) -> torch.Tensor:
        """The hc copies collapsed by the hyper-connection head."""
        return self.hc_head(pick(stream[0], last))


def cache_bytes(cfg: ModelConfig, ctx: int, kv_type: str = "f32") -> int:
    """What DSV4Cache holds for ctx positions (f32 whatever kv_type: its rows are not typed): every layer's window of
    raw key rows (and the int64 position of each), and per compressed layer the compressor rings and entries (CSA
    twice: attention and indexer)."""
    x, f32 = cfg.extra, 4

    def comp(ratio: int, dim: int) -> int:
        overlap = ratio == CSA_RATIO
        width = 2 * dim if overlap else dim
        ring = (2 * ratio if overlap else ratio) * width * 2  # values and scores
        return (ring + (ctx // ratio + 1) * dim) * f32
    total = cfg.n_layer * cfg.n_swa * (cfg.head_dim_k * f32 + 8)
    for r in x["ratios"]:
        if r:
            total += comp(r, cfg.head_dim_k)
        if r == CSA_RATIO:
            total += comp(r, x["idx_dim"])
    return total


def attention_floats(cfg: ModelConfig, ctx: int, T: int) -> int:
    """A prompt chunk's largest attention transient in one layer at up to ctx positions, in floats: the memory plan's
    workspace counts it in place of the scores over every position other models hold (this model reads a window of
    rows and its compressed entries). attend_extra holds two [H, T, rows] score tensors at a time (the window's rows,
    the chunk's own, the entries read, the sink) and its einsums' copies of q and the rows, with a CSA layer's
    gathered entries [T, top_k, D] past its top-k. Before them a CSA layer's indexer holds its scores over every entry
    [T, Hi, C], its queries (projected, roped, the einsum's copy) and the keys' copy, and a few [T, C] (summed, masked,
    the visible masks). tests/engine/test_deepseek4.py measures every tensor a layer makes against this."""
    x = cfg.extra
    H, W, D, K, Hi, Di = cfg.n_head, cfg.n_swa, cfg.head_dim_k, x["idx_top_k"], x["idx_heads"], x["idx_dim"]
    worst = 0
    for r in set(x["ratios"]):
        entries = ctx // r + 1 if r else 0
        picked = r == CSA_RATIO and entries > K
        rows = W + T + (K if picked else entries)
        attend = 2 * H * T * (rows + 1) + T * H * D + (T * K * D if picked else rows * D)
        indexer = T * Hi * (entries + 3 * Di) + 2 * entries * Di + 8 * T * entries if picked else 0
        worst = max(worst, attend, indexer)
    return worst


def _hc(w: Weights, cfg: ModelConfig, prefix: str) -> HyperConnection:
    x = cfg.extra
    return HyperConnection(w.get(f"{prefix}_fn.weight"), w.get(f"{prefix}_base.weight"),
                           w.get(f"{prefix}_scale.weight"), x["hc"], x["hc_iters"], x["hc_eps"], cfg.rms_eps)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        ffn, table = _ffn(w, cfg, il, store)
        blocks.append(DSV4Block(_hc(w, cfg, f"{p}.hc_attn"), w.norm(f"{p}.attn_norm", cfg.rms_eps),
                                _attention(w, cfg, il), _hc(w, cfg, f"{p}.hc_ffn"),
                                w.norm(f"{p}.ffn_norm", cfg.rms_eps), ffn, table))
    emb, out = head(w)
    hc_head = HyperHead(w.get("output_hc_fn.weight"), w.get("output_hc_base.weight"),
                        w.get("output_hc_scale.weight"), cfg.extra["hc_eps"], cfg.rms_eps)
    return DSV4Decoder(cfg, emb, blocks, hc_head, w.norm("output_norm", cfg.rms_eps), out)
