"""Kimi K3 (llama.cpp `kimi-k3`): hybrid KDA linear attention (recurrent, n_head_kv = 0 marks a
KDA layer) and nope-only MLA with a sigmoid output gate, cross-layer residual attention (AttnRes),
latent MoE with sigmoid routing and a selection bias, shared experts and SiTU everywhere."""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from sparkd.engine.errors import ModelError
from sparkd.engine.layers.attn_res import ResidualMix
from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.kda import KDAttention, kda_state_shapes, rule_peak_bytes
from sparkd.engine.layers.kv_cache import KV_TYPES, KVCache
from sparkd.engine.layers.latent_moe import LatentMoE
from sparkd.engine.layers.moe import Router
from sparkd.engine.layers.situ import situ
from sparkd.engine.models.config import GATING_SIGMOID, ModelConfig, base_config, gating_name, mla_config
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, head, pick
from sparkd.engine.models.deepseek2 import mla_attention
from sparkd.engine.models.weights import Weights

ARCH = "kimi-k3"
F32_BYTES = 4


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    key = f"{ARCH}.attention.head_count_kv"
    per_layer = metadata.get(key)
    if not isinstance(per_layer, (list, tuple)):
        raise ModelError(f"could not configure {ARCH} model {path}: {key} must be a per-layer array "
                         f"(0 marks a KDA layer), got {per_layer!r}", path=path)
    md = dict(metadata)
    md[key] = max(per_layer)  # MLA is served as MQA over the latent: one KV head
    m, kw = base_config(md, ARCH, neox=False, path=path)
    if len(per_layer) != kw["n_layer"]:
        raise ModelError(f"could not configure {ARCH} model {path}: {key} has {len(per_layer)} entries "
                         f"for {kw['n_layer']} layers", path=path)
    lb = m.get("{arch}.kda.gate_lower_bound")
    kw.update(
        gating=gating_name(m, GATING_SIGMOID), **mla_config(m, ARCH, path),
        extra=dict(
            kda_layers=tuple(n == 0 for n in per_layer),
            kda_head_dim=m.int_("{arch}.kda.head_dim"),
            d_conv=m.int_("{arch}.ssm.conv_kernel"),
            gate_lower_bound=None if lb is None else float(lb),
            expert_latent=m.int_("{arch}.expert_latent_length", 0),
            attn_res_block_size=m.int_("{arch}.attn_res.block_size"),
            situ_beta=m.float_("{arch}.activation.situ_beta"),
            situ_linear_beta=m.float_("{arch}.activation.situ_linear_beta")))
    return ModelConfig(**kw)


def is_kda(cfg: ModelConfig, il: int) -> bool:
    return cfg.extra["kda_layers"][il]


def cache_bytes(cfg: ModelConfig, ctx: int, kv_type: str = "f32") -> int:
    """What one sequence's cache holds: MLA latent + rope key per position (at kv_type's size: the typed rows, since
    session 36), fixed KDA state (float32)."""
    per_pos = (cfg.kv_lora_rank + cfg.rope.n_rot) * KV_TYPES[kv_type].itemsize
    state = sum(math.prod(sh) for sh in kda_state_shapes(cfg.n_head, cfg.extra["kda_head_dim"],
                                                           cfg.extra["d_conv"]))
    n_kda = sum(cfg.extra["kda_layers"])
    return (cfg.n_layer - n_kda) * ctx * per_pos + n_kda * state * F32_BYTES


def rope_configs(cfg: ModelConfig) -> tuple:
    """No rope table: the MLA layers are nope-only (plan.rope_bytes)."""
    return ()


def prompt_rule_bytes(cfg: ModelConfig, batch_tokens: int, cuda: bool) -> int:
    """A prompt's KDA delta rule over batch_tokens at its peak (kda.rule_peak_bytes): one layer's, the layers run
    in turn and free it."""
    D = cfg.extra["kda_head_dim"]
    return rule_peak_bytes(batch_tokens, cfg.n_head, D, D, cuda) if any(cfg.extra["kda_layers"]) else 0


class K3Block(Block):
    """One layer: [mix] → norm → attention → [mix] → norm → FFN, with the AttnRes banking. Its stream:
    (x [T, D], the checkpoints banked so far: a tuple of [T, D])."""

    def __init__(self, il: int, bank: bool, attn_mix: ResidualMix | None, attn_norm: nn.Module,
                 attn: nn.Module, ffn_mix: ResidualMix | None, ffn_norm: nn.Module, ffn: nn.Module):
        super().__init__(attn_norm, attn, ffn_norm, ffn)
        self.il, self.bank = il, bank
        self.attn_mix, self.ffn_mix = attn_mix, ffn_mix

    def attn_add_norm(self, stream, pos: torch.Tensor, cache: KVCache):
        x, stack = stream
        cur = x if self.attn_mix is None else self.attn_mix(stack, x)
        if self.bank:
            stack = (*stack, x)  # the raw layer input, then the stream restarts from attention
        h = self.attn(self.attn_norm(cur), pos, cache)
        x = h if self.bank else x + h
        cur = x if self.ffn_mix is None else self.ffn_mix(stack, x)
        return (x, stack), self.ffn_norm(cur)

    def add_ffn(self, mid, normed: torch.Tensor, ffn):
        x, stack = mid
        return x + ffn(normed), stack

    def residual(self, stream) -> torch.Tensor:
        return stream[0]


