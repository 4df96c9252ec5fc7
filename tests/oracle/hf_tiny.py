"""Tiny random transformers models run through llama.cpp's own convert_hf_to_gguf.py (sparkd-free).

The matrix models are written by our own GGUF generator, so they can only test conventions we
already believe in. These go the way real checkpoints go: a transformers model (config only,
seeded random weights, offline) → the vendored official converter → GGUF, with transformers'
own forward pass as the reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
VOCAB = 512
N_BYTE_TOKENS = 256
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids right after the BPE vocab

_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 512, "initializer_range": 0.1, "tie_word_embeddings": False,
           "rms_norm_eps": 1e-6}
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

# keyword arguments of each transformers config class; small but with every feature the
# converter has to carry: qk-norm, GQA, MoE top-k with normalisation, MLA with q-LoRA, grouped
# sigmoid routing with a score-correction bias, shared experts and a leading dense layer
TINY = {
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "rope_parameters": _ROPE}),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "intermediate_size": 96,
        "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "q_lora_rank": 48, "kv_lora_rank": 32,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "num_mtp_layers": 0,
        "rope_parameters": _ROPE}),
}

# Keys real hub configs carry that transformers 5.x no longer serialises. Without scoring_func
# the converter omits the gating key and readers fall back to softmax gating for DeepSeek-V3
# (DESIGN.md, oracle section).
EXTRA_CONFIG_JSON = {"deepseek-v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}}


def _transformers():
    return pytest.importorskip("transformers", reason="the converter oracle needs transformers "
                               "(pip install transformers tokenizers safetensors)")


def _perturb(model, seed: int) -> None:
    """transformers initialises norms to 1 and biases to 0, which would hide a swapped norm or a
    dropped score-correction bias; give them seeded random values instead."""
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in tensors:
            if "norm" in name and t.dim() == 1:
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            elif "e_score_correction_bias" in name:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))


def write_tokenizer(model_dir: Path) -> None:
    """A byte-level BPE of 256 byte tokens, a few merges and SPECIALS: enough for the converter's
    gpt2 vocab path; the logits comparison feeds token ids directly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIALS[0],
                                   pad_token=SPECIALS[0])
    fast.save_pretrained(model_dir)


def build_hf_model(arch: str, out_dir: Path, seed: int = 0, hub_keys: bool = True) -> Path:
    """Save a seeded random transformers model of TINY[arch] (F32 safetensors) under out_dir.

    hub_keys=False leaves out EXTRA_CONFIG_JSON, as a plain transformers 5.x save_pretrained does.
    """
    tf = _transformers()
    import torch
    cfg_name, model_name, kw = TINY[arch]
    cfg = getattr(tf, cfg_name)(**_COMMON, **kw, bos_token_id=None, eos_token_id=N_BYTE_TOKENS + 6)
    cfg.architectures = [model_name]
    torch.manual_seed(seed)
    model = getattr(tf, model_name)(cfg).to(torch.float32).eval()
    _perturb(model, seed)
    model_dir = out_dir / (arch if hub_keys else f"{arch}-no-hub-keys")
    model.save_pretrained(model_dir, safe_serialization=True)
    if hub_keys and (extra := EXTRA_CONFIG_JSON.get(arch)):
        path = model_dir / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}, indent=2))
    write_tokenizer(model_dir)
    return model_dir


def convert(jobs: list[tuple[Path, Path]], llama_src: Path, outtype: str = "f32") -> None:
    """Run the vendored convert_hf_to_gguf.py (with its own gguf-py) on each (model_dir, gguf)
    pair, all in one child interpreter: importing the converter costs more than converting."""
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(llama_src), str(llama_src / "gguf-py")]))
    paths = [str(p) for job in jobs for p in job]
    proc = subprocess.run([sys.executable, str(HERE / "run_converter.py"),
                           str(llama_src / "convert_hf_to_gguf.py"), outtype, *paths],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        names = ", ".join(str(d) for d, _ in jobs)
        raise RuntimeError(f"could not convert {names} with {llama_src}/convert_hf_to_gguf.py "
                           f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def hf_logits(model_dir: Path, tokens: list[int], dtype: str = "float64") -> np.ndarray:
    """transformers' logits [T, V] (eager attention and experts), as float64."""
    tf = _transformers()
    import torch
    model = tf.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), attn_implementation="eager",
        experts_implementation="eager").eval()  # the grouped expert matmul has no float64 kernel
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().numpy()
