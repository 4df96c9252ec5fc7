"""The nibble_tiles layouts (kernels/mxfp4_tiled.py, kernels/q4_0_tiled.py: 4-bit blocks of 32 values repacked at
load into tiles of 16 rows, each row's quants then the tile's heads) against the GGUF blocks: the type's integer step
on both reads the same words into the same tile, so every kernel gives the same bits on both layouts (the GEMV at
every tile, on the GPU every one-warp tile; the float path, the prompt's GEMMs, the MoE decode (gpt-oss's biases, a
selection), the MoE prefill, a Q4_0 model's logits); what the layout cannot take is refused with the reason.
gpt-oss's rows (90 blocks: a last group of 2) on the GPU.

Interpreter (TRITON_INTERPRET=1, emulated dp4a and prmt) where there is no GPU.
"""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import (BACKENDS, BOUNDS, act_in, arena_table, moe_error, random_blocks, reference,  # noqa: E402
                          rel_err)
from test_moe_tiles import on_16_bytes  # noqa: E402

from sparkd.engine.kernels import (act_quant, dispatch, moe, moe_prefill, moe_tiles, mxfp4, mxfp4_tiled,  # noqa: E402
                                   prefill_gemm, q4_0, q4_0_tiled)
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.layers.act_round import round_activations  # noqa: E402

TILED = mxfp4_tiled.TILED
# (GGUF type, its kernels' module, the tiled layout's)
TYPES = [pytest.param((T.MXFP4, mxfp4, mxfp4_tiled), id="MXFP4"), pytest.param((T.Q4_0, q4_0, q4_0_tiled), id="Q4_0")]
# the default (4 rows a program: a quarter of a packing tile; the elementwise tile), the per-group rows tile, 2 rows
# 4 groups a step, 16 rows on 4 warps split over K in 2 ranges (masked tail groups), 1 row over whole rows
TILES = [GemvConfig(), GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=False),
         GemvConfig(block_n=2, num_warps=1, unroll=4), GemvConfig(block_n=16, num_warps=4, unroll=3, split=2),
         GemvConfig(block_n=1, num_warps=1, unroll=4, split=1)]


def shape_for(backend: str) -> tuple[int, int]:
    """gpt-oss-20b's expert matrix on the GPU (90 blocks a row); 2 tiles of 9 blocks a row interpreted."""
    return (2880, 2880) if backend == "cuda" else (32, 288)


def stacked(ew) -> list:
    """ExpertWeights' fields, a field of one tensor an expert stacked (get() hands the experts back that way)."""
    return [torch.stack(list(f)) if isinstance(f, list) else f for f in dataclasses.astuple(ew)]


@pytest.mark.parametrize("kind", TYPES)
def test_layout_is_each_rows_quants_then_the_tiles_heads(kind):
    """Byte for byte (on the host: no kernel): tile t, row r, block b: qs at 16 (r B + b), the head (H bytes: MXFP4's
    e, Q4_0's d) at 256 B + H (r B + b); the same byte count; unpack_raw gives the file's blocks back."""
    qtype, _, tiled = kind
    rows, cols, h = 32, 160, tiled.LAYOUT.head
    n_blocks = cols // 32
    raw = random_blocks(qtype, rows * n_blocks)
    data = tiled.pack_raw(raw, (rows, cols))
    assert data.numel() == raw.numel()
    blocks, tiles = raw.view(rows, n_blocks, 16 + h), data.view(2, -1)
    for t in range(2):
        for r in range(16):
            for b in range(n_blocks):
                blk = blocks[16 * t + r, b]
                assert torch.equal(tiles[t, 16 * (r * n_blocks + b):][:16], blk[h:])
                assert torch.equal(tiles[t, 256 * n_blocks + h * (r * n_blocks + b):][:h], blk[:h])
    assert torch.equal(tiled.unpack_raw(data, (rows, cols)), raw)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("shape,match", [((24, 64), "multiple of 16"), ((16, 48), "multiple of 32"),
                                         ((0, 64), "positive multiple of 16")])
