"""Triton kernels that multiply straight from GGUF quant blocks (one file per quant family,
generic GEMV/GEMM in matmul.py, fused MoE decode in moe.py, the family table in dispatch.py), and
the fused decode kernels that replace runs of small torch kernels on CUDA (rms_norm.py, rope_kv.py,
decode_attention.py, router_topk.py; switched in fused.py)."""
