"""Generator for Kimi K3 (`kimi-k3`): the metadata keys and tensors llama.cpp's kimi-k3 loader
asks for (src/models/kimi-k3.cpp), for tiny test models and for the real model's shapes.

Layer il is MLA (full attention) when (il + 1) % mla_every == 0, else KDA, as the converter
derives it from full_attn_layers (1-indexed); the per-layer head_count_kv array (0 = KDA) says so
in the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGUFValueType as V

from sparkd.engine.modelgen.shape import (Meta, Shape, Tensor, base_metadata, dense_ffn_tensors, mla_metadata, mla_tensors,
                                          shared_expert_tensors, sigmoid_routing_metadata)


@dataclass
class K3Shape(Shape):
    kda_head_dim: int = 16
    d_conv: int = 4
    gate_lower_bound: float = -5.0
    expert_latent: int = 32  # routed experts' width; 0 = experts at n_embd
    attn_res_block_size: int = 2
    situ_beta: float = 4.0
    situ_linear_beta: float = 16.0
    mla_every: int = 3

    def is_mla(self, il: int) -> bool:
        return (il + 1) % self.mla_every == 0


# Kimi K3 (unsloth's UD-IQ1_S is 634.6 GB, 93 layers, 896 experts, top-16, per the field reports).
# llama.cpp's source fixes the layout, not these sizes; widths follow Kimi K2/Kimi Linear (hidden
# 7168, 64 heads of 128, MLA ranks 1536/512, vocab 163840) with the latent width and expert FFN
# chosen so the routed experts hold ~2.7T of the 2.78T parameters.
PRESETS: dict[str, Shape] = {
    "kimi-k3": K3Shape("kimi-k3", n_layer=93, n_embd=7168, n_head=64, n_head_kv=1, n_vocab=163840,
                       n_ctx=262144, n_ff=18432, n_expert=896, n_expert_used=16, n_ff_exp=3072,
                       n_expert_shared=1, n_layer_dense_lead=1, q_lora_rank=1536, kv_lora_rank=512,
                       qk_rope=64, qk_nope=128, v_head=128, routed_scale=2.5, rms_eps=1e-6,
                       kda_head_dim=128, expert_latent=3584, attn_res_block_size=8, mla_every=4),
}

# 3 layers: 0 dense-lead KDA, 1 MoE KDA, 2 MoE MLA; AttnRes banks at layers 0 and 2. KDA heads of
# 32 so ssm_f_b's rows fill Q8_0 blocks: unsloth ships it as Q8_0 (a loader expecting F16 failed)
TINY: dict[str, Shape] = {
    "kimi-k3": K3Shape("kimi-k3", n_layer=3, n_head_kv=1, n_expert_shared=1, n_layer_dense_lead=1,
                       routed_scale=2.5, kda_head_dim=32),
}


def metadata(s: K3Shape) -> Meta:
    a = s.arch
    m = [kv for kv in base_metadata(s) if kv[0] != f"{a}.attention.head_count_kv"]
    return m + [
        (f"{a}.attention.head_count_kv", [1 if s.is_mla(il) else 0 for il in range(s.n_layer)], V.ARRAY),
        (f"{a}.expert_count", s.n_expert, V.UINT32), (f"{a}.expert_used_count", s.n_expert_used, V.UINT32),
        (f"{a}.feed_forward_length", s.n_ff, V.UINT32),
        (f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32),
        (f"{a}.leading_dense_block_count", s.n_layer_dense_lead, V.UINT32),
        *sigmoid_routing_metadata(s),
        (f"{a}.expert_latent_length", s.expert_latent, V.UINT32),
        *mla_metadata(s),
        (f"{a}.ssm.conv_kernel", s.d_conv, V.UINT32), (f"{a}.kda.head_dim", s.kda_head_dim, V.UINT32),
        (f"{a}.kda.gate_lower_bound", s.gate_lower_bound, V.FLOAT32),
        (f"{a}.attn_res.block_size", s.attn_res_block_size, V.UINT32),
        (f"{a}.activation.situ_beta", s.situ_beta, V.FLOAT32),
        (f"{a}.activation.situ_linear_beta", s.situ_linear_beta, V.FLOAT32),
    ]


def tensors(s: K3Shape) -> list[Tensor]:
    D, V_ = s.n_embd, s.n_vocab
    out: list[Tensor] = [("token_embd.weight", (V_, D), "w")]
    for il in range(s.n_layer):
        p = f"blk.{il}"
        out += [(f"{p}.attn_norm.weight", (D,), "norm"), (f"{p}.ffn_norm.weight", (D,), "norm")]
        if s.attn_res_block_size:
            out += [(f"{p}.attn_res_score.weight", (D,), "f32"), (f"{p}.ffn_res_score.weight", (D,), "f32")]
        out += _mla(s, p) if s.is_mla(il) else _kda(s, p)
        out += dense_ffn_tensors(p, s.n_embd, s.n_ff) if il < s.n_layer_dense_lead else _latent_moe(s, p)
    out += [("output_norm.weight", (D,), "norm"), ("output.weight", (V_, D), "w")]
    if s.attn_res_block_size:
        out.append(("output_res_score.weight", (D,), "f32"))
    return out


def _kda(s: K3Shape, p: str) -> list[Tensor]:
    D, H, Dk = s.n_embd, s.n_head, s.kda_head_dim
    C = H * Dk
    return [
        (f"{p}.attn_q.weight", (C, D), "w"), (f"{p}.attn_k.weight", (C, D), "w"),
        (f"{p}.attn_v.weight", (C, D), "w"),
        *[(f"{p}.ssm_conv1d_{x}.weight", (C, 1, s.d_conv), "f32") for x in "qkv"],
        (f"{p}.ssm_f_a.weight", (Dk, D), "w"), (f"{p}.ssm_f_b.weight", (C, Dk), "w"),
        (f"{p}.ssm_beta.weight", (H, D), "w"), (f"{p}.ssm_a", (H,), "bias"),
        (f"{p}.ssm_dt.bias", (C,), "bias"), (f"{p}.ssm_g.weight", (C, D), "w"),
        (f"{p}.ssm_norm.weight", (Dk,), "norm"), (f"{p}.attn_output.weight", (D, C), "w"),
    ]


def _mla(s: K3Shape, p: str) -> list[Tensor]:  # with K3's output gate
    return mla_tensors(s, p) + [(f"{p}.attn_gate.weight", (s.n_head * s.v_head, s.n_embd), "w")]


def _latent_moe(s: K3Shape, p: str) -> list[Tensor]:
    D, E, F = s.n_embd, s.n_expert, s.n_ff_exp
    L = s.expert_latent or D
    t: list[Tensor] = [(f"{p}.ffn_gate_inp.weight", (E, D), "f32"), (f"{p}.exp_probs_b.bias", (E,), "bias"),
                       (f"{p}.ffn_gate_exps.weight", (E, F, L), "w"), (f"{p}.ffn_up_exps.weight", (E, F, L), "w"),
                       (f"{p}.ffn_down_exps.weight", (E, L, F), "w")]
    if s.expert_latent:
        t += [(f"{p}.ffn_routed_down.weight", (L, D), "w"), (f"{p}.ffn_routed_up.weight", (D, L), "w"),
              (f"{p}.ffn_routed_norm.weight", (L,), "norm")]
    if s.n_expert_shared:
        t += shared_expert_tensors(s, p)
    return t


def check(s: K3Shape) -> None:
    def bad(opt: str, why: str) -> None:
        raise ValueError(f"could not make a {s.arch} model: {opt} {why}")
    if not isinstance(s, K3Shape):
        bad("--arch", "needs the kimi-k3 shape fields (use --arch kimi-k3 or --preset kimi-k3)")
    if s.d_conv < 2:
        bad("d_conv", f"must be at least 2, got {s.d_conv}")
