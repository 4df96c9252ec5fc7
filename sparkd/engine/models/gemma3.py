"""Gemma 3 dense (llama.cpp `gemma3`): embeddings scaled by sqrt(n_embd), q/k RMS norms, NeoX
rope with its own base on sliding-window layers (every sixth layer global by default), norms
before and after both attention and FFN, gelu-tanh gated FFN, optional final logit soft-cap.

The converter already adds Gemma's +1 to every norm weight, so the norms are plain RMSNorm here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.models.config import ModelConfig, base_config, swa_layers
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, gqa_attention, head
from sparkd.engine.models.weights import Weights

ARCH = "gemma3"
SWA_PATTERN = 6  # llama.cpp's default: five windowed layers, then one global
SWA_ROPE_BASE = 10000.0  # llama.cpp's default rope base of windowed layers
N_LAYER_27B = 62  # gemma_pytorch scales queries by 1/sqrt(n_embd/n_head) only for the 27B model


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=True, path=path)
    n_swa = m.int_("{arch}.attention.sliding_window", 0)
    if n_swa > 0:
        kw.update(n_swa=n_swa, swa_layers=swa_layers(m, kw["n_layer"], SWA_PATTERN),
                  rope_swa=dataclasses.replace(
                      kw["rope"], base=m.float_("{arch}.rope.freq_base_swa", SWA_ROPE_BASE),
                      freq_scale=1.0))
    head_dim = kw["n_embd"] // kw["n_head"] if kw["n_layer"] == N_LAYER_27B else kw["head_dim_k"]
    kw.update(attn_scale=1.0 / math.sqrt(head_dim),
              logit_softcap=m.float_("{arch}.final_logit_softcapping", 0.0))
    return ModelConfig(**kw)


def build(cfg: ModelConfig, w: Weights, store: ExpertStore | None = None) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        swa = cfg.is_swa_layer(il)
        attn = gqa_attention(w, cfg, il, rope=cfg.rope_swa if swa else cfg.rope,
                             window=cfg.n_swa if swa else 0)
        blocks.append(Block(
            w.norm(f"{p}.attn_norm", cfg.rms_eps), attn,
            w.norm(f"{p}.ffn_norm", cfg.rms_eps), dense_ffn(w, p, act="gelu"),
            post_attn_norm=w.norm(f"{p}.post_attention_norm", cfg.rms_eps),
            post_ffn_norm=w.norm(f"{p}.post_ffw_norm", cfg.rms_eps)))
    emb, out = head(w)
    embd_scale = float(np.sqrt(np.float32(cfg.n_embd)))  # sqrtf in llama.cpp
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out, embd_scale=embd_scale)
