"""What a generated model contains: hyperparameters (Shape), presets, and per architecture the
metadata keys and tensors (names and torch-order shapes) llama.cpp's loader asks for."""

from __future__ import annotations

import importlib
from types import ModuleType

from gguf import GGUFValueType as V

from sparkd.engine.modelgen.shape import (Meta, Shape, Tensor, base_metadata, dense_ffn_tensors, mla_metadata, mla_tensors,
                                          shared_expert_tensors, sigmoid_routing_metadata, yarn_metadata)

# Architectures whose generator lives in a module of its own, sparkd/engine/modelgen/<module>.py,
# defining TINY and PRESETS (dicts of Shape, or of a Shape subclass adding its own fields),
# metadata(s), tensors(s) and check(s); merged into the tables below.
ARCH_MODULES: dict[str, str] = {
    "glm-dsa": "glm_dsa",
    "deepseek4": "deepseek4",
    "kimi-k3": "kimi_k3",
}
SUPPORTED_ARCHS = ("qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "llama", "gemma3", *ARCH_MODULES)
DENSE_ARCHS = ("gemma3",)


# Shapes of real models; make-model scales them by layer count (--layers or --size).
PRESETS: dict[str, Shape] = {
    "qwen3-30b-a3b": Shape("qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                           n_vocab=151936, n_ctx=40960, n_expert=128, n_expert_used=8, n_ff_exp=768,
                           n_ff=6144, rope_base=1e6),
    "qwen3-235b-a22b": Shape("qwen3moe", n_layer=94, n_embd=4096, n_head=64, n_head_kv=4, head_dim=128,
                             n_vocab=151936, n_ctx=40960, n_expert=128, n_expert_used=8, n_ff_exp=1536,
                             n_ff=12288, rope_base=1e6),
    "deepseek-v3": Shape("deepseek2", n_layer=61, n_embd=7168, n_head=128, n_head_kv=1, n_vocab=129280,
                         n_ctx=163840, n_ff=18432, n_expert=256, n_expert_used=8, n_ff_exp=2048,
                         n_expert_shared=1, n_layer_dense_lead=3, q_lora_rank=1536, kv_lora_rank=512,
                         qk_rope=64, qk_nope=128, v_head=128, n_groups=8, n_group_used=4,
                         routed_scale=2.5, yarn_factor=40.0, yarn_orig_ctx=4096),
    "glm-4.5-air": Shape("glm4moe", n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128,
                         n_vocab=151552, n_ctx=131072, n_ff=10944, n_expert=128, n_expert_used=8,
                         n_ff_exp=1408, n_expert_shared=1, n_layer_dense_lead=1, rope_base=1e6,
                         n_rot=64, rms_eps=1e-5),
    "gpt-oss-20b": Shape("gpt-oss", n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
                         n_vocab=201088, n_ctx=131072, n_expert=32, n_expert_used=4, n_ff_exp=2880,
                         rope_base=150000.0, n_swa=128, yarn_factor=32.0, yarn_orig_ctx=4096,
                         rms_eps=1e-5),
    "mixtral-8x7b": Shape("llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                          n_vocab=32000, n_ctx=32768, n_expert=8, n_expert_used=2, n_ff_exp=14336,
                          rope_base=1e6, rms_eps=1e-5),
    "gemma-3-270m": Shape("gemma3", n_layer=18, n_embd=640, n_head=4, n_head_kv=1, head_dim=256,
                          n_vocab=262144, n_ctx=32768, n_ff=2048, n_expert=0, n_expert_used=0,
                          rope_base=1e6, n_swa=512),
}

# Tiny defaults per architecture (tests, oracle runs)
TINY: dict[str, Shape] = {
    "qwen3moe": Shape("qwen3moe"),
    "deepseek2": Shape("deepseek2", n_layer=3, n_head_kv=1, n_expert_shared=1, n_layer_dense_lead=1,
                       n_groups=4, n_group_used=2, routed_scale=2.5),
    "glm4moe": Shape("glm4moe", n_layer=3, n_expert_shared=1, n_layer_dense_lead=1, n_rot=8),
    "gpt-oss": Shape("gpt-oss", n_layer=4, n_swa=4, yarn_factor=4.0, yarn_orig_ctx=64),
    "llama": Shape("llama", n_ff_exp=64),
    "gemma3": Shape("gemma3", n_layer=3, n_head_kv=1, n_expert=0, n_expert_used=0, n_ff=96,
                    rope_base=1e6, n_swa=8, swa_pattern=3, logit_softcap=30.0),
}



def _own_module(arch: str) -> ModuleType:
    return importlib.import_module(f"sparkd.engine.modelgen.{ARCH_MODULES[arch]}")


for _arch in ARCH_MODULES:
    PRESETS.update(_own_module(_arch).PRESETS)
    TINY.update(_own_module(_arch).TINY)


def metadata(s: Shape) -> Meta:
    a = s.arch
    if a in ARCH_MODULES:
        return _own_module(a).metadata(s)
    m = base_metadata(s)
    if a == "gemma3":
        return m + _gemma3_meta(s)
    m += [(f"{a}.expert_count", s.n_expert, V.UINT32), (f"{a}.expert_used_count", s.n_expert_used, V.UINT32)]
    if a == "llama":
        return m + [(f"{a}.feed_forward_length", s.n_ff_exp, V.UINT32),
                    (f"{a}.rope.dimension_count", s.head_dim, V.UINT32)]
    m += [(f"{a}.feed_forward_length", s.n_ff, V.UINT32),
          (f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32)]
    if a == "deepseek2":
        return m + _deepseek2_meta(s)
    m += [(f"{a}.attention.key_length", s.head_dim, V.UINT32),
          (f"{a}.attention.value_length", s.head_dim, V.UINT32),
          (f"{a}.rope.dimension_count", s.n_rot or s.head_dim, V.UINT32)]
    if a == "glm4moe":
        m += [(f"{a}.leading_dense_block_count", s.n_layer_dense_lead, V.UINT32), *sigmoid_routing_metadata(s)]
    if a == "gpt-oss":
        m += [(f"{a}.attention.sliding_window", s.n_swa, V.UINT32)] + yarn_metadata(s)
    return m


def _gemma3_meta(s: Shape) -> Meta:
    a = s.arch
    m: Meta = [(f"{a}.feed_forward_length", s.n_ff, V.UINT32),
               (f"{a}.attention.key_length", s.head_dim, V.UINT32),
               (f"{a}.attention.value_length", s.head_dim, V.UINT32),
               (f"{a}.attention.sliding_window", s.n_swa, V.UINT32)]
    if s.swa_pattern:
        m.append((f"{a}.attention.sliding_window_pattern", s.swa_pattern, V.UINT32))
    if s.logit_softcap:
        m.append((f"{a}.final_logit_softcapping", s.logit_softcap, V.FLOAT32))
    return m


def _deepseek2_meta(s: Shape) -> Meta:
    a = s.arch
    m: Meta = [(f"{a}.leading_dense_block_count", s.n_layer_dense_lead, V.UINT32),
               *mla_metadata(s), *sigmoid_routing_metadata(s)]
    if s.n_groups > 1:
        m += [(f"{a}.expert_group_count", s.n_groups, V.UINT32),
              (f"{a}.expert_group_used_count", s.n_group_used, V.UINT32)]
    if s.yarn_factor:
        m += yarn_metadata(s) + [(f"{a}.rope.scaling.yarn_log_multiplier", 0.1, V.FLOAT32)]
    return m


def tensors(s: Shape) -> list[Tensor]:
    if s.arch in ARCH_MODULES:
        return _own_module(s.arch).tensors(s)
    D, V_ = s.n_embd, s.n_vocab
    out: list[Tensor] = [("token_embd.weight", (V_, D), "w")]
    for il in range(s.n_layer):
        out += _gemma3_layer(s, il) if s.arch == "gemma3" else _layer(s, il)
    out.append(("output_norm.weight", (D,), "norm"))
    if s.arch == "gemma3":
        return out  # the output projection is tied to the token embedding, as in real Gemma 3
    return out + [("output.weight", (V_, D), "w")]


def _gemma3_layer(s: Shape, il: int) -> list[Tensor]:
    p, D = f"blk.{il}", s.n_embd
    return [(f"{p}.attn_norm.weight", (D,), "norm"), *_gqa(s, p),
            (f"{p}.post_attention_norm.weight", (D,), "norm"), (f"{p}.ffn_norm.weight", (D,), "norm"),
            *dense_ffn_tensors(p, D, s.n_ff), (f"{p}.post_ffw_norm.weight", (D,), "norm")]


def _layer(s: Shape, il: int) -> list[Tensor]:
    p, D = f"blk.{il}", s.n_embd
    t: list[Tensor] = [(f"{p}.attn_norm.weight", (D,), "norm")]
    t += mla_tensors(s, p) if s.arch == "deepseek2" else _gqa(s, p)
    norm = "post_attention_norm" if s.arch in ("glm4moe", "gpt-oss") else "ffn_norm"
    t.append((f"{p}.{norm}.weight", (D,), "norm"))
    if il < s.n_layer_dense_lead:
        return t + dense_ffn_tensors(p, D, s.n_ff)
    return t + _moe(s, p)


def _gqa(s: Shape, p: str) -> list[Tensor]:
    D, H, Hkv, Dh = s.n_embd, s.n_head, s.n_head_kv, s.head_dim
    t: list[Tensor] = [(f"{p}.attn_q.weight", (H * Dh, D), "w"), (f"{p}.attn_k.weight", (Hkv * Dh, D), "w"),
                       (f"{p}.attn_v.weight", (Hkv * Dh, D), "w"), (f"{p}.attn_output.weight", (D, H * Dh), "w")]
    if s.arch in ("qwen3moe", "gemma3"):
        t += [(f"{p}.attn_q_norm.weight", (Dh,), "norm"), (f"{p}.attn_k_norm.weight", (Dh,), "norm")]
    if s.arch in ("glm4moe", "gpt-oss"):
        t += [(f"{p}.attn_q.bias", (H * Dh,), "bias"), (f"{p}.attn_k.bias", (Hkv * Dh,), "bias"),
              (f"{p}.attn_v.bias", (Hkv * Dh,), "bias")]
    if s.arch == "gpt-oss":
        t += [(f"{p}.attn_output.bias", (D,), "bias"), (f"{p}.attn_sinks.weight", (H,), "bias")]
    return t


def _moe(s: Shape, p: str) -> list[Tensor]:
    D, E, F = s.n_embd, s.n_expert, s.n_ff_exp
    t: list[Tensor] = [(f"{p}.ffn_gate_inp.weight", (E, D), "f32"),
                       (f"{p}.ffn_gate_exps.weight", (E, F, D), "w"), (f"{p}.ffn_up_exps.weight", (E, F, D), "w"),
                       (f"{p}.ffn_down_exps.weight", (E, D, F), "w")]
    if s.arch in ("deepseek2", "glm4moe"):
        t.append((f"{p}.exp_probs_b.bias", (E,), "bias"))
    if s.arch == "gpt-oss":
        t += [(f"{p}.ffn_gate_inp.bias", (E,), "bias"), (f"{p}.ffn_gate_exps.bias", (E, F), "bias"),
              (f"{p}.ffn_up_exps.bias", (E, F), "bias"), (f"{p}.ffn_down_exps.bias", (E, D), "bias")]
    if s.n_expert_shared:
        t += shared_expert_tensors(s, p)
    return t


def check(s: Shape) -> None:
    """Reject shapes llama.cpp's loader would refuse, naming the option to change."""
    def bad(opt: str, why: str) -> None:
        raise ValueError(f"could not make a {s.arch} model: {opt} {why}")
    if s.arch not in SUPPORTED_ARCHS:
        bad("--arch", f"{s.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    sizes = [("--layers", s.n_layer), ("--hidden", s.n_embd), ("--heads", s.n_head),
             ("--vocab", s.n_vocab), ("--ctx", s.n_ctx)]
    if s.arch not in DENSE_ARCHS:
        sizes += [("--experts", s.n_expert), ("--top-k", s.n_expert_used), ("--ffn", s.n_ff_exp)]
    for opt, v in sizes:
        if v <= 0:
            bad(opt, f"must be positive, got {v}")
    if s.n_expert_used > s.n_expert:
        bad("--top-k", f"{s.n_expert_used} exceeds --experts {s.n_expert}")
    if s.n_head % s.n_head_kv:
        bad("--heads", f"{s.n_head} is not a multiple of the {s.n_head_kv} KV heads")
    if s.n_layer_dense_lead >= s.n_layer:
        bad("--layers", f"{s.n_layer} leaves no MoE layer after {s.n_layer_dense_lead} dense ones")
    if s.arch == "deepseek2" and s.n_layer in (26, 27):
        bad("--layers", f"{s.n_layer} makes llama.cpp treat the model as DeepSeek-V2-Lite (no q_lora); pick another")
    if s.n_groups > 1 and (s.n_expert % s.n_groups or s.n_group_used >= s.n_groups):
        bad("--experts", f"{s.n_expert} must split into {s.n_groups} groups with fewer than that used")
    if s.arch in ARCH_MODULES:
        _own_module(s.arch).check(s)
