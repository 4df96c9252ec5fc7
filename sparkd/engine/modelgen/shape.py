"""The hyperparameters of a generated model (Shape), the metadata/tensor list types every
architecture's generator returns, and the pieces several architectures' generators share."""

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


def mla_metadata(s: Shape) -> Meta:
    """The compressed-latent (MLA) layout: cached key = latent + rope part, value = latent."""
    a, V = s.arch, GGUFValueType
    return [
        (f"{a}.attention.q_lora_rank", s.q_lora_rank, V.UINT32),
        (f"{a}.attention.kv_lora_rank", s.kv_lora_rank, V.UINT32),
        (f"{a}.attention.key_length", s.kv_lora_rank + s.qk_rope, V.UINT32),
        (f"{a}.attention.value_length", s.kv_lora_rank, V.UINT32),
        (f"{a}.attention.key_length_mla", s.qk_nope + s.qk_rope, V.UINT32),
        (f"{a}.attention.value_length_mla", s.v_head, V.UINT32),
        (f"{a}.rope.dimension_count", s.qk_rope, V.UINT32),
    ]


def sigmoid_routing_metadata(s: Shape) -> Meta:
    """Shared experts plus DeepSeek-V3-style routing: sigmoid scores, normalised, scaled."""
    a, V = s.arch, GGUFValueType
    return [(f"{a}.expert_shared_count", s.n_expert_shared, V.UINT32),
            (f"{a}.expert_weights_scale", s.routed_scale, V.FLOAT32),
            (f"{a}.expert_weights_norm", True, V.BOOL), (f"{a}.expert_gating_func", 2, V.UINT32)]


def yarn_metadata(s: Shape) -> Meta:
    if not s.yarn_factor:
        return []
    a, V = s.arch, GGUFValueType
    return [(f"{a}.rope.scaling.type", "yarn", V.STRING), (f"{a}.rope.scaling.factor", s.yarn_factor, V.FLOAT32),
            (f"{a}.rope.scaling.original_context_length", s.yarn_orig_ctx, V.UINT32)]


def dense_ffn_tensors(p: str, n_embd: int, n_ff: int) -> list[Tensor]:
    return [(f"{p}.ffn_gate.weight", (n_ff, n_embd), "w"), (f"{p}.ffn_up.weight", (n_ff, n_embd), "w"),
            (f"{p}.ffn_down.weight", (n_embd, n_ff), "w")]


def shared_expert_tensors(s: Shape, p: str) -> list[Tensor]:
    """The always-on shared experts, fused into one FFN of n_expert_shared x the expert width."""
    D, Fs = s.n_embd, s.n_ff_exp * s.n_expert_shared
    return [(f"{p}.ffn_gate_shexp.weight", (Fs, D), "w"), (f"{p}.ffn_up_shexp.weight", (Fs, D), "w"),
            (f"{p}.ffn_down_shexp.weight", (D, Fs), "w")]


def mla_tensors(s: Shape, p: str) -> list[Tensor]:
    """MLA with a q LoRA and the split attn_k_b/attn_v_b layout llama.cpp loads today."""
    D, H, R = s.n_embd, s.n_head, s.kv_lora_rank
    return [
        (f"{p}.attn_q_a_norm.weight", (s.q_lora_rank,), "norm"), (f"{p}.attn_kv_a_norm.weight", (R,), "norm"),
        (f"{p}.attn_q_a.weight", (s.q_lora_rank, D), "w"),
        (f"{p}.attn_q_b.weight", (H * (s.qk_nope + s.qk_rope), s.q_lora_rank), "w"),
        (f"{p}.attn_kv_a_mqa.weight", (R + s.qk_rope, D), "w"),
        (f"{p}.attn_k_b.weight", (H, R, s.qk_nope), "w"), (f"{p}.attn_v_b.weight", (H, s.v_head, R), "w"),
        (f"{p}.attn_output.weight", (D, H * s.v_head), "w"),
    ]
