"""GLM-4.5 / 4.6 / Air (llama.cpp `glm4moe`): GQA with q/k/v biases, partial NeoX rope, optional
q/k norms, leading dense layers, sigmoid routing with a selection bias, shared experts.
The FFN input norm is `post_attention_norm` in GGUF."""

from __future__ import annotations

from typing import Any, Mapping

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.models.config import GATING_SIGMOID, ModelConfig, base_config, gating_name
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, gqa_attention, head, moe_ffn
from sparkd.engine.models.weights import Weights

ARCH = "glm4moe"


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=True, path=path)
    kw["gating"] = gating_name(m, GATING_SIGMOID)
    return ModelConfig(**kw)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        ffn = moe_ffn(w, cfg, il, store) if cfg.is_moe_layer(il) else dense_ffn(w, p)
        blocks.append(Block(w.norm(f"{p}.attn_norm", cfg.rms_eps), gqa_attention(w, cfg, il),
                            w.norm(f"{p}.post_attention_norm", cfg.rms_eps), ffn))
    emb, out = head(w)
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out)
