"""Qwen3-MoE (llama.cpp `qwen3moe`): GQA with q/k RMS norms, NeoX rope, softmax top-k routing
renormalised over the selected experts, no shared experts."""

from __future__ import annotations

from typing import Any, Mapping

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.models.config import GATING_SOFTMAX, ModelConfig, base_config
from sparkd.engine.models.decoder import Block, Decoder, gqa_attention, head, moe_ffn
from sparkd.engine.models.weights import Weights

ARCH = "qwen3moe"


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    _, kw = base_config(metadata, ARCH, neox=True, path=path,
                        gating=GATING_SOFTMAX, expert_weights_norm=True)
    return ModelConfig(**kw)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        blocks.append(Block(
            w.norm(f"blk.{il}.attn_norm", cfg.rms_eps), gqa_attention(w, cfg, il),
            w.norm(f"blk.{il}.ffn_norm", cfg.rms_eps), moe_ffn(w, cfg, il, store)))
    emb, out = head(w)
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out)