def test_repacking_refuses_what_it_cannot_tile(shape, match, kind):
    qtype, _, tiled = kind
    raw = random_blocks(qtype, max(shape[0], 1) * shape[1] // 32)
    with pytest.raises(dispatch.KernelArgumentError, match=f"could not run the {qtype.name} repacking: .*{match}"):
        tiled.pack_raw(raw, shape)


@pytest.mark.parametrize("kind", TYPES)
def test_repacking_refuses_bytes_that_are_not_the_matrix(kind):
    qtype, _, tiled = kind
    size = 32 * (16 + tiled.LAYOUT.head)
    with pytest.raises(dispatch.KernelArgumentError,
                       match=rf"need {size} bytes .* got torch.uint8 \[{5 * size // 32}\]"):
        tiled.pack_raw(random_blocks(qtype, 5), (16, 64))
    with pytest.raises(dispatch.KernelArgumentError, match=rf"unpacking: need {size} bytes .* got torch.int8"):
        tiled.unpack_raw(random_blocks(qtype, 32).view(torch.int8), (16, 64))


@pytest.mark.parametrize("config", TILES, ids=lambda c: f"{c.block_n}/{c.num_warps}/{c.unroll}/{c.split}/"
                         f"{'e' if c.elementwise else 'g'}")
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_gemv_gives_the_gguf_bits(backend, config, kind):
    qtype, _, tiled = kind
    rows, cols = shape_for(backend)
    raw = random_blocks(qtype, rows * cols // 32).to(backend)
    x = torch.randn(cols, device=backend)
    want = gemv(raw, qtype, (rows, cols), x, config=config)
    got = gemv(tiled.pack_raw(raw, (rows, cols)), tiled.TILED, (rows, cols), x, config=config)
    if backend == "cuda" and config.num_warps > 1:
        # a program of 4 warps lays its elementwise tile out differently for the two layouts' loads and sums it in
        # another order (H200, session 25, MXFP4: 1567 of 2880 rows differ, 7.2e-8 apart): within the float bound
        W, xr = reference(raw, qtype, (rows, cols)), act_in(qtype, x.cpu())
        assert rel_err(got, W @ xr, W.abs() @ xr.abs()) < BOUNDS["fp32"]
        assert rel_err(got, want.cpu().double()) < 1e-6, differ(got, want)
    else:
        assert torch.equal(got, want), differ(got, want)


def differ(got: torch.Tensor, want: torch.Tensor) -> str:
    """How far apart two results are (a failed bits check's message)."""
    rel = float((got - want).norm() / want.norm())
    return f"{int((got != want).sum())} of {got.numel()} differ, relative {rel:.1e}"


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_path_on_the_tiled_layout_gives_the_gguf_bits(monkeypatch, backend, kind):
    """The families $SPARKD_MXFP4_INT=0 / $SPARKD_Q4_0_INT=0 pick (the dequant, x rounded by the caller): the same
    bits on both layouts, the GEMV and the prompt's float GEMM (which reads the row width the tiled dequant needs)."""
    qtype, base, tiled = kind
    rows, cols = shape_for(backend)
    raw, x = random_blocks(qtype, rows * cols // 32).to(backend), torch.randn(cols, device=backend)
    monkeypatch.setitem(dispatch.FAMILIES, qtype, base.FLOAT_FAMILY)
    monkeypatch.setitem(dispatch.LAYOUTS, tiled.TILED, tiled.FLOAT_FAMILY)
    data = tiled.pack_raw(raw, (rows, cols))
    rx = lambda v: round_activations(v, act_quant.Q8_0)  # noqa: E731 - what KernelLinear passes
    cfg = GemvConfig(block_n=8, unroll=2)
    assert torch.equal(gemv(data, tiled.TILED, (rows, cols), x, config=cfg, round_x=rx),
                       gemv(raw, qtype, (rows, cols), x, config=cfg, round_x=rx))
    xs = torch.randn(3, cols, device=backend)
    assert torch.equal(prefill_gemm.gemm(data, tiled.TILED, (rows, cols), xs, precision="ieee"),
                       prefill_gemm.gemm(raw, qtype, (rows, cols), xs, precision="ieee"))


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_integer_gemm_gives_the_gguf_bits(backend, kind):
    """The prompt's integer GEMM (iblock on the tiled rows) on both layouts."""
    qtype, _, tiled = kind
    rows, cols = shape_for(backend)
    raw = random_blocks(qtype, rows * cols // 32).to(backend)
    xs = torch.randn(5, cols, device=backend)
    assert torch.equal(prefill_gemm.gemm(tiled.pack_raw(raw, (rows, cols)), tiled.TILED, (rows, cols), xs,
                                         precision="int8"),
                       prefill_gemm.gemm(raw, qtype, (rows, cols), xs, precision="int8"))


def expert_table(qtype: T, backend: str, n: int):
    """An expert table of qtype on 16-byte offsets (gpt-oss-20b's shape on the GPU), its activation and biases:
    MXFP4 gpt-oss's (clamped swiglu, biased experts), Q4_0 silu without."""
    dim, width = (2880, 2880) if backend == "cuda" else (64, 32)
    table = on_16_bytes(arena_table(qtype, qtype, dim, width, n, backend)[0])
    if qtype == T.MXFP4:
        return table, "swiglu_oai", torch.randn(n, 2 * width + dim, device=backend)
    return table, "silu", None


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_moe_decode_gives_the_gguf_bits(backend, kind):
    """moe_decode (MXFP4: gpt-oss's biases and clamped swiglu) on the table before and after tiled_nibbles (gate, up
    and down repacked in place, offsets kept), on the full table and on a selection read through its ids."""
    qtype, _, layout = kind
    n = 4 if backend == "cuda" else 2
    table, act, bias = expert_table(qtype, backend, n)
    x, w = torch.randn(table.dim, device=backend), torch.rand(n, device=backend)
    tiles = {} if backend == "cuda" else dict(gate_up=GemvConfig(block_n=32, num_warps=1, unroll=1),
                                              down=GemvConfig(block_n=64, num_warps=1, unroll=1))
    gguf = moe.prepare(table, backend)
    want = moe.moe_decode(gguf, x, w, act, bias=bias, **tiles)
    ids = torch.tensor([n - 1, 0], device=backend)
    # (a selection through ids reads its bias rows through them: the full table's biases; the gathered table the
    # selected rows: the same sums)
    want_sel = moe.moe_decode(gguf.select(ids), x, w[:2].contiguous(), act, bias=bias, **tiles)
    gathered = moe.moe_decode(gguf.select(ids).gathered(), x, w[:2].contiguous(), act,
                              bias=None if bias is None else bias[[n - 1, 0]].contiguous(), **tiles)
    assert torch.equal(gathered, want_sel), differ(gathered, want_sel)
    before = table.gate.clone()
    tiled = moe.tiled_nibbles(table)
    assert (tiled.gate_up_type, tiled.down_type) == (layout.TILED, layout.TILED)
    assert not torch.equal(tiled.gate, before)  # in place
    p = moe.prepare(tiled, backend)
    assert p.gate_up_vec and p.down_vec  # 16-byte offsets: the step's loads know it
    assert moe_tiles.decode_tiles(p) == moe_tiles.decode_tiles(gguf)
    got = moe.moe_decode(p, x, w, act, bias=bias, **tiles)
    assert torch.equal(got, want), differ(got, want)
    got = moe.moe_decode(p.select(ids), x, w[:2].contiguous(), act, bias=bias, **tiles)
    assert torch.equal(got, want_sel), differ(got, want_sel)


def test_mxfp4_down_runs_in_ranges_on_both_layouts():
    """moe_tiles.MXFP4_DOWN (the down in 4 ranges of experts, session 25) for the file's blocks and the tiled ones."""
    table = expert_table(T.MXFP4, "cpu", 1)[0]
    gguf = moe.prepare(table, "cpu")
    assert moe_tiles.decode_tiles(gguf) == (moe_tiles.GATE_UP_CONFIG, moe_tiles.MXFP4_DOWN)
    assert moe_tiles.decode_tiles(moe.prepare(moe.tiled_nibbles(table), "cpu")) == moe_tiles.decode_tiles(gguf)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_path_adds_the_biases_through_the_ids(monkeypatch, backend):
    """$SPARKD_MXFP4_INT=0's launches (the float gate/up and down kernels) read a selection's bias rows through its
    ids as the integer ones do: within the fp32 bound of float64 over the engine's own h, the gathered table's sums."""
    monkeypatch.setitem(dispatch.FAMILIES, T.MXFP4, mxfp4.FLOAT_FAMILY)
    n = 4 if backend == "cuda" else 3
    dim, width = (2880, 2880) if backend == "cuda" else (64, 32)
    table, gates, ups, downs = arena_table(T.MXFP4, T.MXFP4, dim, width, n, backend)
    bias = torch.randn(n, 2 * width + dim, device=backend)
    x, w = torch.randn(dim, device=backend), torch.rand(2, device=backend)
    ids = torch.tensor([n - 1, 0], device=backend)
    tiles = {} if backend == "cuda" else dict(gate_up=GemvConfig(block_n=32, num_warps=1, unroll=1),
                                              down=GemvConfig(block_n=64, num_warps=1, unroll=1, split=2))
    p = moe.prepare(table, backend).select(ids)
    assert p.down.idot is None
    y = moe.moe_decode(p, x, w, "swiglu_oai", bias=bias, **tiles)
    pick = [n - 1, 0]
    err = moe_error(y, p.gathered(), x, w, [gates[i] for i in pick], [ups[i] for i in pick],
                    [downs[i] for i in pick], "swiglu_oai", T.MXFP4, T.MXFP4, tiles.get("gate_up"),
                    bias=bias[pick].cpu())
    assert err < BOUNDS["fp32"], err
    gathered = moe.moe_decode(p.gathered(), x, w, "swiglu_oai", bias=bias[pick].contiguous(), **tiles)
    assert torch.equal(gathered, y), differ(gathered, y)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_moe_prefill_gives_the_gguf_bits(backend, kind):
    """The GGUF blocks' grouped GEMMs and the tiled layout's (MXFP4's on 64-row expert tiles and its own launch since
    session 42: prefill_gemm.IGEMM_TILES; since session 43 bf16 blocks with their scales folded in, mxfp4_tiled.fblock)
    give the same bits; on the GPU 300 tokens, so an expert's rows span several tiles of either height."""
    n, tokens = (4, 300) if backend == "cuda" else (2, 3)
    table, act, bias = expert_table(kind[0], backend, n)
    x = torch.randn(tokens, table.dim, device=backend)
    slots = torch.stack([torch.randperm(n)[:2] for _ in range(tokens)]).to(backend)
    w = torch.rand(tokens, 2, device=backend)
    gguf = moe.prepare(table, backend)
    want = moe_prefill.moe_prefill(gguf, x, slots, w, act, "int8", bias=bias)
    tiled = moe.prepare(moe.tiled_nibbles(table), backend)  # (the table's bytes repacked in place)
    assert moe_prefill.tile_rows(gguf.gate_up, gguf.down, "int8") == 32
    assert moe_prefill.tile_rows(tiled.gate_up, tiled.down, "int8") == (64 if kind[0] == T.MXFP4 else 32)
    # MXFP4's tiled launch multiplies bf16 values with the scales folded in (session 43), Q4_0's its int8 quants
    assert (prefill_gemm._igemm_args(tiled.gate_up, prefill_gemm.igemm_tile(tiled.gate_up, True), 8)["FBLOCK"]
            is not None) == (kind[0] == T.MXFP4)
    assert torch.equal(moe_prefill.moe_prefill(tiled, x, slots, w, act, "int8", bias=bias), want)


@pytest.mark.parametrize("kind", TYPES)
def test_tiled_nibbles_refuses_tables_it_cannot_tile(monkeypatch, kind):
    """No projection of the types asked for, or no integer step: a clear error, the table's bytes untouched. (A
    4-bit projection of an expert table is always whole tiles: its rows are the other projection's columns, whole
    32-value blocks.) A gate/up of the type over a Q8_0 down: the gate/up alone; a type not asked for: as it was."""
    qtype, base, layout = kind
    q8 = arena_table(T.Q8_0, T.Q8_0, 64, 32, 1, "cpu")[0]
    before = q8.gate.clone()
    with pytest.raises(dispatch.KernelArgumentError, match="needs a gate/up or down of MXFP4 or Q4_0 in whole 16-row"):
        moe.tiled_nibbles(q8)
    assert torch.equal(q8.gate, before)
    part = moe.tiled_nibbles(arena_table(qtype, T.Q8_0, 64, 32, 1, "cpu")[0])
    assert (part.gate_up_type, part.down_type) == (layout.TILED, T.Q8_0)
    other = T.Q4_0 if qtype == T.MXFP4 else T.MXFP4
    mixed = moe.tiled_nibbles(arena_table(qtype, other, 64, 32, 1, "cpu")[0], [qtype])
    assert (mixed.gate_up_type, mixed.down_type) == (layout.TILED, other)
    monkeypatch.setattr(layout, "FAMILY", layout.FLOAT_FAMILY)
    table = arena_table(qtype, qtype, 64, 32, 1, "cpu")[0]
    before = table.gate.clone()
    with pytest.raises(dispatch.KernelArgumentError, match=rf"integer step \(.*\${base.INT_ENV}"):
        moe.tiled_nibbles(table)
    assert torch.equal(table.gate, before)


def test_loader_tiles_resident_mxfp4_experts_and_unpacks_for_the_generic_path(tmp_path, monkeypatch):
    """KernelExperts (the resident expert store) repacks a gpt-oss model's MXFP4 experts at load, and get() (the
    generic path's dequantized experts) gives the GGUF blocks' values back; $SPARKD_MOE_MXFP4_LAYOUT=gguf keeps the
    file's blocks. A selection's biases: the layer's (read through its ids), or its rows where the offsets are
    gathered ("ids" off). (test_kernel_engine's gpt-oss model runs the tiled experts against the CPU reference.)"""
    from sparkd.engine.layers import moe as layers_moe
    from sparkd.engine.layers.quant_experts import MXFP4_LAYOUT_ENV
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model

    path = write_model(tmp_path / "m.gguf", plan(TINY["gpt-oss"], "F32", [("_exps", "MXFP4")]), seed=9)[0]
    got = {}
    for layout, qtype in (("tiled", TILED), ("gguf", T.MXFP4)):
        monkeypatch.setenv(MXFP4_LAYOUT_ENV, layout)
        model = load_model(path, device="cpu", kernels=True)
        try:
            store = model.net.blocks[0].ffn.store
            table = store.kernel_table(0).prepared.table
            assert (table.gate_up_type, table.down_type) == (qtype, qtype)
            got[layout] = store.get(0, [1, 0])
            ids, full = torch.tensor([1, 0]), store.kernel_table(0).bias
            assert store.kernel_select(0, ids).bias is full  # read through the selection's ids
            with monkeypatch.context() as m:  # gathered offsets ("ids" off): the selected rows
                m.setattr(layers_moe, "DECODE_ON", layers_moe.DECODE_ON - {"ids"})
                gathered = store.kernel_select(0, ids)
            assert gathered.prepared.ids is None and torch.equal(gathered.bias, full[ids])
        finally:
            model.close()
    for a, b in zip(stacked(got["tiled"]), stacked(got["gguf"])):
        assert type(a) is type(b) and (not isinstance(a, torch.Tensor) or torch.equal(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_q4_0_model_gives_the_gguf_logits_tiled(tmp_path, monkeypatch, backend):
    """A Q4_0 model's resident projections ($SPARKD_Q4_0_LAYOUT) and routed experts ($SPARKD_MOE_Q4_0_LAYOUT) are
    tiled at load by default: the same prompt logits bit for bit and the same greedy token as on the file's blocks
    (every kernel reads the same words into the same tile), and get() (the generic path's experts) the same values.
    (test_kernel_engine's Q4_0 model runs the tiled layout against the CPU reference.)"""
    from test_kernel_engine import PROMPT, SHAPES, greedy

    from sparkd.engine.layers.linear import KernelLinear
    from sparkd.engine.layers.quant_experts import Q4_0_LAYOUT_ENV
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.models import load_model
    from sparkd.engine.models.weights import Q4_0_LAYOUT_ENV as RESIDENT_ENV

    path = write_model(tmp_path / "m.gguf", plan(SHAPES["Q4_0"], "Q4_0"), seed=5)[0]
    got = {}
    for layout, qtype in (("tiled", q4_0_tiled.TILED), ("gguf", T.Q4_0)):
        monkeypatch.setenv(RESIDENT_ENV, layout)
        monkeypatch.setenv(Q4_0_LAYOUT_ENV, layout)
        model = load_model(path, device=backend, kernels=True)
        try:
            assert qtype in {m.qtype for m in model.net.modules() if isinstance(m, KernelLinear)}
            store = model.net.blocks[0].ffn.store
            table = store.kernel_table(0).prepared.table
            assert (table.gate_up_type, table.down_type) == (qtype, qtype)
            got[layout] = (*greedy(model.net, PROMPT, 1), store.get(0, [1, 0]))
        finally:
            model.close()
    (logits, token, experts), (want_logits, want_token, want_experts) = got["tiled"], got["gguf"]
    assert token == want_token and torch.equal(logits, want_logits)
    for a, b in zip(stacked(experts), stacked(want_experts)):
        assert type(a) is type(b) and (not isinstance(a, torch.Tensor) or torch.equal(a, b))

