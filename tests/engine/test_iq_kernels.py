"""The i-quant families' Triton dequant (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) value by value against
the torch CPU reference (quants.dequantize, itself checked against gguf-py and llama.cpp), through
a small harness kernel that calls a family's dequant on a tile of rows and stores the values; and
the MoE decode kernels on the Kimi K3 expert mix at its real shapes (GPU). The GEMV, GEMM and tiny
MoE checks for these families run with every other family's in test_kernels.py.

Random bytes are valid blocks for these layouts (every index fits its grid, every sign index its
table) once the f16 scale is made finite, so the blocks are random bytes with a random scale.
Under TRITON_INTERPRET=1 where there is no GPU; compiled on the GPU box (marker gpu).
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are decorated
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")
import triton.language as tl  # noqa: E402

from sparkd.engine import quants  # noqa: E402
from sparkd.engine.kernels import dispatch, grids, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs  # noqa: E402
from sparkd.engine.kernels.moe import ExpertTable, moe_decode, prepare  # noqa: E402
from test_kernels import moe_error, numpy_rng, random_blocks  # noqa: E402

FAMILIES = {m.FAMILY.qtype: m.FAMILY for m in (iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq1_m, iq2_s, iq3_s)}
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant "
                       "runs where there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


@triton.jit
def _dequant_rows(w_ptr, aux_ptr, out_ptr, N, row_bytes, DEQ: tl.constexpr, NSUB: tl.constexpr,
                  SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr):
    """Group program_id(1) of BLOCK_N rows (rows past N masked) into out [rows, groups * 256]:
    every row of the tile is stored, so a masked row must come back as zeros."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = tl.program_id(1)
    s = tl.arange(0, NSUB)[None, :, None]
    i = tl.arange(0, SUBLEN)[None, None, :]
    smask = (rows < N)[:, None, None] & (s < NSUB)
    w = DEQ(w_ptr, aux_ptr, (rows.to(tl.int64) * row_bytes)[:, None, None], g, smask)
    cols = tl.num_programs(1) * NSUB * SUBLEN
    tl.store(out_ptr + rows[:, None, None] * cols + g * NSUB * SUBLEN + s * SUBLEN + i, w)


