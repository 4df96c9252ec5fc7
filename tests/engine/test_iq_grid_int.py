"""The grid i-quants' integer steps (kernels/iq2_xxs.py, iq3_xxs.py, iq2_xs.py and iq1_s.py idot, behind
$SPARKD_<type>_INT, on by default since session 23): the signs applied to int8 grid bytes in 32-bit words (iq_common.negate_bytes)
for every value and sign pattern, the int8 codebook words, and the per-block integer sums exactly llama.cpp's (checked
against an unpacking of the blocks written here, value by value). The GEMV at several tiles and the MoE
decode against the float64 reference and the float path: test_int_steps.py.

Interpreter (TRITON_INTERPRET=1: dp4a by its arithmetic twin) where there is no GPU; the PTX against the
twin: test_int_steps.py.
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")
import triton.language as tl  # noqa: E402

from test_int_steps import ROWS_TILE, awkward_x, integer_result  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import (act_quant, dispatch, grids, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s,  # noqa: E402
                                   iq3_xxs, iq_common)
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402

KSIGNS = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).astype(np.int64)
# type: (kernel module, block bytes, grid values per index, the power-of-two constant of d * d_x)
GRID_TYPES = {T.IQ2_XXS: (iq2_xxs, 66, 8, 0.125), T.IQ3_XXS: (iq3_xxs, 98, 4, 0.25), T.IQ2_XS: (iq2_xs, 74, 8, 0.125),
              T.IQ1_S: (iq1_s, 50, 8, 0.125), T.IQ1_M: (iq1_m, 56, 8, 0.125), T.IQ2_S: (iq2_s, 82, 8, 0.125),
              T.IQ3_S: (iq3_s, 110, 4, 1.0)}
TYPES = [pytest.param(t, id=t.name) for t in GRID_TYPES]


@triton.jit
def _negate_kernel(q_ptr, bits_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + i, mask=i < n, other=0)
    tl.store(out_ptr + i, iq_common.negate_bytes(q, tl.load(bits_ptr + i, mask=i < n, other=0)), mask=i < n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negate_bytes_for_every_value_and_sign_pattern(backend):
    """Every grid value (1..127) in every byte position next to every other byte's extremes, under each of the 16
    patterns of 4 sign bits, with each of bits 4-6 (what sign_nibbles leaves there) set or not: the bytes come
    back as int8 +-v, no borrow or carry between them."""
    v = np.arange(1, 128)
    words, bits = [], []
    for pos in range(4):
        for other in (1, 127):
            b = np.full((v.size, 4), other)
            b[:, pos] = v
            for pattern in range(128):
                words.append(b)
                bits.append(np.full(v.size, pattern))
    b = np.concatenate(words)
    bits = np.concatenate(bits)
    q = torch.from_numpy(b.astype(np.uint8).copy().view(np.int32)[:, 0].copy()).to(backend)
    s = torch.from_numpy(bits.astype(np.int32)).to(backend)
    out = torch.empty_like(q)
    _negate_kernel[(triton.cdiv(q.numel(), 1024),)](q, s, out, q.numel(), BLOCK=1024)
    got = out.cpu().numpy().view(np.int8).reshape(-1, 4).astype(np.int64)
    negative = (bits[:, None] >> np.arange(4)) & 1  # bits 0-3 only
    assert np.array_equal(got, np.where(negative == 1, -b, b))


@triton.jit
def _nibbles_kernel(idx_ptr, lo_ptr, hi_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    lo, hi = iq_common.sign_nibbles(tl.load(idx_ptr + i))
    tl.store(lo_ptr + i, lo)
    tl.store(hi_ptr + i, hi)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_nibbles_are_ksigns(backend):
    """For every 7-bit sign index: the low word's bits 0-3 and the high word's 0-3 make ggml's ksigns byte, both
    below 128 (negate_bytes' precondition)."""
    idx = torch.arange(128, dtype=torch.int32, device=backend)
    lo, hi = torch.empty_like(idx), torch.empty_like(idx)
    _nibbles_kernel[(1,)](idx, lo, hi, BLOCK=128)
    lo, hi = lo.cpu().numpy().astype(np.int64), hi.cpu().numpy().astype(np.int64)
    assert np.array_equal((lo & 0xF) | ((hi & 0xF) << 4), KSIGNS)
    assert lo.max() < 128 and hi.max() < 128


def test_grid_words_are_the_codebook_as_int8():
    """grids.grid_words: each codebook's values as int8 bytes, entry e at bytes [e * width, ...), made once per
    device; None a one-word placeholder."""
    for qtype, (module, _, width, _) in GRID_TYPES.items():
        words = grids.grid_words(module.FLOAT_FAMILY.grid, "cpu")
        assert words.dtype == torch.int32 and words is grids.grid_words(module.FLOAT_FAMILY.grid, "cpu")
        values = words.view(torch.int8).reshape(-1, width)
        assert torch.equal(values.float().reshape(-1), grids.grid_table(module.FLOAT_FAMILY.grid, "cpu"))
        if qtype not in (T.IQ1_S, T.IQ1_M):  # (-1/0/1, no signs to apply)
            assert values.min() >= 1  # negate_bytes' precondition
    assert grids.grid_words(None, "cpu").numel() == 1


def unpack(qtype: T, raw: torch.Tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer weights int64 [rows, cols], 2 * scale + 1 int64 [rows, cols / sub-block], d float32 [rows, cols/256])
    from the bytes, by the format's definition (gguf's quants layout, value by value): value = d * c * scale * weight
    (c: GRID_TYPES' constant). The signed grid values; IQ1_S's and IQ1_M's 8 * grid value + the delta's sign (their
    delta 1/8)."""
    _, block, width, _ = GRID_TYPES[qtype]
    b = raw.cpu().numpy().reshape(rows, cols // 256, block).astype(np.int64)
    v = np.arange(256)
    codebook = getattr(gq, qtype.name)
    codebook.init_grid()
    grid = codebook.grid.reshape(-1, width).astype(np.int64)

    def u16(at):  # little-endian 16-bit fields at byte offsets `at` of every block
        return b[:, :, at] | (b[:, :, at + 1] << 8)

    if qtype == T.IQ1_S:  # qs[32] at 2, qh u16[8] at 34
        qh = u16(34 + 2 * (v // 32))
        idx = b[:, :, 2 + v // 8] | (((qh >> (3 * ((v % 32) // 8))) & 7) << 8)
        q = 8 * grid[idx, v % 8] + np.where(qh & 0x8000, -1, 1)
        sc = 2 * ((u16(34 + 2 * np.arange(8)) >> 12) & 7) + 1
    elif qtype == T.IQ1_M:  # qs[32] at 0, qh[16] at 32 (a nibble an entry), scales u16[4] at 48 (3 bits a 16 values)
        qh = b[:, :, 32 + v // 16] >> (4 * ((v // 8) % 2))
        q = 8 * grid[b[:, :, v // 8] | ((qh & 7) << 8), v % 8] + np.where(qh & 8, -1, 1)
        s16 = np.arange(16)
        sc = 2 * ((u16(48 + 2 * (s16 // 4)) >> (3 * (s16 % 4))) & 7) + 1
        d_bits = sum(((u16(48 + 2 * k) >> 12) & 0xF) << (4 * k) for k in range(4))
        return q.reshape(rows, cols), sc.reshape(rows, -1), d_bits.astype(np.uint16).view(np.float16).astype(np.float32)
    elif qtype in (T.IQ2_S, T.IQ3_S):  # explicit sign bytes, a high index bit field, scale nibbles
        e = v // width  # grid entry
        if qtype == T.IQ2_S:  # qs[32] at 2, signs[32] at 34, qh[8] at 66 (2 bits an entry), scales[8] at 74
            idx = b[:, :, 2 + e] | (((b[:, :, 66 + e // 4] >> (2 * (e % 4))) & 3) << 8)
            signs, s16 = b[:, :, 34 + v // 8], np.arange(16)
            sc = 2 * ((b[:, :, 74 + s16 // 2] >> (4 * (s16 % 2))) & 0xF) + 1
        else:  # qs[64] at 2, qh[8] at 66 (a bit an entry), signs[32] at 74, scales[4] at 106 (a nibble a 32)
            idx = b[:, :, 2 + e] | (((b[:, :, 66 + e // 8] >> (e % 8)) & 1) << 8)
            signs, s8 = b[:, :, 74 + v // 8], np.arange(8)
            sc = 2 * ((b[:, :, 106 + s8 // 2] >> (4 * (s8 % 2))) & 0xF) + 1
        q = np.where((signs >> (v % 8)) & 1, -1, 1) * grid[idx, v % width]
        d = raw.cpu().numpy().reshape(rows, cols // 256, block)[:, :, 0:2].copy().view(np.float16).astype(np.float32)
        return q.reshape(rows, cols), sc.reshape(rows, -1), d[..., 0]
    elif qtype == T.IQ2_XS:  # qs u16[32] at 2 (9-bit index, 7-bit sign index), scale nibbles at 66
        word = u16(2 + 2 * (v // 8))
        q, sign_idx = grid[word & 511, v % 8], word >> 9
        s16 = np.arange(16)
        sc = 2 * ((b[:, :, 66 + s16 // 2] >> (4 * (s16 % 2))) & 0xF) + 1
    else:
        s, i = v // 32, v % 32
        aux_at = (6 if qtype == T.IQ2_XXS else 66) + (8 if qtype == T.IQ2_XXS else 4) * np.arange(8)
        aux = np.stack([b[:, :, a] | (b[:, :, a + 1] << 8) | (b[:, :, a + 2] << 16) | (b[:, :, a + 3] << 24)
                        for a in aux_at], -1)  # [rows, groups, 8]
        # IQ2_XXS: sub-block s's 4 index bytes at 2 + 8s; IQ3_XXS: qs[8s + i // 4] at 2
        idx = b[:, :, 2 + 8 * s + (i // 8 if qtype == T.IQ2_XXS else i // 4)]
        q, sign_idx = grid[idx, i % width], (aux[:, :, s] >> (7 * (i // 8))) & 0x7F
        sc = 2 * (aux >> 28) + 1
    if qtype != T.IQ1_S:
        q = np.where((KSIGNS[sign_idx] >> (v % 8)) & 1, -q, q)
    d = raw.cpu().numpy().reshape(rows, cols // 256, block)[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    return q.reshape(rows, cols), sc.reshape(rows, -1), d[..., 0]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_sums_are_llama_cpps(backend, qtype, monkeypatch):
    """The kernel's per-block integer sums are exact: under the interpreter (no FMA contraction) the same bits as
    the float32 steps on the exact sums; compiled, within float32 rounding of them; the elementwise tile too."""
    monkeypatch.setitem(dispatch.FAMILIES, qtype, GRID_TYPES[qtype][0].INT_FAMILY)
    rows, cols = (1031, 4096 + 768) if backend == "cuda" else (7, 768)
    raw = random_blocks(qtype, rows * cols // 256)
    x = awkward_x(cols)
    q, sc, d = unpack(qtype, raw, rows, cols)
    acc, exact, size = integer_result(q, sc, d, x, backend, GRID_TYPES[qtype][3])
    for cfg in (ROWS_TILE, GemvConfig(block_n=4, num_warps=1, unroll=2, split=2, elementwise=True)):
        y = gemv(raw.to(backend), qtype, (rows, cols), x.to(backend), config=cfg).cpu()
        if backend == "cpu" and cfg is ROWS_TILE:
            assert torch.equal(y, acc)
        # float32 steps on exact integer sums: <= 3 roundings per super-block (3 or 19 here) plus the adds; the
        # elementwise tile takes its float step per 32 values, so its roundings scale with those sums' magnitudes
        # (sub-blocks cancel within a group: IQ3_S 7.3e-6 of the groups' magnitudes, 6 interpreted seeds)
        scale = size if cfg is ROWS_TILE else chunk_magnitudes(q, sc, d, x, backend, GRID_TYPES[qtype][3])
        err = ((y.double() - exact).abs() / scale).max().item()
        assert err < 2e-6, err


def chunk_magnitudes(q: np.ndarray, sc: np.ndarray, d: np.ndarray, x: torch.Tensor, backend: str,
                     c: float) -> torch.Tensor:
    """Per row the sum over its 32-value chunks of |the chunk's exact integer sum times its float step| (unpack's
    q, sc and d; x quantized as the kernel does): the size of the elementwise tile's float steps."""
    rows, cols = q.shape
    qx = act_quant.quantize(x.to(backend)[None], act_quant.Q8_K)
    xq = qx.words.cpu().view(torch.int8).numpy().astype(np.int64)[0]
    dx = qx.scales.cpu().numpy()[0].astype(np.float64)
    per_sc = (q * xq).reshape(rows, sc.shape[1], -1).sum(-1) * sc  # [rows, scales]
    chunks = np.abs(per_sc.reshape(rows, cols // 32, -1).sum(-1)).reshape(rows, cols // 256, 8)
    return torch.from_numpy((chunks.sum(-1) * np.abs(d.astype(np.float64) * dx) * c).sum(1))  # (Q8_K scales may be < 0)

