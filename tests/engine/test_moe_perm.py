"""Session 18 (moe41): q8_0_perm, Q8_0 expert matrices with each group's words reordered so the words step loads
them 128 bits a lane: the same bytes back (inverse), the same values (dequant), and the words step's bits exactly in
gate/up, in the down and in the whole decode. Interpreter where there is no GPU, compiled with the marker gpu."""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from test_kernels import BACKENDS, random_blocks, reference  # noqa: E402

from sparkd.engine.kernels import act_quant, dispatch, moe, moe_tiles, q8_0_perm, q8_0_words  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

CASES = [pytest.param("cpu", id="interpret", marks=BACKENDS[0].marks),
         pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def test_the_order_is_a_permutation_and_packs_back():
    assert sorted(q8_0_perm.ORDER) == list(range(q8_0_perm.GROUP_WORDS))
    raw = random_blocks(T.Q8_0, 3 * 512 // 32)
    packed = q8_0_perm.pack_raw(raw, (3, 512))
    assert not torch.equal(packed, raw)
    assert torch.equal(q8_0_perm.pack_raw(packed, (3, 512), inverse=True), raw)
    with pytest.raises(dispatch.KernelArgumentError):
        q8_0_perm.pack_raw(random_blocks(T.Q8_0, 3 * 96 // 32), (3, 96))  # not whole groups


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, row_bytes, G: tl.constexpr):
    r = tl.program_id(0)
    off = (r * row_bytes + tl.zeros((1, 1, 1), tl.int64))
    for g in tl.static_range(G):
        v = q8_0_perm.dequant(w_ptr, w_ptr, off, g, tl.full((1, 8, 1), 1, tl.int1))
        tl.store(out_ptr + r * G * 256 + g * 256 + tl.arange(0, 8)[None, :, None] * 32
                 + tl.arange(0, 32)[None, None, :], v)


@pytest.mark.parametrize("backend", CASES)
def test_dequant_gives_the_gguf_values(backend):
    rows, cols = 4, 512
    raw = random_blocks(T.Q8_0, rows * cols // 32)
    packed = q8_0_perm.pack_raw(raw, (rows, cols)).to(backend)
    out = torch.empty(rows, cols, device=backend)
    _dequant_kernel[(rows,)](packed, out, cols // 32 * 34, G=cols // 256)
    assert torch.equal(out.cpu(), reference(raw, T.Q8_0, (rows, cols)))


def _table(dim: int, width: int, n: int, device: str) -> moe.ExpertTable:
    """n experts' gate | up | down in one arena at 16-byte offsets (q8_0_perm's 128-bit loads), slots reversed."""
    gu_bytes, d_bytes = width * dim // 32 * 34, dim * width // 32 * 34
    slot = -(-(2 * gu_bytes + d_bytes) // 4096) * 4096
    offs = [[(n - 1 - e) * slot + k * gu_bytes for e in range(n)] for k in range(3)]
    arena = torch.zeros(n * slot, dtype=torch.uint8)
    for k, nbytes in enumerate((gu_bytes, gu_bytes, d_bytes)):
        for o in offs[k]:
            arena[o:o + nbytes] = random_blocks(T.Q8_0, nbytes // 34)
    arena = arena.to(device)
    return moe.ExpertTable(arena, arena, arena, *offs, T.Q8_0, T.Q8_0, dim, width)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", CASES)
def test_permuted_words_give_the_words_bits(backend):
    dim, width, n = (256, 256, 2) if backend == "cpu" else (4096, 1536, 8)
    table = _table(dim, width, n, backend)
    p = moe.prepare(table, backend)
    arena = table.gate.clone()  # permuted in place: p keeps the GGUF bytes
    pp = moe.prepare(moe.perm_experts(dataclasses.replace(table, gate=arena, up=arena, down=arena)), backend)
    assert p.gate_up_words and pp.gate_up.qtype == q8_0_perm.PERM
    assert moe._int_args(pp.gate_up, False, False, True)["IDOT"] is q8_0_words.idot_perm_full
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows, k = (64 if backend == "cpu" else 2), moe_tiles.Kernels()
    for ew in (False, True):
        for unroll in (1, 2) if backend == "cpu" else (1, 4):  # unroll 2 at 256 values: masked, past the row
            gu = GemvConfig(block_n=rows, num_warps=1, unroll=unroll, elementwise=ew)
            dn = GemvConfig(block_n=rows, num_warps=1, unroll=unroll, elementwise=ew, split=2)
            h, hp = (moe._gate_up(t, x, w, False, "silu", gu, None, "test", None, k) for t in (p, pp))
            assert _bits(h, hp), (ew, unroll)
            q = act_quant.quantize(h, p.down.act_fmt)  # one h into both downs
            ys = [torch.empty(dim, device=backend) for _ in range(2)]
            for y, t in zip(ys, (p, pp)):
                moe._down(t, q, w, y, dn, None, None, k)
            assert _bits(ys[0], ys[1]), (ew, unroll)
    tiles = dict(gate_up=GemvConfig(block_n=rows, fuse_quant=True), down=GemvConfig(block_n=rows, split=2))
    if backend == "cuda":  # the engine's tiles at this width
        tiles = dict(zip(("gate_up", "down"), moe_tiles.decode_tiles(p)))
        tiles["gate_up"] = dataclasses.replace(tiles["gate_up"], fuse_quant=True)
    y, yp = (moe.moe_decode(t, x, w, **tiles) for t in (p, pp))
    assert _bits(y, yp)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same float32 bits (a NaN too: the interpreter's sigmoid of a large -g times a large u)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend", CASES)
def test_a_persistent_gate_up_gives_the_grids_bits(backend):
    """Kernels.persist (session 18): the gate/up's tiles looped over by fewer programs, each tile's work as before
    (h quantized by a block's last tile at 2-row tiles): the same h and y bits, GGUF words and permuted."""
    dim, width, n = (256, 256, 2) if backend == "cpu" else (4096, 1536, 8)
    table = _table(dim, width, n, backend)
    p = moe.prepare(table, backend)
    arena = table.gate.clone()
    pp = moe.prepare(moe.perm_experts(dataclasses.replace(table, gate=arena, up=arena, down=arena)), backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    gu, dn = GemvConfig(block_n=2, unroll=1, fuse_quant=True), GemvConfig(block_n=2, split=2)
    if backend == "cuda":
        gu, dn = moe_tiles.decode_tiles(p)
        gu = dataclasses.replace(gu, fuse_quant=True)
    base = moe.moe_decode(p, x, w, gate_up=gu, down=dn)
    for t in (p, pp) if backend == "cuda" else (pp,):  # the interpreter: one (slow: a program at a time)
        for per in (3,) if backend == "cpu" else (2, 3, 4):
            k = moe_tiles.Kernels(persist=per)
            assert _bits(moe.moe_decode(t, x, w, gate_up=gu, down=dn, kernels=k), base), per
