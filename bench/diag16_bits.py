"""Session 8 (diag16): do this tree's kernels give the bits of another tree's (main's) at the defaults?
Run twice on the GPU, once per tree, the first saving its inputs and outputs, the second loading the
inputs and comparing:

  PYTHONPATH=<main>:<main>/bench python <this file> save F
  PYTHONPATH=<branch>:<branch>/bench python <this file> compare F

Cases: the resident layouts' GEMVs at their default tiles (Q4_K_TILED "bytes" 4/1, Q6_K_TILED 8/1),
the GGUF K-quant GEMVs whose row sums changed with them (Q4_K 4/1, Q6_K 2/1), and moe_decode at its
default tiles (Q4_K: the 128-bit header step at 4/1; Q8_0: the words step). Prints per case: same
bits, or how many values differ and by how much (max |diff| over max |y|).
"""

from __future__ import annotations

import sys

import torch
from gguf import GGMLQuantizationType as T

from sparkd.engine.kernels import dispatch, q4_k_tiled, q6_k_tiled
from sparkd.engine.kernels.matmul import gemv
from sparkd.engine.kernels.moe import ExpertTable, moe_decode

F16_AT = {T.Q4_K: (0, 2), T.Q6_K: (208,), T.Q8_0: (0,)}
DENSE = [(4096, 2048), (14336, 4096)]
MOES = [(T.Q4_K, 2048, 768), (T.Q4_K, 4096, 1536), (T.Q8_0, 2048, 768)]
TOP = 8
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # (the interpreter to try it off the box)


def random_blocks(qtype: T, n_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Random bytes with finite f16 scales (1e-3..1e-1, both signs), uint8 1-D on DEV."""
    b = torch.randint(0, 256, (n_blocks, dispatch.FAMILIES[qtype].block_bytes), dtype=torch.uint8, generator=gen)
    for at in F16_AT[qtype]:
        sign = torch.randint(0, 2, (n_blocks,), generator=gen) * 2 - 1
        d = (sign * 10.0 ** (-3 + 2 * torch.rand(n_blocks, generator=gen))).half()
        b[:, at:at + 2] = d.view(torch.uint8).reshape(-1, 2)
    return b.reshape(-1).to(DEV)


def make_inputs() -> dict:
    gen = torch.Generator().manual_seed(16)
    inputs = {}
    for qtype in (T.Q4_K, T.Q6_K):
        for rows, cols in DENSE:
            inputs[f"{qtype.name} {rows}x{cols}"] = (random_blocks(qtype, rows * cols // 256, gen),
                                                     torch.randn(cols, generator=gen).to(DEV))
    for qtype, dim, width in MOES:
        part = width * dispatch.FAMILIES[qtype].row_bytes(dim)
        n_blocks = 3 * TOP * part // dispatch.FAMILIES[qtype].block_bytes
        inputs[f"moe {qtype.name} {dim}x{width}"] = (random_blocks(qtype, n_blocks, gen),
                                                     torch.randn(dim, generator=gen).to(DEV),
                                                     torch.rand(TOP, generator=gen).to(DEV))
    return inputs


def outputs(inputs: dict) -> dict:
    out = {}
    for key, val in inputs.items():
        name, *rest = key.split()
        if name == "moe":
            qtype, (dim, width) = T[rest[0]], map(int, rest[1].split("x"))
            arena, x, w = val
            part = width * dispatch.FAMILIES[qtype].row_bytes(dim)
            offs = [[(3 * e + k) * part for e in range(TOP)][::-1] for k in range(3)]  # experts in descending slots
            table = ExpertTable(arena, arena, arena, *offs, qtype, qtype, dim, width)
            out[f"{key} default"] = moe_decode(table, x, w)
            continue
        qtype, (rows, cols) = T[name], map(int, rest[0].split("x"))
        raw, x = val
        out[f"{key} GGUF default"] = gemv(raw, qtype, (rows, cols), x)
        mod = q4_k_tiled if qtype == T.Q4_K else q6_k_tiled
        out[f"{key} tiled default"] = mod.gemv(mod.pack(raw, (rows, cols)), x)
    return {k: v.cpu() for k, v in out.items()}


def main() -> None:
    import sparkd

    mode, path = sys.argv[1], sys.argv[2]
    print(f"{mode}: sparkd from {sparkd.__file__}")
    if mode == "save":
        inputs = make_inputs()
        torch.save(dict(inputs={k: tuple(t.cpu() for t in v) for k, v in inputs.items()}, outputs=outputs(inputs)),
                   path)
        print(f"saved {path}")
        return
    saved = torch.load(path)
    mine = outputs({k: tuple(t.to(DEV) for t in v) for k, v in saved["inputs"].items()})
    for key, want in saved["outputs"].items():
        got = mine[key]
        if torch.equal(got, want):
            print(f"{key}: same bits")
            continue
        diff = (got - want).abs()
        print(f"{key}: {int((got != want).sum())} of {got.numel()} values differ, max |diff| {diff.max().item():.3g} "
              f"= {diff.max().item() / want.abs().max().item():.3g} of max |y|")


if __name__ == "__main__":
    main()
