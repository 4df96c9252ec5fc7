"""GLM-5 / 5.1 / 5.2 (llama.cpp `glm-dsa`): DeepSeek-V3-style MLA made sparse by a lightning
indexer (layers/lightning_indexer.py), leading dense layers, sigmoid routing with a selection bias
and scaling, one shared expert.

GLM-5.2 computes the selection in "full" layers only; "shared" layers reuse the previous full
layer's (`attention.indexer.types`; without the key, files with a context under 1M tokens are
GLM-5/5.1 with every layer full, longer ones get GLM-5.2's pattern, as llama.cpp decides).
The NextN/MTP block(s) past the trunk (`nextn_predict_layers`) are a speculative-decoding draft
head; llama.cpp skips them for plain decoding and so do we (never loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sparkd.engine.errors import ModelError
from sparkd.engine.layers.experts import ExpertStore
from sparkd.engine.layers.lightning_indexer import SIDE_KEYS, LightningIndexer, SharedSelection
from sparkd.engine.layers.norm import LayerNorm
from sparkd.engine.models.config import GATING_SIGMOID, Meta, ModelConfig, base_config, gating_name, mla_config
from sparkd.engine.models.decoder import Block, Decoder, dense_ffn, head, moe_ffn
from sparkd.engine.models.deepseek2 import mla_attention
from sparkd.engine.models.weights import Weights

ARCH = "glm-dsa"
PROMPT_SCORES = True  # past top_k keys its selection keeps CUDA prompts absorbed, scores in memory (plan)
GLM_5_2_MIN_CTX = 1048576  # llama.cpp: a shorter trained context means GLM-5/5.1 (all layers full)
# llama.cpp leaves the indexer key LayerNorm's eps unset (0) for glm-dsa
INDEXER_NORM_EPS = 0.0


@dataclass(frozen=True)
class IndexerConfig:
    n_head: int
    head_dim: int
    top_k: int
    full: tuple[bool, ...]  # per trunk layer: computes its own selection (else reuses the last)

    def side_floats_per_pos(self) -> int:
        return self.head_dim * sum(self.full)


def glm_5_2_full_layers(n_layer: int) -> tuple[bool, ...]:
    """GLM-5.2's default (its config.json): layers 0 and 1 full, then one full in every four."""
    return tuple(il < 2 or (il - 2) % 4 == 0 for il in range(n_layer))


def config(metadata: Mapping[str, Any], path: str | None = None) -> ModelConfig:
    m, kw = base_config(metadata, ARCH, neox=False, path=path)
    n_layer = kw["n_layer"] - m.int_("{arch}.nextn_predict_layers", 0)
    kw.update(
        n_layer=n_layer,
        gating=gating_name(m, GATING_SIGMOID),
        yarn_log_mul=0.0,  # llama.cpp's glm-dsa loader does not read the yarn log multiplier
        **mla_config(m, ARCH, path))
    ix = _indexer_config(m, n_layer, kw["n_ctx_train"], path)
    kw["extra"] = {"indexer": ix, "side_cache_floats_per_pos": ix.side_floats_per_pos()}
    return ModelConfig(**kw)


def _indexer_config(m: Meta, n_layer: int, n_ctx_train: int, path: str | None) -> IndexerConfig:
    key = "{arch}.attention.indexer.types"
    types = m.get(key)
    if types is None:
        full = (True,) * n_layer if n_ctx_train < GLM_5_2_MIN_CTX else glm_5_2_full_layers(n_layer)
    elif isinstance(types, (list, tuple)):
        full = tuple(bool(t) for t in types)
    else:
        full = (bool(types),) * n_layer
    if len(full) != n_layer or not full[0]:
        raise ModelError(f"could not configure {ARCH} model {path}: {key.format(arch=ARCH)} must give "
                         f"{n_layer} layers starting with a full one, got {list(full)}", path=path)
    return IndexerConfig(n_head=m.int_("{arch}.attention.indexer.head_count"),
                         head_dim=m.int_("{arch}.attention.indexer.key_length"),
                         top_k=m.int_("{arch}.attention.indexer.top_k"), full=full)


def _selector(w: Weights, cfg: ModelConfig, il: int) -> LightningIndexer | SharedSelection:
    ix: IndexerConfig = cfg.extra["indexer"]
    if not ix.full[il]:
        return SharedSelection()
    p = f"blk.{il}.indexer"
    return LightningIndexer(
        il, ix.n_head, ix.head_dim, ix.top_k, cfg.rope,
        wq_b=w.linear(f"{p}.attn_q_b", (ix.n_head * ix.head_dim, cfg.q_lora_rank)),
        wk=w.linear(f"{p}.attn_k", (ix.head_dim, cfg.n_embd)),
        k_norm=LayerNorm(w.get(f"{p}.k_norm.weight"), w.maybe(f"{p}.k_norm.bias"), INDEXER_NORM_EPS),
        weights_proj=w.linear(f"{p}.proj", (ix.n_head, cfg.n_embd)))


def build(cfg: ModelConfig, w: Weights, store: ExpertStore) -> Decoder:
    blocks = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        ffn = moe_ffn(w, cfg, il, store) if cfg.is_moe_layer(il) else dense_ffn(w, p)
        attn = mla_attention(w, cfg, il, selector=_selector(w, cfg, il))
        blocks.append(Block(w.norm(f"{p}.attn_norm", cfg.rms_eps), attn,
                            w.norm(f"{p}.ffn_norm", cfg.rms_eps), ffn))
    emb, out = head(w)
    ix: IndexerConfig = cfg.extra["indexer"]
    kv = [(1, cfg.kv_lora_rank + cfg.rope.n_rot, 0)] * cfg.n_layer  # latent + rope key, no values
    side = {(SIDE_KEYS, il): (ix.head_dim,) for il in range(cfg.n_layer) if ix.full[il]}
    return Decoder(cfg, emb, blocks, w.norm("output_norm", cfg.rms_eps), out, kv_shapes=kv,
                   side_shapes=side, kv_typed=[True] * cfg.n_layer)  # the latent rows take --kv-type
