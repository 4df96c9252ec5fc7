"""Generator for `glm-dsa` (GLM-5 family): deepseek2's MLA and MoE tensors plus the lightning
indexer's, the `attention.indexer.*` keys, and one NextN/MTP block past the trunk as the converter
writes it (llama.cpp loads and skips it for plain decoding)."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGUFValueType as V

from sparkd.engine.modelgen.shape import (Meta, Shape, Tensor, base_metadata, dense_ffn_tensors, mla_metadata, mla_tensors,
                                          shared_expert_tensors, sigmoid_routing_metadata)

ARCH = "glm-dsa"


@dataclass
class DsaShape(Shape):
    idx_heads: int = 8
    idx_head_dim: int = 64  # llama.cpp's Hadamard rotation needs a multiple of 64
    idx_top_k: int = 4
    # layer il computes its own selection when il < idx_lead or (il - idx_lead) % idx_period == 0;
    # the others reuse it (GLM-5.2: lead 2, period 4; period 1: every layer full, GLM-5/5.1)
    idx_lead: int = 2
    idx_period: int = 1
    n_nextn: int = 1  # NextN/MTP blocks appended after the trunk

    def full_layers(self) -> list[bool]:
        return [il < self.idx_lead or (il - self.idx_lead) % self.idx_period == 0
                for il in range(self.n_layer)]


PRESETS: dict[str, Shape] = {
    # zai-org/GLM-5.2 config.json: 78 trunk layers + 1 MTP, 744B total / 40B active
    "glm-5.2": DsaShape(ARCH, n_layer=78, n_embd=6144, n_head=64, n_head_kv=1, n_vocab=154880,
                        n_ctx=1048576, n_ff=12288, n_expert=256, n_expert_used=8, n_ff_exp=2048,
                        n_expert_shared=1, n_layer_dense_lead=3, q_lora_rank=2048, kv_lora_rank=512,
                        qk_rope=64, qk_nope=192, v_head=256, routed_scale=2.5, rope_base=1e6,
                        rms_eps=1e-5, idx_heads=32, idx_head_dim=128, idx_top_k=2048, idx_period=4),
}

# 3 trunk layers (dense, MoE, MoE) with the last one "shared"; top-4 of up to 48 positions
TINY: dict[str, Shape] = {
    ARCH: DsaShape(ARCH, n_layer=3, n_head_kv=1, n_expert_shared=1, n_layer_dense_lead=1,
                   routed_scale=2.5, idx_lead=1, idx_period=2),
}


def metadata(s: DsaShape) -> Meta:
    a = s.arch
    common = [kv for kv in base_metadata(s) if kv[0] != f"{a}.block_count"]
    return common + [
        (f"{a}.block_count", s.n_layer + s.n_nextn, V.UINT32),  # the trunk plus the MTP blocks
        (f"{a}.nextn_predict_layers", s.n_nextn, V.UINT32),
        (f"{a}.expert_count", s.n_expert, V.UINT32), (f"{a}.expert_used_count", s.n_expert_used, V.UINT32),
        (f"{a}.feed_forward_length", s.n_ff, V.UINT32),
        (f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32),
        (f"{a}.leading_dense_block_count", s.n_layer_dense_lead, V.UINT32),
        *mla_metadata(s), *sigmoid_routing_metadata(s),
        (f"{a}.attention.indexer.head_count", s.idx_heads, V.UINT32),
        (f"{a}.attention.indexer.key_length", s.idx_head_dim, V.UINT32),
        (f"{a}.attention.indexer.top_k", s.idx_top_k, V.UINT32),
        (f"{a}.attention.indexer.types", s.full_layers(), V.ARRAY),
    ]


def tensors(s: DsaShape) -> list[Tensor]:
    D, V_ = s.n_embd, s.n_vocab
    full = s.full_layers()
    out: list[Tensor] = [("token_embd.weight", (V_, D), "w")]
    for il in range(s.n_layer + s.n_nextn):
        out += _layer(s, il, indexer=il < s.n_layer and full[il])
        if il >= s.n_layer:
            out += _nextn(s, il)
    return out + [("output_norm.weight", (D,), "norm"), ("output.weight", (V_, D), "w")]


def _layer(s: DsaShape, il: int, indexer: bool) -> list[Tensor]:
    p, D = f"blk.{il}", s.n_embd
    t: list[Tensor] = [
        (f"{p}.attn_norm.weight", (D,), "norm"), *mla_tensors(s, p), (f"{p}.ffn_norm.weight", (D,), "norm")]
    if indexer:
        Di, Hi = s.idx_head_dim, s.idx_heads
        t += [(f"{p}.indexer.k_norm.weight", (Di,), "norm"), (f"{p}.indexer.k_norm.bias", (Di,), "bias"),
              (f"{p}.indexer.proj.weight", (Hi, D), "w"), (f"{p}.indexer.attn_k.weight", (Di, D), "w"),
              (f"{p}.indexer.attn_q_b.weight", (Hi * Di, s.q_lora_rank), "w")]
    if il < s.n_layer_dense_lead:
        return t + dense_ffn_tensors(p, D, s.n_ff)
    E, F = s.n_expert, s.n_ff_exp
    return t + [(f"{p}.ffn_gate_inp.weight", (E, D), "f32"), (f"{p}.exp_probs_b.bias", (E,), "bias"),
                (f"{p}.ffn_gate_exps.weight", (E, F, D), "w"), (f"{p}.ffn_up_exps.weight", (E, F, D), "w"),
                (f"{p}.ffn_down_exps.weight", (E, D, F), "w"), *shared_expert_tensors(s, p)]


def _nextn(s: DsaShape, il: int) -> list[Tensor]:
    p, D = f"blk.{il}.nextn", s.n_embd
    return [(f"{p}.eh_proj.weight", (D, 2 * D), "w"), (f"{p}.enorm.weight", (D,), "norm"),
            (f"{p}.hnorm.weight", (D,), "norm"), (f"{p}.shared_head_norm.weight", (D,), "norm")]


def check(s: Shape) -> None:
    def bad(field: str, why: str) -> None:
        raise ValueError(f"could not make a {ARCH} model: {field} {why}")
    if not isinstance(s, DsaShape):
        bad("shape", f"must be a {DsaShape.__name__} (the glm-5.2 preset or TINY), got {type(s).__name__}")
    if s.idx_head_dim % 64 or s.idx_head_dim < s.qk_rope:
        bad("idx_head_dim", f"{s.idx_head_dim} must be a multiple of 64 (llama.cpp's Hadamard rotation) "
            f"and hold the {s.qk_rope} rope dims")
    if min(s.idx_heads, s.idx_top_k, s.idx_lead, s.idx_period) <= 0:
        bad("idx_heads/idx_top_k/idx_lead/idx_period", "must be positive")
    if s.n_nextn < 0:
        bad("n_nextn", f"{s.n_nextn} must be >= 0")
