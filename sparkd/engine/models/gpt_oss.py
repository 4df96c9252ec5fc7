"""gpt-oss (llama.cpp `gpt-oss`): attention sinks, sliding-window attention on every other layer
(even layers windowed), biases everywhere, softmax over the selected experts' logits, and the
clamped swiglu variant. YaRN rope (llama.cpp always truncates the correction range)."""

from __future__ import annotations

from typing import Any, Mapping

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.models.config import (GATING_SOFTMAX_WEIGHT, ModelConfig, base_config,
                                          swa_layers)
from sparkd.engine.models.decoder import Block, Decoder, gqa_attention, head, moe_ffn
from sparkd.engine.models.weights import Weights

ARCH = "gpt-oss"
SWA_PATTERN = 2  # llama.cpp's default for this arch: layer il is windowed when il % 2 < 1
PROMPT_SINKS = True  # CUDA prompts run SDPA with the sinks as a key (attention.with_sink_key): its copies in the plan


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=True, path=path, gating=GATING_SOFTMAX_WEIGHT)
    kw.update(n_swa=m.int_("{arch}.attention.sliding_window"),
              swa_layers=swa_layers(m, kw["n_layer"], SWA_PATTERN))
    return ModelConfig(**kw)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        window = cfg.n_swa if cfg.is_swa_layer(il) else 0
        blocks.append(Block(
            w.norm(f"{p}.attn_norm", cfg.rms_eps),
            gqa_attention(w, cfg, il, window=window, qk_norm=False, sinks=True),
            w.norm(f"{p}.post_attention_norm", cfg.rms_eps),
            moe_ffn(w, cfg, il, store, act="swiglu_oai")))
    emb, out = head(w)
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out)
