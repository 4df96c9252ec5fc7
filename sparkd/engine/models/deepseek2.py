"""DeepSeek V2/V3 and Kimi K2 (llama.cpp `deepseek2`): MLA with the latent KV cache, leading dense
layers, sigmoid (V3) or softmax (V2) routing with a selection bias, group-limited top-k, routed
scaling factor, shared experts."""

from __future__ import annotations

import math

from typing import Any, Mapping

from torch import nn

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.mla import MLAttention, mla_scale
from sparkd.engine.models.config import GATING_SOFTMAX, ModelConfig, base_config, gating_name, mla_config
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, head, moe_ffn
from sparkd.engine.models.weights import Weights

ARCH = "deepseek2"


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=False, path=path)
    log_mul = m.float_("{arch}.rope.scaling.yarn_log_multiplier", 0.0) / 0.1
    kw.update(
        gating=gating_name(m, GATING_SOFTMAX), yarn_log_mul=log_mul, **mla_config(m, ARCH, path))
    return ModelConfig(**kw)


def mla_attention(w: Weights, cfg: ModelConfig, il: int, selector: nn.Module | None = None,
                  nope_only: bool = False) -> MLAttention:
    """MLA from GGUF names, shared by deepseek2, glm-dsa (with its token selector) and kimi-k3
    (nope_only: the rope part is not rotated and the softmax scale is plain; an attn_gate if present)."""
    p = f"blk.{il}"
    qk_rope = cfg.rope.n_rot
    has_q_lora = w.has(f"{p}.attn_q_a.weight")
    scale = (1.0 / math.sqrt(cfg.head_dim_k_mla) if nope_only
             else mla_scale(cfg.rope, cfg.head_dim_k_mla, cfg.yarn_log_mul))
    return MLAttention(
        il, cfg.n_head, cfg.head_dim_k_mla - qk_rope, qk_rope, cfg.kv_lora_rank, None if nope_only else cfg.rope,
        scale,
        wq_a=w.linear(f"{p}.attn_q_a") if has_q_lora else None,
        q_a_norm=w.norm(f"{p}.attn_q_a_norm", cfg.rms_eps) if has_q_lora else None,
        wq_b=w.linear(f"{p}.attn_q_b" if has_q_lora else f"{p}.attn_q"),
        wkv_a=w.linear(f"{p}.attn_kv_a_mqa"), kv_a_norm=w.norm(f"{p}.attn_kv_a_norm", cfg.rms_eps),
        wk_b=w.stacked(f"{p}.attn_k_b.weight"), wv_b=w.stacked(f"{p}.attn_v_b.weight"),
        wo=w.linear(f"{p}.attn_output"), selector=selector, out_gate=w.maybe_linear(f"{p}.attn_gate"))


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        ffn = moe_ffn(w, cfg, il, store) if cfg.is_moe_layer(il) else dense_ffn(w, p)
        blocks.append(Block(w.norm(f"{p}.attn_norm", cfg.rms_eps), mla_attention(w, cfg, il),
                            w.norm(f"{p}.ffn_norm", cfg.rms_eps), ffn))
    emb, out = head(w)
    kv = [(1, cfg.kv_lora_rank + cfg.rope.n_rot, 0)] * cfg.n_layer  # latent + rope key, no values
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out, kv_shapes=kv,
                   kv_typed=[True] * cfg.n_layer)  # the latent rows take --kv-type