def dequant_rows(raw: torch.Tensor, qtype: T, rows: int, cols: int, block_n: int) -> torch.Tensor:
    """The family's dequant of raw [rows, cols] (whole groups of 256) through the harness: [padded rows, cols]."""
    fam = dispatch.FAMILIES[qtype]
    tiles = triton.cdiv(rows, block_n)
    out = torch.full((tiles * block_n, cols), float("nan"), device=raw.device)
    _dequant_rows[(tiles, cols // 256)](raw, grids.grid_table(fam.grid, raw.device), out, rows,
                                        fam.row_bytes(cols), DEQ=fam.dequant, NSUB=fam.nsub,
                                        SUBLEN=fam.sublen, BLOCK_N=block_n)
    return out.cpu()


@pytest.mark.parametrize("qtype", list(FAMILIES), ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_dequant_matches_reference(backend, qtype):
    big = backend == "cuda"
    # odd row counts, a single row, a one-block row
    for rows, cols in ([(4099, 2048), (777, 256), (1, 512)] if big else [(7, 512), (5, 256), (1, 256)]):
        raw = random_blocks(qtype, rows * cols // 256)
        got = dequant_rows(raw.to(backend), qtype, rows, cols, block_n=4)
        want = quants.dequantize(raw, qtype, (rows, cols))
        assert torch.equal(got[:rows], want), (
            f"{qtype.name} [{rows}, {cols}]: {int((got[:rows] != want).sum())} values differ, "
            f"worst by {float((got[:rows] - want).abs().nan_to_num(float('inf')).max()):.3g}")
        assert (got[rows:] == 0).all(), f"{qtype.name}: masked rows did not come back as zeros"


@pytest.mark.parametrize("qtype", list(FAMILIES), ids=lambda t: t.name)
def test_every_grid_entry_and_sign(qtype):
    """Blocks that walk every grid index (and every sign index) once: the table in device memory
    and the computed ksigns agree with the reference on all of them, not just a random sample."""
    fam = FAMILIES[qtype]
    entries = {T.IQ2_XXS: 256, T.IQ2_XS: 512, T.IQ3_XXS: 256, T.IQ1_S: 2048, T.IQ1_M: 2048, T.IQ2_S: 1024,
               T.IQ3_S: 512}[qtype]
    per_block = {T.IQ2_XXS: 32, T.IQ2_XS: 32, T.IQ3_XXS: 64, T.IQ1_S: 32, T.IQ1_M: 32, T.IQ2_S: 32, T.IQ3_S: 64}[qtype]
    raw = random_blocks(qtype, entries // per_block).reshape(-1, fam.block_bytes)
    idx = np.arange(entries).reshape(-1, per_block)
    if qtype == T.IQ2_XXS:  # byte 4j of each 8-byte group: 4 indices, then the sign/scale word
        g = raw[:, 2:].reshape(-1, 8, 8)
        g[:, :, :4] = torch.from_numpy(idx.reshape(-1, 8, 4).astype(np.uint8))
        words = np.arange(raw.shape[0] * 32).reshape(-1, 8, 4) % 128  # every sign index twice
        aux = (words[..., 0] | words[..., 1] << 7 | words[..., 2] << 14 | words[..., 3] << 21)
        aux = aux | (numpy_rng().integers(0, 16, aux.shape) << 28)
        g[:, :, 4:] = torch.from_numpy(aux.astype("<u4").view(np.uint8).reshape(-1, 8, 4))
    elif qtype == T.IQ2_XS:  # u16 words: 9-bit index | 7-bit sign index
        words = idx | ((idx % 128) << 9)
        raw[:, 2:66] = torch.from_numpy(words.astype("<u2").view(np.uint8).reshape(-1, 64))
    elif qtype == T.IQ3_XXS:
        raw[:, 2:66] = torch.from_numpy(idx.astype(np.uint8))
    elif qtype == T.IQ2_S:  # low 8 bits in qs[e] (at 2), high 2 in bits 2 (e % 4) of qh[e // 4] (at 66); signs
        raw[:, 2:34] = torch.from_numpy((idx & 0xFF).astype(np.uint8))
        raw[:, 34:66] = torch.from_numpy((np.arange(idx.size).reshape(idx.shape) * 37 % 256).astype(np.uint8))
        high = (idx >> 8).reshape(-1, 8, 4)
        raw[:, 66:74] = torch.from_numpy((high * (1 << (2 * np.arange(4)))).sum(-1).astype(np.uint8))
    elif qtype == T.IQ3_S:  # low 8 bits in qs[k] (at 2), the high bit in bit k % 8 of qh[k // 8] (at 66); signs
        raw[:, 2:66] = torch.from_numpy((idx & 0xFF).astype(np.uint8))
        high = (idx >> 8).reshape(-1, 8, 8)
        raw[:, 66:74] = torch.from_numpy((high * (1 << np.arange(8))).sum(-1).astype(np.uint8))
        raw[:, 74:106] = torch.from_numpy((np.arange(raw.shape[0] * 32).reshape(-1, 32) * 37 % 256).astype(np.uint8))
    elif qtype == T.IQ1_M:  # low 8 bits in qs[e], high 3 bits in nibble e % 2 of qh[e // 2]; its bit 3 the delta's
        raw[:, 0:32] = torch.from_numpy((idx & 0xFF).astype(np.uint8))
        high = (idx >> 8).reshape(-1, 16, 2) | (numpy_rng().integers(0, 2, (idx.shape[0], 16, 2)) << 3)
        raw[:, 32:48] = torch.from_numpy((high[..., 0] | (high[..., 1] << 4)).astype(np.uint8))
    else:  # IQ1_S: low 8 bits in qs, high 3 bits of index 4s+l in bits 3l of qh[s]
        raw[:, 2:34] = torch.from_numpy((idx & 0xFF).astype(np.uint8))
        high = (idx >> 8).reshape(-1, 8, 4)
        qh = (high * (1 << (3 * np.arange(4)))).sum(-1) | (numpy_rng().integers(0, 16, high.shape[:2]) << 12)
        raw[:, 34:50] = torch.from_numpy(qh.astype("<u2").view(np.uint8).reshape(-1, 16))
    raw = raw.reshape(-1).contiguous()
    rows = raw.numel() // fam.block_bytes
    got = dequant_rows(raw.to("cuda" if ON_GPU else "cpu"), qtype, rows, 256, block_n=2)
    assert torch.equal(got[:rows], quants.dequantize(raw, qtype, (rows, 256)))


def test_grid_tables_are_the_gguf_codebooks():
    for qtype, fam in FAMILIES.items():
        cls = getattr(gq, fam.grid)
        cls.init_grid()
        table = grids.grid_table(fam.grid, "cpu")
        assert table.dtype == torch.float32 and torch.equal(table, torch.from_numpy(cls.grid.reshape(-1)))
        assert grids.grid_table(fam.grid, "cpu") is table  # made once per device
    assert grids.grid_table(None, "cpu").numel() == 1


# the kimi-k3 preset's experts: latent width 3584 in, 3072 wide, top-16; gate/up IQ1_S, down
# IQ2_XXS (IQ2_XS in MoE layers 1-11), as unsloth's UD-IQ1_S file (tests/engine/test_sparse_model.py)
K3_DIM, K3_WIDTH, K3_TOP = 3584, 3072, 16
BOUND = 5e-6  # float32 kernels, as test_kernels.BOUNDS["fp32"]


@pytest.mark.gpu
@pytest.mark.parametrize("down_type", [T.IQ2_XXS, T.IQ2_XS], ids=lambda t: t.name)
@pytest.mark.parametrize("pinned", [False, True], ids=["resident", "zero_copy"])
def test_moe_decode_kimi_k3_expert_mix(down_type, pinned):
    """16 experts at the real shapes, one buffer per projection (as KernelExperts holds them), or
    pinned host memory read in place (--unified on); reference dequantized by quants, in float64 over the
    kernels' own rounded x and h (test_kernels.moe_error: the integer steps multiply x and h as Q8_K)."""
    n, D, F = K3_TOP, K3_DIM, K3_WIDTH
    bufs = [random_blocks(T.IQ1_S, n * F * D // 256), random_blocks(T.IQ1_S, n * F * D // 256),
            random_blocks(down_type, n * D * F // 256)]
    want = [quants.dequantize(bufs[0].cuda(), T.IQ1_S, (n, F, D)).double(),
            quants.dequantize(bufs[1].cuda(), T.IQ1_S, (n, F, D)).double(),
            quants.dequantize(bufs[2].cuda(), down_type, (n, D, F)).double()]
    bufs = [b.pin_memory() if pinned else b.cuda() for b in bufs]
    offs = [[e * b.numel() // n for e in range(n)] for b in bufs]
    table = ExpertTable(*bufs, *offs, T.IQ1_S, down_type, D, F)
    x, w = torch.randn(D, device="cuda"), torch.rand(n, device="cuda")
    out = torch.full((D,), float("nan"), device="cuda")
    p = prepare(table, "cuda")
    moe_decode(p, x, w, "silu", out=out)
    assert torch.isfinite(out).all(), "an output element was not written"
    err = moe_error(out, p, x, w.cpu(), *(list(m.cpu()) for m in want), "silu", T.IQ1_S, down_type)
    assert err < BOUND, f"IQ1_S/{down_type.name} at [{F}, {D}] x {n}: relative error {err:.2e}"