class K3Decoder(Decoder):
    def __init__(self, *args: Any, out_mix: ResidualMix | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.out_mix = out_mix

    def enter(self, tokens: torch.Tensor):
        return super().enter(tokens), ()  # no checkpoint banked yet

    def leave(self, stream, last: bool | torch.Tensor = False) -> torch.Tensor:
        x, stack = stream
        return pick(x if self.out_mix is None else self.out_mix(stack, x), last)


def _kda(w: Weights, cfg: ModelConfig, il: int) -> KDAttention:
    p, H, D = f"blk.{il}", cfg.n_head, cfg.extra["kda_head_dim"]

    def conv(name: str) -> torch.Tensor:
        t = w.get(f"{p}.{name}.weight")
        return t.reshape(H * D, cfg.extra["d_conv"])  # ggml ne [d_conv, 1, d_inner(, 1)]
    return KDAttention(
        il, H, D, cfg.rms_eps, w.linear(f"{p}.attn_q"), w.linear(f"{p}.attn_k"), w.linear(f"{p}.attn_v"),
        conv("ssm_conv1d_q"), conv("ssm_conv1d_k"), conv("ssm_conv1d_v"),
        w.linear(f"{p}.ssm_f_a", (D, cfg.n_embd)), w.linear(f"{p}.ssm_f_b", (H * D, D)),
        w.get(f"{p}.ssm_dt.bias", (H * D,)), w.get(f"{p}.ssm_a", (H,)), w.linear(f"{p}.ssm_beta", (H, cfg.n_embd)),
        w.linear(f"{p}.ssm_g", (H * D, cfg.n_embd)), w.norm(f"{p}.ssm_norm", cfg.rms_eps),
        w.linear(f"{p}.attn_output"), cfg.extra["gate_lower_bound"])


def _ffn(w: Weights, cfg: ModelConfig, il: int, store: ExpertStore) -> nn.Module:
    p = f"blk.{il}"
    act = situ(cfg.extra["situ_beta"], cfg.extra["situ_linear_beta"])
    if not cfg.is_moe_layer(il):
        return dense_ffn(w, p, act)
    router = Router(w.linear(f"{p}.ffn_gate_inp", (cfg.n_expert, cfg.n_embd)), cfg.n_expert_used, cfg.gating,
                    norm_w=cfg.expert_weights_norm, scale=cfg.expert_weights_scale,
                    sel_bias=w.get(f"{p}.exp_probs_b.bias", (cfg.n_expert,)))
    shared = dense_ffn(w, p, act, suffix="_shexp") if w.has(f"{p}.ffn_gate_shexp.weight") else None
    return LatentMoE(il, router, store, act, w.maybe_linear(f"{p}.ffn_routed_down"),
                     w.maybe_linear(f"{p}.ffn_routed_up"), w.maybe_norm(f"{p}.ffn_routed_norm", cfg.rms_eps),
                     shared)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    bs = cfg.extra["attn_res_block_size"]

    def mix(name: str) -> ResidualMix | None:
        return ResidualMix(w.get(f"{name}.weight", (cfg.n_embd,)), cfg.rms_eps) if bs else None
    blocks, kv, states = [], [], {}
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        if is_kda(cfg, il):
            attn: nn.Module = _kda(w, cfg, il)
            kv.append((0, 0, 0))
            states[il] = kda_state_shapes(cfg.n_head, cfg.extra["kda_head_dim"], cfg.extra["d_conv"])
        else:
            attn = mla_attention(w, cfg, il, nope_only=True)
            kv.append((1, cfg.kv_lora_rank + cfg.rope.n_rot, 0))  # latent + unrotated key part
        blocks.append(K3Block(il, bool(bs) and il % bs == 0, mix(f"{p}.attn_res_score"),
                              w.norm(f"{p}.attn_norm", cfg.rms_eps), attn, mix(f"{p}.ffn_res_score"),
                              w.norm(f"{p}.ffn_norm", cfg.rms_eps), _ffn(w, cfg, il, store)))
    emb, out = head(w)
    return K3Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out, kv_shapes=kv,
                     state_shapes=states, out_mix=mix("output_res_score"),
                     kv_typed=[not is_kda(cfg, il) for il in range(cfg.n_layer)])  # MLA's latent rows take --kv-type
