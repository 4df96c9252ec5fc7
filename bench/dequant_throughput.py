"""Dequantize throughput of sparkd.engine.quants on a 64 MiB tensor per type (CPU, and CUDA if present).

Usage: PYTHONPATH=. python bench/dequant_throughput.py [--threads N] [--types Q8_0,Q4_K]
"""

import argparse
import time

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from sparkd.engine import quants

TENSOR_BYTES = 64 << 20


def measure(qtype: T, device: str, repeats: int = 3) -> tuple[float, int]:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = TENSOR_BYTES // type_size
    raw = np.random.default_rng(0).integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for at in {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208]}.get(qtype, []):  # finite f16 scales
        raw[:, at:at + 2] = np.full((n_blocks, 1), 0.01, np.float16).view(np.uint8)
    raw = torch.from_numpy(raw.reshape(-1)).to(device)
    shape = (n_blocks * block_size,)
    quants.dequantize(raw, qtype, shape)  # warm-up: grids, allocator, kernels
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        quants.dequantize(raw, qtype, shape)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, n_blocks * block_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--types", default="Q8_0,Q4_K,Q6_K,IQ2_XS")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for name in args.types.split(","):
            seconds, n_values = measure(T[name], device)
            print(f"{device} threads={torch.get_num_threads()} {name}: 64 MiB in {seconds * 1e3:.1f} ms = "
                  f"{TENSOR_BYTES / seconds / 1e9:.2f} GB/s in, {n_values / seconds / 1e9:.2f} Gvalues/s out")


if __name__ == "__main__":
    main()
