"""The tiny generated models of the oracle matrix: one per architecture x dtype, seeded."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from sparkd.engine.make_model import Plan, plan, write_model
from sparkd.engine.modelgen.shape import Shape
from sparkd.engine.modelgen.specs import TINY

ARCHS = ["qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "llama", "gemma3", "kimi-k3"]
DTYPES = ["F32", "F16", "Q8_0", "Q4_K", "Q6_K", "Q2_K"]
TOKENS = [int(t) for t in np.random.default_rng(5).integers(0, 256, 48)]
SEED = 11
K_ROW = 256  # K-quant super-block: rows shorter than this are written as F16 (matrix_plan)


def matrix_shape(arch: str, dtype: str) -> Shape:
    """The tiny shape, widened for K-quants so every weight row is a multiple of 256."""
    shape = TINY[arch]
    if not dtype.endswith("_K"):
        return shape
    wide = shape.replace(n_embd=K_ROW, n_ff=K_ROW, n_ff_exp=K_ROW)
    if arch in ("deepseek2", "glm-dsa"):  # q_b/kv_a read the lora ranks; wv_b reads the rank; wk_b reads qk_nope
        return wide.replace(q_lora_rank=K_ROW, kv_lora_rank=K_ROW)
    if arch == "kimi-k3":  # as deepseek2, plus the experts' latent width
        return wide.replace(q_lora_rank=K_ROW, kv_lora_rank=K_ROW, expert_latent=K_ROW)
    return wide.replace(head_dim=K_ROW // shape.n_head)


def matrix_plan(arch: str, dtype: str) -> Plan:
    """The model's tensors: dtype, F32 where make-model keeps it, and F16 for the few weights whose rows the type does
    not fill (MLA's per-head matrices, the output of heads 16 wide). make-model writes llama-quantize's fallback
    types there since session 36 (Q8_0 for Q6_K, ...); with them the random deepseek2 Q6_K model's routes flip between
    a batch and single tokens, in llama.cpp and here alike (0.39-0.73 relative to llama.cpp, 0.40 between our own
    full and incremental runs), where F16 keeps the table's measurements (tests/oracle/test_make_model_types.py checks
    the fallback types against llama-quantize instead)."""
    shape = matrix_shape(arch, dtype)
    fell_back = [(f"^{re.escape(name)}$", "F16") for name, _, q, _, _ in plan(shape, dtype).tensors
                 if q.name not in (dtype, "F32", "F16", "I32")]
    return plan(shape, dtype, fell_back)


def matrix_model(directory: Path, arch: str, dtype: str) -> Path:
    path = directory / f"{arch}-{dtype}.gguf"
    if not path.exists():
        write_model(path, matrix_plan(arch, dtype), seed=SEED)
    return path
