"""Mixtral-style MoE under llama.cpp's `llama` arch (and dense llama): GQA, normal (GPT-J) rope,
softmax top-k routing renormalised over the selected experts; the expert width is n_ff."""

from __future__ import annotations

from typing import Any, Mapping

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.models.config import GATING_SOFTMAX, ModelConfig, base_config
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, gqa_attention, head, moe_ffn
from sparkd.engine.models.weights import Weights

ARCH = "llama"


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    _, kw = base_config(metadata, ARCH, neox=False, path=path, gating=GATING_SOFTMAX,
                        expert_weights_norm=True)
    if kw["n_expert"]:
        kw["n_ff_exp"] = kw["n_ff_exp"] or kw["n_ff"]  # llama stores the expert width as n_ff
    return ModelConfig(**kw)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        ffn = moe_ffn(w, cfg, il, store) if cfg.is_moe else dense_ffn(w, p)
        blocks.append(Block(w.norm(f"{p}.attn_norm", cfg.rms_eps),
                            gqa_attention(w, cfg, il, qk_norm=False),
                            w.norm(f"{p}.ffn_norm", cfg.rms_eps), ffn))
    emb, out = head(w)
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out)
