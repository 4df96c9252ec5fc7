"""ModelConfig: every hyperparameter an architecture needs, read once from GGUF metadata.

Key names and defaults follow llama.cpp's loader (llama-model.cpp, src/models/<arch>.cpp), so a
GGUF that llama.cpp accepts configures the same network here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from sparkd.engine.errors import MissingKeyError, ModelError
from sparkd.engine.layers.moe import (  # noqa: F401 (architectures import the gating names from here)
    GATING_SIGMOID, GATING_SOFTMAX, GATING_SOFTMAX_WEIGHT, GATING_SQRT_SOFTPLUS)
from sparkd.engine.layers.rope import RopeConfig

# llama.cpp's gating function ids (gguf.ExpertGatingFuncType has 1 and 2; 3 is internal to llama.cpp).
_GATING_IDS = {1: GATING_SOFTMAX, 2: GATING_SIGMOID, 3: GATING_SOFTMAX_WEIGHT, 4: GATING_SQRT_SOFTPLUS}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ctx_train: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    rms_eps: float
    rope: RopeConfig
    n_ff: int = 0  # dense FFN width (dense lead layers, dense models)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_expert_shared: int = 0
    n_layer_dense_lead: int = 0
    gating: str = GATING_SOFTMAX
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0  # 0 and 1 both mean "no scaling", as in llama.cpp
    n_expert_groups: int = 0
    n_group_used: int = 0
    # MLA (deepseek2)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    head_dim_k_mla: int = 0
    head_dim_v_mla: int = 0
    yarn_log_mul: float = 0.0
    # sliding window (gpt-oss, gemma3); swa_layers[i] says whether layer i is windowed
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_swa: RopeConfig | None = None
    attn_scale: float = 0.0  # 0 → 1/sqrt(head_dim_k)
    logit_softcap: float = 0.0  # gemma: cap * tanh(logits / cap) when non-zero
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def is_moe_layer(self, il: int) -> bool:
        return self.is_moe and il >= self.n_layer_dense_lead

    def is_swa_layer(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]


class Meta:
    """Typed access to `{arch}.*` metadata keys with clear errors naming the key."""

    def __init__(self, metadata: Mapping[str, Any], arch: str, path: str | None = None):
        self.md, self.arch, self.path = metadata, arch, path

    def _key(self, key: str) -> str:
        return key.format(arch=self.arch)

    def has(self, key: str) -> bool:
        return self._key(key) in self.md

    def get(self, key: str, default: Any = None, required: bool = False) -> Any:
        full = self._key(key)
        if full not in self.md:
            if required:
                raise MissingKeyError(
                    f"could not configure {self.arch} model: metadata key {full!r} is missing",
                    path=self.path)
            return default
        return self.md[full]

    def int_(self, key: str, default: int | None = None) -> int:
        v = self.get(key, default, required=default is None)
        return int(_per_layer_max(v))

    def float_(self, key: str, default: float | None = None) -> float:
        return float(self.get(key, default, required=default is None))


def _per_layer_max(v: Any) -> Any:
    # llama.cpp's get_key_or_arr accepts a per-layer array; a uniform array is the common case.
    if isinstance(v, (list, tuple)):
        if len(set(v)) > 1:
            raise ModelError(f"could not configure model: per-layer values {list(v)[:8]}... differ; "
                             "only uniform per-layer hyperparameters are supported")
        return v[0]
    return v


def rope_config(meta: Meta, n_rot: int, neox: bool, n_ctx_train: int,
                base_key: str = "{arch}.rope.freq_base", base_default: float = 10000.0) -> RopeConfig:
    """Rope parameters as llama.cpp's context derives them (llama-context.cpp, yarn branch)."""
    base = meta.float_(base_key, base_default)
    scaling = str(meta.get("{arch}.rope.scaling.type", "linear"))
    factor = meta.float_("{arch}.rope.scaling.factor", meta.float_("{arch}.rope.scale_linear", 0.0))
    freq_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
    ext_factor = 1.0 if scaling == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor != 0.0:
        f = 1.0 / freq_scale
        log_mul = meta.float_("{arch}.rope.scaling.yarn_log_multiplier", 0.0)
        if meta.arch == "deepseek2" and log_mul != 0.0:
            log_mul /= 0.1  # the converter stores 0.1 * mscale_all_dim
        attn_factor = _yarn_mscale(f, log_mul, meta.arch) / (1.0 + 0.1 * math.log(f)) if f > 1 else 1.0
    attn_factor *= meta.float_("{arch}.rope.scaling.attn_factor", 1.0)
    return RopeConfig(
        n_rot=n_rot, base=base, neox=neox, freq_scale=freq_scale, ext_factor=ext_factor,
        attn_factor=attn_factor,
        beta_fast=meta.float_("{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=meta.float_("{arch}.rope.scaling.yarn_beta_slow", 1.0),
        n_ctx_orig=meta.int_("{arch}.rope.scaling.original_context_length", n_ctx_train))


def _yarn_mscale(factor: float, log_mul: float, arch: str) -> float:
    def get(scale: float, mscale: float) -> float:
        return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0
    if log_mul == 0.0:
        return get(factor, 1.0)
    mscale = log_mul if (arch == "deepseek2" and log_mul != 1.0) else 1.0
    return get(factor, mscale) / get(factor, log_mul)


def base_config(metadata: Mapping[str, Any], arch: str, neox: bool,
                path: str | None = None, **overrides: Any) -> tuple[Meta, dict[str, Any]]:
    """The keys every architecture shares; returns the Meta reader and ModelConfig kwargs."""
    m = Meta(metadata, arch, path)
    n_embd = m.int_("{arch}.embedding_length")
    n_head = m.int_("{arch}.attention.head_count")
    n_ctx = m.int_("{arch}.context_length")
    head_k = m.int_("{arch}.attention.key_length", n_embd // n_head)
    n_vocab = m.int_("{arch}.vocab_size", 0) or len(metadata.get("tokenizer.ggml.tokens", ()))
    if n_vocab == 0:
        raise MissingKeyError(f"could not configure {arch} model: neither {arch}.vocab_size nor "
                              "tokenizer.ggml.tokens gives the vocabulary size", path=path)
    kw: dict[str, Any] = dict(
        arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=m.int_("{arch}.block_count"),
        n_ctx_train=n_ctx, n_head=n_head,
        n_head_kv=m.int_("{arch}.attention.head_count_kv", n_head),
        head_dim_k=head_k, head_dim_v=m.int_("{arch}.attention.value_length", n_embd // n_head),
        rms_eps=m.float_("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope=rope_config(m, m.int_("{arch}.rope.dimension_count", head_k), neox, n_ctx),
        n_ff=m.int_("{arch}.feed_forward_length", 0),
        n_expert=m.int_("{arch}.expert_count", 0),
        n_expert_used=m.int_("{arch}.expert_used_count", 0),
        n_ff_exp=m.int_("{arch}.expert_feed_forward_length", 0),
        n_expert_shared=m.int_("{arch}.expert_shared_count", 0),
        n_layer_dense_lead=m.int_("{arch}.leading_dense_block_count", 0),
        expert_weights_norm=bool(m.get("{arch}.expert_weights_norm", False)),
        expert_weights_scale=m.float_("{arch}.expert_weights_scale", 0.0),
        n_expert_groups=m.int_("{arch}.expert_group_count", 0),
        n_group_used=m.int_("{arch}.expert_group_used_count", 0),
    )
    kw.update(overrides)
    return m, kw


def mla_config(m: Meta, arch: str, path: str | None) -> dict[str, int]:
    """ModelConfig's MLA (compressed-latent attention) sizes, for the layout llama.cpp loads today:
    key_length_mla present, attn_k_b/attn_v_b split."""
    if not m.has("{arch}.attention.key_length_mla"):
        raise ModelError(f"could not configure {arch} model {path}: metadata key {arch}.attention.key_length_mla "
                         "is missing: only the MLA layout (split attn_k_b/attn_v_b) is supported; "
                         "re-convert with a current convert_hf_to_gguf.py", path=path)
    return dict(q_lora_rank=m.int_("{arch}.attention.q_lora_rank", 0),
                kv_lora_rank=m.int_("{arch}.attention.kv_lora_rank"),
                head_dim_k_mla=m.int_("{arch}.attention.key_length_mla"),
                head_dim_v_mla=m.int_("{arch}.attention.value_length_mla"))


def gating_name(meta: Meta, default: str) -> str:
    gid = int(meta.get("{arch}.expert_gating_func", 0))
    return _GATING_IDS.get(gid, default)


def swa_layers(meta: Meta, n_layer: int, default_pattern: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp's load_swa_pattern decides.

    `{arch}.attention.sliding_window_pattern` is a per-layer bool array or a period n: layer il
    is windowed when il % n < n - 1 (every n-th layer global; n = 0 means all windowed).
    """
    pattern = meta.get("{arch}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(x) for x in pattern)
    n = int(pattern)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
