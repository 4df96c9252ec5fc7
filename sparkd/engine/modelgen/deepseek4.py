"""DeepSeek V4 (llama.cpp `deepseek4`): the metadata keys and tensors llama.cpp's loader asks for
(src/models/deepseek4.cpp load_arch_hparams / load_arch_tensors).

Per layer: manifold-constrained hyper-connections (hc_mult residual streams mixed by a
Sinkhorn-normalised matrix), single-KV-head attention with a low-rank query, attention sinks, a
sliding window and a grouped low-rank output; per-layer compression (0: window only, 4: CSA with
the lightning indexer, 128: HCA); sqrt-softplus routed experts, the first hash_layer_count
layers routed by a token → experts table, one shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGUFValueType as V

from sparkd.engine.modelgen.shape import Meta, Shape, Tensor, base_metadata, shared_expert_tensors, yarn_metadata

ARCH = "deepseek4"
GATING_SQRT_SOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
COMPRESS_RATIOS = (0, 4, 128)


@dataclass
class DeepSeek4Shape(Shape):
    o_groups: int = 2
    o_lora_rank: int = 16
    hc_mult: int = 4  # llama.cpp asserts 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    n_hash_layers: int = 1
    swiglu_limit: float = 10.0
    compress_rope_base: float = 160000.0
    # one entry per layer; an empty tuple means 0 (window-only attention) everywhere
    compress_ratios: tuple[int, ...] = field(default_factory=tuple)
    indexer_heads: int = 4
    indexer_head_dim: int = 16
    indexer_top_k: int = 8

    def ratios(self) -> tuple[int, ...]:
        if not self.compress_ratios:
            return (0,) * self.n_layer
        # a preset lists its pattern once; make-model may ask for more or fewer layers
        pattern = self.compress_ratios
        return tuple(pattern[il % len(pattern)] for il in range(self.n_layer))


TINY: dict[str, Shape] = {
    # head_dim 32 with 8 rotary dims, 4 query heads in 2 output groups; window 6 < the tests'
    # sequences so the window is exercised; hash routing on layer 0; one layer of each
    # compression (llama.cpp needs a CSA layer; its indexer keys must be a multiple of 64 wide).
    # 16 indexer heads: with 4, whole rows of relu scores are 0 and top-k ties break by sort order.
    ARCH: DeepSeek4Shape(ARCH, n_layer=3, n_embd=64, n_head=4, n_head_kv=1, head_dim=32, n_rot=8,
                         n_expert=8, n_expert_used=2, n_ff_exp=32, n_expert_shared=1,
                         q_lora_rank=32, n_swa=6, routed_scale=1.5, n_hash_layers=1,
                         compress_ratios=(0, 4, 128), indexer_heads=16, indexer_head_dim=64,
                         indexer_top_k=3, yarn_factor=4.0, yarn_orig_ctx=64),
}

# DeepSeek-V4-Flash's shapes (43 layers; make-model scales by layer count). The per-layer
# compression list is taken as alternating CSA/HCA; a real file carries its own list.
PRESETS: dict[str, Shape] = {
    "deepseek-v4-flash": DeepSeek4Shape(
        ARCH, n_layer=43, n_embd=4096, n_head=64, n_head_kv=1, head_dim=512, n_rot=64,
        n_vocab=129280, n_ctx=1048576, n_expert=256, n_expert_used=6, n_ff_exp=2048,
        n_expert_shared=1, q_lora_rank=1024, n_swa=128, routed_scale=1.5, rope_base=10000.0,
        yarn_factor=16.0, yarn_orig_ctx=65536, o_groups=8, o_lora_rank=1024, n_hash_layers=3, swiglu_limit=10.0,
        compress_ratios=(4, 128), indexer_heads=64, indexer_head_dim=128, indexer_top_k=512),
}


def metadata(s: Shape) -> Meta:
    assert isinstance(s, DeepSeek4Shape)
    a, L = s.arch, s.n_layer
    return base_metadata(s) + [
        (f"{a}.expert_count", s.n_expert, V.UINT32), (f"{a}.expert_used_count", s.n_expert_used, V.UINT32),
        (f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32),
        (f"{a}.expert_shared_count", s.n_expert_shared, V.UINT32),
        (f"{a}.expert_weights_scale", s.routed_scale, V.FLOAT32),
        (f"{a}.expert_weights_norm", True, V.BOOL),
        (f"{a}.expert_gating_func", GATING_SQRT_SOFTPLUS, V.UINT32),
        (f"{a}.swiglu_clamp_exp", [s.swiglu_limit] * L, V.ARRAY),
        (f"{a}.swiglu_clamp_shexp", [s.swiglu_limit] * L, V.ARRAY),
        (f"{a}.attention.key_length", s.head_dim, V.UINT32),
        (f"{a}.attention.value_length", s.head_dim, V.UINT32),
        (f"{a}.rope.dimension_count", s.n_rot or s.head_dim, V.UINT32),
        (f"{a}.attention.q_lora_rank", s.q_lora_rank, V.UINT32),
        (f"{a}.attention.sliding_window", s.n_swa, V.UINT32),
        (f"{a}.attention.indexer.head_count", s.indexer_heads, V.UINT32),
        (f"{a}.attention.indexer.key_length", s.indexer_head_dim, V.UINT32),
        (f"{a}.attention.indexer.top_k", s.indexer_top_k, V.UINT32),
        (f"{a}.attention.output_group_count", s.o_groups, V.UINT32),
        (f"{a}.attention.output_lora_rank", s.o_lora_rank, V.UINT32),
        (f"{a}.attention.compress_ratios", list(s.ratios()), V.ARRAY),
        (f"{a}.attention.compress_rope_freq_base", s.compress_rope_base, V.FLOAT32),
        (f"{a}.hyper_connection.count", s.hc_mult, V.UINT32),
        (f"{a}.hyper_connection.sinkhorn_iterations", s.hc_sinkhorn_iters, V.UINT32),
        (f"{a}.hyper_connection.epsilon", s.hc_eps, V.FLOAT32),
        (f"{a}.hash_layer_count", s.n_hash_layers, V.UINT32),
        (f"{a}.embedding_length_out", s.n_embd * s.hc_mult, V.UINT32),
    ] + yarn_metadata(s)  # YaRN applies to the compressed layers' rope only (window-only layers: plain)


def tensors(s: Shape) -> list[Tensor]:
    assert isinstance(s, DeepSeek4Shape)
    D, V_, hc = s.n_embd, s.n_vocab, s.hc_mult
    out: list[Tensor] = [("token_embd.weight", (V_, D), "w")]
    ratios = s.ratios()
    for il in range(s.n_layer):
        out += _layer(s, il, ratios[il])
    return out + [("output_norm.weight", (D,), "norm"), ("output.weight", (V_, D), "w"),
                  ("output_hc_fn.weight", (hc, hc * D), "f32"), ("output_hc_base.weight", (hc,), "bias"),
                  ("output_hc_scale.weight", (1,), "bias")]


def _layer(s: DeepSeek4Shape, il: int, ratio: int) -> list[Tensor]:
    p, D, H, Dh, hc = f"blk.{il}", s.n_embd, s.n_head, s.head_dim, s.hc_mult
    mix = (2 + hc) * hc
    t: list[Tensor] = [
        (f"{p}.attn_norm.weight", (D,), "norm"), (f"{p}.attn_sinks.weight", (H,), "bias"),
        (f"{p}.attn_q_a.weight", (s.q_lora_rank, D), "w"), (f"{p}.attn_q_a_norm.weight", (s.q_lora_rank,), "norm"),
        (f"{p}.attn_q_b.weight", (H * Dh, s.q_lora_rank), "w"),
        (f"{p}.attn_kv.weight", (Dh, D), "w"), (f"{p}.attn_kv_a_norm.weight", (Dh,), "norm"),
        (f"{p}.attn_output_a.weight", (s.o_lora_rank * s.o_groups, H * Dh // s.o_groups), "w"),
        (f"{p}.attn_output_b.weight", (D, s.o_groups * s.o_lora_rank), "w"),
    ]
    for part in ("attn", "ffn"):
        t += [(f"{p}.hc_{part}_fn.weight", (mix, hc * D), "f32"), (f"{p}.hc_{part}_base.weight", (mix,), "bias"),
              (f"{p}.hc_{part}_scale.weight", (3,), "bias")]
    t += _compressor(s, p, ratio)
    E, F = s.n_expert, s.n_ff_exp
    t.append((f"{p}.ffn_gate_inp.weight", (E, D), "f32"))
    if il < s.n_hash_layers:
        t.append((f"{p}.ffn_gate_tid2eid.weight", (s.n_vocab, s.n_expert_used), "ids"))
    else:
        t.append((f"{p}.exp_probs_b.bias", (E,), "bias"))
    return t + [
        (f"{p}.ffn_norm.weight", (D,), "norm"),
        (f"{p}.ffn_gate_exps.weight", (E, F, D), "w"), (f"{p}.ffn_up_exps.weight", (E, F, D), "w"),
        (f"{p}.ffn_down_exps.weight", (E, D, F), "w"), *shared_expert_tensors(s, p),
    ]


def _compressor(s: DeepSeek4Shape, p: str, ratio: int) -> list[Tensor]:
    if ratio == 0:
        return []
    D, Dh, coff = s.n_embd, s.head_dim, 2 if ratio == 4 else 1
    t: list[Tensor] = [
        (f"{p}.attn_compressor_kv.weight", (coff * Dh, D), "w"),
        (f"{p}.attn_compressor_gate.weight", (coff * Dh, D), "w"),
        (f"{p}.attn_compressor_ape.weight", (ratio, coff * Dh), "bias"),
        (f"{p}.attn_compressor_norm.weight", (Dh,), "norm"),
    ]
    if ratio == 4:
        Di = s.indexer_head_dim
        t += [(f"{p}.indexer.proj.weight", (s.indexer_heads, D), "w"),
              (f"{p}.indexer.attn_q_b.weight", (s.indexer_heads * Di, s.q_lora_rank), "w"),
              (f"{p}.indexer_compressor_kv.weight", (2 * Di, D), "w"),
              (f"{p}.indexer_compressor_gate.weight", (2 * Di, D), "w"),
              (f"{p}.indexer_compressor_ape.weight", (ratio, 2 * Di), "bias"),
              (f"{p}.indexer_compressor_norm.weight", (Di,), "norm")]
    return t


def check(s: Shape) -> None:
    assert isinstance(s, DeepSeek4Shape)

    def bad(opt: str, why: str) -> None:
        raise ValueError(f"could not make a {s.arch} model: {opt} {why}")
    if s.hc_mult != 4:
        bad("hc_mult", f"must be 4 (llama.cpp asserts it), got {s.hc_mult}")
    if s.n_head % s.o_groups:
        bad("--heads", f"{s.n_head} is not a multiple of the {s.o_groups} output groups")
    if s.n_head_kv != 1:
        bad("--kv-heads", f"must be 1 (one shared key/value head), got {s.n_head_kv}")
    if s.n_swa <= 0:
        bad("n_swa", f"must be positive (every layer uses the sliding window), got {s.n_swa}")
    if any(r not in COMPRESS_RATIOS for r in s.ratios()):
        bad("compress_ratios", f"{list(s.compress_ratios)} may only hold {COMPRESS_RATIOS}")
    if 4 not in s.ratios():
        bad("compress_ratios", "need a ratio-4 (CSA) layer: llama.cpp's cache crashes without one")
    if s.indexer_head_dim % 64:
        bad("indexer_head_dim", f"{s.indexer_head_dim} must be a multiple of 64 (llama.cpp's Hadamard rotation)")
    if s.head_dim == s.indexer_head_dim:
        bad("indexer_head_dim", "must differ from head_dim (llama.cpp then rotates every key cache)")
