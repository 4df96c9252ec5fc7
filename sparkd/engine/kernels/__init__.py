"""Triton kernels that multiply straight from GGUF quant blocks (one file per quant family, generic
GEMV in matmul.py, the prefill GEMMs in prefill_gemm.py (a long prompt's: slab_gemm.py, cuBLAS over 16-bit slabs of
the dequantized weight), fused MoE decode in moe.py, the family
table in dispatch.py), and the fused decode kernels that replace runs of small torch kernels on CUDA
(rms_norm.py, rope_kv.py, decode_attention.py with grouped_attention.py: its default, a KV head's query heads in one
program, rope_attention.py: rope_kv and the attention in one launch, router_topk.py; switched in fused.py)."""

import torch

# prefill_gemm.gemm's precisions (tl.dot's input precision, or "int8": the integer GEMM), here and not in prefill_gemm so
# that layers/linear's SPARKD_PREFILL_PRECISION takes them without importing triton
INT8 = "int8"
PRECISIONS = ("ieee", "tf32x3", "tf32", INT8)
# slab_gemm's 16-bit types by SPARKD_SLAB_GEMM's names, here for the same reason
SLAB_TYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# moe_prefill's slab experts' scratch: the most 16-bit expert weights (gate, up and down) they dequantize at a time,
# here so that the memory plan counts it without importing triton. Session 47, H100: a table that fits runs without
# a host sync; Qwen3-30B-A3B's 128 experts take 1.2 GB of bf16, gpt-oss-20b's 32 1.6 GB
EXPERT_SLAB_BYTES = 2 << 30
