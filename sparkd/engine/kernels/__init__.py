"""Triton kernels that multiply straight from GGUF quant blocks (one file per quant family,
generic GEMV/GEMM in matmul.py, fused MoE decode in moe.py, the family table in dispatch.py)."""
