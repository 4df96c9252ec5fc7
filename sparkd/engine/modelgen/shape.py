"""The hyperparameters of a generated model (Shape) and the metadata/tensor list types every
architecture's generator returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gguf import GGUFValueType


@dataclass
class Shape:
    arch: str
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_vocab: int = 512
    n_ctx: int = 256
    n_ff: int = 128  # dense FFN width (dense-lead layers)
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_expert_shared: int = 0
    n_layer_dense_lead: int = 0
    rope_base: float = 10000.0
    n_rot: int = 0  # 0 → head_dim
    rms_eps: float = 1e-6
    # deepseek2 MLA and routing
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_rope: int = 8
    qk_nope: int = 16
    v_head: int = 16
    n_groups: int = 0
    n_group_used: int = 0
    routed_scale: float = 1.0
    # gpt-oss
    n_swa: int = 0
    yarn_factor: float = 0.0
    yarn_orig_ctx: int = 0
    # gemma3 (n_swa is shared with gpt-oss): every swa_pattern-th layer global, 0 = arch default
    swa_pattern: int = 0
    logit_softcap: float = 0.0

    def replace(self, **kw: Any) -> "Shape":
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})


Meta = list[tuple[str, Any, GGUFValueType]]
Tensor = tuple[str, tuple[int, ...], str]  # name, torch-order shape, kind: w | norm | bias | f32


def base_metadata(s: Shape) -> Meta:
    """The keys every architecture's loader reads."""
    a, V = s.arch, GGUFValueType
    return [
        (f"{a}.context_length", s.n_ctx, V.UINT32), (f"{a}.embedding_length", s.n_embd, V.UINT32),
        (f"{a}.block_count", s.n_layer, V.UINT32), (f"{a}.attention.head_count", s.n_head, V.UINT32),
        (f"{a}.attention.head_count_kv", s.n_head_kv, V.UINT32),
        (f"{a}.rope.freq_base", s.rope_base, V.FLOAT32),
        (f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps, V.FLOAT32),
        (f"{a}.vocab_size", s.n_vocab, V.UINT32),
    ]
