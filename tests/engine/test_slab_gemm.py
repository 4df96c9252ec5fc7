"""kernels/slab_gemm (session 46): a long prompt's GEMM as W's blocks dequantized a slab of rows at a time into 16-bit
values and cuBLAS over x rounded to the same type; and KernelLinear's choice of it (linear.SLAB_GEMM, SLAB_MIN_ROWS).
Under the interpreter on the CPU (the dequantization; the product widened there) and for real on the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gguf import GGMLQuantizationType as T
from test_kernels import BACKENDS, INT8_LAYOUTS, arena_table, backend_cases, moe_reference, random_blocks, rel_err

from sparkd.engine import quants
from sparkd.engine.kernels import dispatch, moe_prefill as prefill_moe, mxfp4_tiled, prefill_gemm, slab_gemm
from sparkd.engine.kernels.moe import prepare
from sparkd.engine.kernels.moe_prefill import moe_prefill
from sparkd.engine.layers import linear

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# Against float64 over the same rounded operands the products are exact in float32 and only the sums round: float32's
# bound (measured: see docs/performance.md, session 46). Against the unrounded operands each carries its type's
# rounding, 2^-9 (bf16) and 2^-12 (f16) relative at most: bounds at about that, relative to |x| @ |W|.
ROUNDED_BOUND = 1e-5
TYPE_BOUND = {"bf16": 4e-3, "f16": 5e-4}
# A MoE layer's output against float64: x, the weights and the activations each rounded (measured: session 46's notes)
EXPERT_BOUND = {"bf16": 2e-2, "f16": 3e-3}


def _case(layout: str, rows: int, cols: int, backend: str):
    qtype, ltype, pack = INT8_LAYOUTS[layout]
    fam = dispatch.FAMILIES[qtype]
    raw = random_blocks(qtype, rows * cols // fam.block_values)
    laid = raw if pack is None else pack(raw, (rows, cols))
    return raw, laid.to(backend), qtype, ltype


@pytest.mark.parametrize("backend, layout", backend_cases(("q8_0", "q4_k_pairx", "q6_k_tiled"),
                                                         tuple(INT8_LAYOUTS)))
@pytest.mark.parametrize("dtype", ("bf16", "f16"))
def test_slab_gemm_is_x_rounded_times_the_values_rounded(backend, layout, dtype, monkeypatch):
    """y = x @ W.T over x and W's values rounded to dtype, within float32's summation of float64 over the same rounded
    operands and within dtype's rounding of the unrounded product; in slabs of whole row tiles (a partial last one)
    as in one."""
    rows, cols = 72, 512
    monkeypatch.setattr(slab_gemm, "SLAB_ALIGN", 32)  # slabs of whole tiles (8 rows at most) at this small size
    raw, w, qtype, ltype = _case(layout, rows, cols, backend)
    x = torch.randn(9, cols, generator=torch.Generator().manual_seed(3))
    values = quants.dequantize(raw, qtype, (rows, cols))
    want = x.double() @ values.double().T
    rounded = x.to(DTYPES[dtype]).double() @ values.to(DTYPES[dtype]).double().T
    scale = x.double().abs() @ values.double().abs().T
    for slab_bytes in (slab_gemm.SLAB_BYTES, 32 * cols * 2):  # one slab; slabs of 32 rows, the last partial
        got = slab_gemm.slab_gemm(w, ltype, (rows, cols), x.to(backend), DTYPES[dtype], slab_bytes)
        assert got.shape == (9, rows) and got.dtype == torch.float32
        assert rel_err(got, rounded, scale) < ROUNDED_BOUND, slab_bytes
        assert rel_err(got, want, scale) < TYPE_BOUND[dtype], slab_bytes


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_rounds_to_a_16_bit_type_as_torch_does(backend):
    """dequantize(dtype=...) gives the float32 values rounded to nearest, ties to even (the interpreter's own cast
    truncates): Q8_0 blocks of d = 1 + 2^-8 and 1 + 3 * 2^-8 (bf16 ties: to 1 and to 1 + 2^-6) and random ones."""
    from sparkd.engine.kernels.dequantize import dequantize

    raw = random_blocks(dispatch.FAMILIES[INT8_LAYOUTS["q8_0"][0]].qtype, 32).view(32, 34)
    raw[::16, :2] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8], dtype=torch.float16).view(torch.uint8).view(2, 2)
    raw[::16, 2:] = 1  # each row's first block: every quant 1, the values d
    shape = (2, 512)
    values = quants.dequantize(raw.reshape(-1), INT8_LAYOUTS["q8_0"][0], shape)
    for dtype in DTYPES.values():
        got = dequantize(raw.reshape(-1).to(backend), INT8_LAYOUTS["q8_0"][0], shape, dtype=dtype)
        assert got.dtype == dtype and torch.equal(got.cpu(), values.to(dtype))
    ties = dequantize(raw.reshape(-1).to(backend), INT8_LAYOUTS["q8_0"][0], shape, dtype=torch.bfloat16)
    assert ties[0, 0].item() == 1.0 and ties[1, 0].item() == 1 + 2 ** -6


def test_slab_rows_are_aligned_whole_tiles_within_the_scratch():
    q4t = dispatch.family(INT8_LAYOUTS["q4_k_pairx"][1])
    q6t = dispatch.family(INT8_LAYOUTS["q6_k_tiled"][1])
    assert (q4t.row_tile, q6t.row_tile, slab_gemm.SLAB_ALIGN) == (4, 8, 128)
    assert slab_gemm.slab_rows(q4t, 4100, 1024, 64 << 20) == 4100  # 8 MiB of bf16: the whole matrix, any rows
    assert slab_gemm.slab_rows(q4t, 4096, 1024, 1 << 20) == 512  # 1 MiB: 512 rows of 2 KiB
    assert slab_gemm.slab_rows(q4t, 4096, 1024, 1200 * 1024) == 512  # 600 rows fit: 512, a multiple of 128
    assert slab_gemm.slab_rows(q4t, 4096, 1024, 3 * 2048 + 7) == 128  # less than 128 rows: one step
    assert slab_gemm.slab_rows(q4t, 100, 1024, 0) == 100  # never more than the matrix
    assert slab_gemm.slab_rows(q4t, 36864, 7168, 64 << 20) == 4608  # session 46's slow 4681


@pytest.mark.parametrize("backend", BACKENDS)
def test_slab_gemm_refuses_what_it_cannot_multiply(backend):
    rows, cols = 8, 256
    raw, w, qtype, ltype = _case("q4_k_pairx", rows, cols, backend)
    x = torch.randn(3, cols, device=backend)
    before = (w.clone(), x.clone())
    cases = [
        (dict(weight=w, shape=(rows, cols), x=x, dtype=torch.float32), r"dtype torch.float32 is not one of"),
        (dict(weight=w[:-16], shape=(rows, cols), x=x), r"need 1152 weight bytes in whole tiles of 4 rows for "
                                                        r"\[8, 256\], got 1136"),
        (dict(weight=w[:576], shape=(4, cols), x=x[:, :128]), r"activations of shape \[3, 128\]"),
        (dict(weight=w, shape=(rows, cols), x=x.half()), r"activations must be float32, got torch.float16"),
        (dict(weight=w, shape=(rows, 200), x=x), r"200 columns is not a positive multiple"),
        (dict(weight=w, shape=(rows, cols), x=x[0]), r"need x \[T, 256\], got \[256\]"),
    ]
    for kwargs, message in cases:
        with pytest.raises(dispatch.KernelArgumentError, match="could not run the Q4_K_TILED slab GEMM: " + message):
            slab_gemm.slab_gemm(qtype=ltype, **kwargs)
    assert torch.equal(w, before[0]) and torch.equal(x, before[1])  # nothing written into the inputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_linear_takes_the_slab_gemm_from_its_rows_on_cuda(backend, monkeypatch):
    """A quantized KernelLinear over SLAB_MIN_ROWS rows or more runs slab_gemm on CUDA (its bits), fewer rows the
    integer GEMM (prefill_gemm.gemm's bits); the CPU, SLAB_GEMM "off" and PREFILL_FLOAT_GEMM "kernel" the integer GEMM
    at any row count."""
    rows, cols = 64, 512
    raw, w, qtype, ltype = _case("q4_k_pairx", rows, cols, backend)
    layer = linear.KernelLinear(w, ltype, (rows, cols))
    x = torch.randn(12, cols, device=backend)
    monkeypatch.setattr(linear, "SLAB_MIN_ROWS", 8)
    monkeypatch.setattr(linear, "SLAB_GEMM", "bf16")
    slab = slab_gemm.slab_gemm(w, ltype, (rows, cols), x, torch.bfloat16)
    int8 = prefill_gemm.gemm(w, ltype, (rows, cols), x, "int8")
    assert not torch.equal(slab, int8)  # the two ways differ, so the checks below tell which ran
    assert torch.equal(layer(x), slab if backend == "cuda" else int8)
    assert torch.equal(layer(x[:7]), int8[:7])
    monkeypatch.setattr(linear, "SLAB_GEMM", "off")
    assert torch.equal(layer(x), int8)
    monkeypatch.setattr(linear, "SLAB_GEMM", "bf16")
    monkeypatch.setattr(linear, "PREFILL_FLOAT_GEMM", "kernel")  # a row's bits whatever the row count: no cuBLAS
    assert torch.equal(layer(x), int8)


@pytest.mark.gpu
def test_a_prompt_graph_replays_the_slab_gemm(tmp_path, monkeypatch):
    """A prompt graph whose bucket reaches SLAB_MIN_ROWS captures the slab GEMMs (dequantization, the 16-bit copy of x,
    cuBLAS, the slabs' scratch in the graph's pool) and replays the same padded forward's bits, the decode steps after
    it too; the prompt's logits within 2e-2 of the integer GEMM's (SLAB_GEMM "off"), the same pick."""
    from sparkd.engine.cuda_graphs import StaticDecode, use_graphs
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model
    from sparkd.engine.prompt_graphs import PromptForward

    monkeypatch.setattr(linear, "SLAB_MIN_ROWS", 64)
    shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    m = load_model(write_model(tmp_path / "q.gguf", plan(shape, "Q4_K"), seed=3)[0], device="cuda")
    try:
        assert use_graphs("on", m.net, "cuda")
        tokens = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(70)])  # bucket 80
        runs = {}
        for way, mode in (("bf16", "padded"), ("bf16", "graphs"), ("off", "eager")):
            monkeypatch.setattr(linear, "SLAB_GEMM", way)
            cache = m.net.new_cache(256)
            forward = PromptForward(m.net, cache, mode)
            logits = forward(tokens, last=True)
            step = StaticDecode(m.net, cache, graphs=True)
            runs[mode] = logits, [step.next_token(int(logits[-1].argmax())) for _ in range(6)]
            assert not forward.failed and (mode != "graphs" or sorted(forward._graphs) == [80])
        (got, got_ids), (padded, padded_ids), (int8, _) = runs["graphs"], runs["padded"], runs["eager"]
        assert torch.equal(got, padded) and got_ids == padded_ids
        err = float((got - int8).norm() / int8.norm())
        assert not torch.equal(got, int8)  # the slab GEMM ran
        assert err < 2e-2 and got.argmax() == int8.argmax(), err
    finally:
        m.close()


@pytest.mark.gpu
def test_a_prompt_that_takes_the_slab_experts_runs_eagerly(tmp_path, monkeypatch):
    """PromptForward runs a prompt of SLAB_EAGER_ROWS or more whose rows an expert reach SLAB_EXPERT_ROWS eagerly
    (session 47: the eager slabs beat a graph's grouped GEMMs), with the eager forward's bits; fewer rows an expert, or
    a shorter bucket, replay a graph. A capture that meets the slab
    experts anyway (that rule patched off) keeps the grouped GEMMs (MoE's capture check): no capture given up, the
    padded forward's bits without the slabs, while the same padded forward run eagerly takes them (other bits)."""
    from sparkd.engine import prompt_graphs
    from sparkd.engine.layers import moe as moe_layer
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model
    from sparkd.engine.prompt_graphs import PromptForward

    shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    m = load_model(write_model(tmp_path / "q.gguf", plan(shape, "Q4_K"), seed=3)[0], device="cuda")
    tokens = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(70)])  # bucket 80
    try:
        monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", 1)
        assert PromptForward(m.net, m.net.new_cache(256), "graphs").replays(70)  # below SLAB_EAGER_ROWS
        monkeypatch.setattr(prompt_graphs, "SLAB_EAGER_ROWS", 80)
        forward = PromptForward(m.net, m.net.new_cache(256), "graphs")
        assert not forward.replays(70)
        assert torch.equal(forward(tokens, last=True).cpu(), m.net(tokens, m.net.new_cache(256), last=True).cpu())
        monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", 10 ** 9)
        assert PromptForward(m.net, m.net.new_cache(256), "graphs").replays(70)
        monkeypatch.setattr(PromptForward, "_slab_experts", lambda self, rows: False)
        runs = {}
        for mode, rows in (("graphs", 1), ("padded", 10 ** 9), ("padded", 1)):
            monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", rows)
            forward = PromptForward(m.net, m.net.new_cache(256), mode)
            runs[mode, rows] = forward(tokens, last=True)
            assert forward.replays(70) == (mode == "graphs") and not forward.failed
    finally:
        m.close()
    assert torch.equal(runs["graphs", 1], runs["padded", 10 ** 9])
    assert not torch.equal(runs["padded", 1], runs["padded", 10 ** 9])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's sigmoid of -large
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gu_type, d_type, act, biased", [(T.Q4_K, T.Q6_K, "silu", False),
                                                          (T.MXFP4, T.MXFP4, "swiglu_oai", True)], ids=["q4k", "mxfp4"])
def test_slab_experts_are_the_experts_over_16_bit_values(backend, gu_type, d_type, act, biased, monkeypatch):
    """moe_prefill's slab (session 46): each expert's rows through slab_gemm, within bf16's rounding of float64 (x,
    the weights and the activations rounded), biases added (gpt-oss); an expert without rows skipped; both glues the
    same bits; f16 finer than bf16. x is scaled so float16 holds the activations: the random blocks' weights reach
    ~100, and at x ~ 1 their activations (~1e7) pass float16's 65504, where bf16 stays finite (why it is the
    default)."""
    dim, width, n, n_tok, top_k = (2048, 768, 8, 40, 4) if backend == "cuda" else (256, 256, 3, 24, 2)
    table, gates, ups, downs = arena_table(gu_type, d_type, dim, width, n, backend)
    x, w = torch.randn(n_tok, dim) * 1e-3, torch.rand(n_tok, top_k)
    slots = torch.stack([torch.randperm(n - 1)[:top_k] for _ in range(n_tok)])  # expert n - 1 gets no rows
    bias = torch.randn(n, 2 * width + dim) if biased else None
    ref = torch.stack([moe_reference(x[t], w[t], [gates[i] for i in slots[t]], [ups[i] for i in slots[t]],
                                     [downs[i] for i in slots[t]], act, bias=None if bias is None else bias[slots[t]])
                       for t in range(n_tok)])
    args = (prepare(table, backend), x.to(backend), slots.to(backend), w.to(backend), act, "int8")
    on = None if bias is None else bias.to(backend)
    err = {}
    for name, dtype in DTYPES.items():
        got = moe_prefill(*args, bias=on, slab=dtype)
        err[name] = rel_err(got, ref)
        monkeypatch.setattr(prefill_moe, "PREFILL_GLUE", "torch")
        assert torch.equal(moe_prefill(*args, bias=on, slab=dtype), got)
        monkeypatch.setattr(prefill_moe, "PREFILL_GLUE", "kernels")
    print(f"slab experts against float64: {err}")
    if not biased:
        big = (args[0], args[1] * 1e3, *args[2:])
        assert torch.isfinite(moe_prefill(*big, slab=torch.bfloat16)).all()
        assert not torch.isfinite(moe_prefill(*big, slab=torch.float16)).all()
    assert err["bf16"] < EXPERT_BOUND["bf16"] and err["f16"] < EXPERT_BOUND["f16"] and err["f16"] < err["bf16"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_experts_is_each_experts_dequantization(backend):
    """dequantize_experts (session 47): several experts' matrices at their byte offsets in one launch, each the bits
    dequantize gives it alone, into halves of one [n, 2 rows, cols] buffer (gate | up) as moe_prefill's slabs take
    them; the other half and the experts not asked for untouched."""
    from sparkd.engine.kernels.dequantize import dequantize, dequantize_experts

    table, *_ = arena_table(T.Q4_K, T.Q6_K, 256, 256, 4, backend)
    fam = dispatch.FAMILIES[T.Q4_K]
    span = 256 * fam.row_bytes(256)
    pick = [3, 0, 2]
    offsets = torch.tensor([table.gate_offsets[e] for e in pick], device=backend)
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.full((3, 512, 256), 7.0, dtype=dtype, device=backend)
        half = out[:, :256]
        assert dequantize_experts(table.gate, offsets, T.Q4_K, (256, 256), half) is half
        for j, e in enumerate(pick):
            at = table.gate_offsets[e]
            assert torch.equal(out[j, :256], dequantize(table.gate[at:at + span], T.Q4_K, (256, 256), dtype=dtype))
        assert bool((out[:, 256:] == 7.0).all())


WORD_LAYOUTS = {"q4_k_pairx": INT8_LAYOUTS["q4_k_pairx"],
                "mxfp4_tiled": (T.MXFP4, mxfp4_tiled.TILED, mxfp4_tiled.pack_raw)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", WORD_LAYOUTS)
def test_the_word_kernel_writes_the_blocks_values(backend, layout, monkeypatch):
    """Session 48: the layouts with a `words` step (dequantize's _words_kernel, a qs word a lane) give exactly the
    blocks' values, rounded to a 16-bit type as torch rounds, alone and as experts at their offsets; a last program
    of fewer rows and (MXFP4's 32-value blocks) a last group of fewer values write only what is there."""
    from sparkd.engine.kernels import dequantize as dq

    monkeypatch.setattr(dq, "WORDS_ROWS", 32)  # programs of 32 rows: 48 rows end in a half program
    qtype, ltype, pack = WORD_LAYOUTS[layout]
    assert dispatch.family(ltype).words is not None
    fam = dispatch.FAMILIES[qtype]
    rows, cols, n = 48, 352 if fam.block_values == 32 else 512, 3
    raws = [random_blocks(qtype, rows * cols // fam.block_values) for _ in range(n)]
    laid = torch.cat([pack(r, (rows, cols)) for r in raws]).to(backend)
    values = torch.stack([quants.dequantize(r, qtype, (rows, cols)) for r in raws])
    offsets = torch.arange(n, dtype=torch.int64, device=backend) * (laid.numel() // n)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = torch.full((n, rows + 8, cols), 7.0, dtype=dtype, device=backend)
        dq.dequantize_experts(laid, offsets[[2, 0, 1]], ltype, (rows, cols), out[:, :rows])
        assert torch.equal(out[:, :rows].cpu(), values[[2, 0, 1]].to(dtype)), dtype
        assert bool((out[:, rows:] == 7.0).all())
        alone = dq.dequantize(laid[:laid.numel() // n], ltype, (rows, cols), dtype=dtype)
        assert torch.equal(alone.cpu(), values[0].to(dtype)), dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_experts_refuses_what_it_cannot_write(backend):
    """Bad offsets or outputs: the clear error, and the output untouched."""
    from sparkd.engine.kernels.dequantize import dequantize_experts

    table, *_ = arena_table(T.Q4_K, T.Q6_K, 256, 256, 2, backend)
    offsets = torch.tensor(table.gate_offsets, device=backend)
    out = torch.zeros(2, 256, 512, dtype=torch.bfloat16, device=backend)
    cases = [(offsets.int(), out[:, :, :256]), (offsets, out), (offsets, out[:, :, ::2]),
             (offsets, out[:, :, :256].to(torch.int32)), (offsets[:1], out[:, :, :256])]
    for offs, o in cases:
        with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the Q4_K dequantization of experts: "
                                                                r"need int64 offsets \[n\] and out \[n, 256, 256\]"):
            dequantize_experts(table.gate, offs, T.Q4_K, (256, 256), o)
    assert not out.any()
    with pytest.raises(dispatch.KernelArgumentError, match="200 columns is not a positive multiple"):
        dequantize_experts(table.gate, offsets, T.Q4_K, (256, 200), out[:, :, :200])


@pytest.mark.parametrize("backend", BACKENDS)
def test_slab_experts_in_ranges_are_the_slabs_at_once(backend, monkeypatch):
    """moe_prefill's slab experts a range of one expert at a time (EXPERT_SLAB_BYTES below one expert's weights: a host
    sync for the ranges' rows; the expert without rows skipped) give the bits of the whole table in one range (no sync;
    that expert an empty group), each row's products the same grouped GEMM's."""
    table, *_ = arena_table(T.Q4_K, T.Q6_K, 256, 256, 5, backend)
    x, w = torch.randn(20, 256, device=backend) * 1e-3, torch.rand(20, 2, device=backend)
    slots = torch.stack([torch.randperm(4)[:2] for _ in range(20)]).to(backend)  # expert 4: no rows
    args = (prepare(table, backend), x, slots, w, "silu", "int8")
    whole = moe_prefill(*args, slab=torch.bfloat16)
    monkeypatch.setattr(prefill_moe, "EXPERT_SLAB_BYTES", 1)
    ones = moe_prefill(*args, slab=torch.bfloat16)
    if backend == "cuda":  # cuBLAS-class tiles of another group count: the same products, maybe summed apart
        assert float((ones - whole).norm() / whole.norm()) < 1e-6
    else:
        assert torch.equal(ones, whole)
    assert not torch.equal(whole, moe_prefill(*args))  # the integer GEMMs' differ: the slabs ran


@pytest.mark.parametrize("backend", BACKENDS)
def test_slab_experts_leave_a_slot_outside_the_table_zero(backend, monkeypatch):
    """Unchecked slots (a router's top-k) outside the table: under the slabs their rows come out zero, whole table or
    ranges (grouped_mm leaves rows past its last group unwritten: masked), the other tokens' rows keep their bits."""
    table, *_ = arena_table(T.Q8_0, T.Q8_0, 256, 256, 2, backend)
    p, x, w = prepare(table, backend), torch.randn(2, 256, device=backend), torch.rand(2, 1, device=backend)
    for slab_bytes in (prefill_moe.EXPERT_SLAB_BYTES, 1):
        monkeypatch.setattr(prefill_moe, "EXPERT_SLAB_BYTES", slab_bytes)
        ok = moe_prefill(p, x, torch.tensor([[0], [1]], device=backend), w, check_slots=False, slab=torch.bfloat16)
        bad = moe_prefill(p, x, torch.tensor([[0], [2]], device=backend), w, check_slots=False, slab=torch.bfloat16)
        assert torch.equal(bad[0], ok[0]) and not bad[1].any() and ok[1].any(), slab_bytes


@pytest.mark.gpu
def test_slab_experts_of_a_table_that_fits_sync_nowhere(monkeypatch):
    """A table whose experts' 16-bit values fit EXPERT_SLAB_BYTES runs its slab experts without a host sync (torch's
    sync debug mode raises at one), so a CUDA graph captures moe_prefill and replays its eager bits. A table of several
    ranges syncs once, for its ranges' rows: the debug mode catches it."""
    table, *_ = arena_table(T.Q4_K, T.Q6_K, 256, 256, 5, "cuda")
    x, w = torch.randn(20, 256, device="cuda") * 1e-3, torch.rand(20, 2, device="cuda")
    slots = torch.stack([torch.randperm(4)[:2] for _ in range(20)]).cuda()
    args = (prepare(table, "cuda"), x, slots, w, "silu", "int8")
    want = moe_prefill(*args, check_slots=False, slab=torch.bfloat16)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        unsynced = moe_prefill(*args, check_slots=False, slab=torch.bfloat16)
        monkeypatch.setattr(prefill_moe, "EXPERT_SLAB_BYTES", 1)
        with pytest.raises(RuntimeError, match="synchroniz"):
            moe_prefill(*args, check_slots=False, slab=torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(unsynced, want)
    monkeypatch.setattr(prefill_moe, "EXPERT_SLAB_BYTES", 1 << 30)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = moe_prefill(*args, check_slots=False, slab=torch.bfloat16)
    got.zero_()
    graph.replay()
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_prefill_refuses_a_slab_type_it_cannot_multiply(backend):
    """A slab type outside SLAB_TYPES is refused before any launch, with the types it takes."""
    table, *_ = arena_table(T.Q8_0, T.Q8_0, 64, 32, 2, backend)
    x, slots, w = torch.randn(3, 64, device=backend), torch.zeros(3, 1, dtype=torch.int64, device=backend), \
        torch.ones(3, 1, device=backend)
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the MoE prefill kernels: slab torch.float32 "
                                                            r"is not one of torch.bfloat16, torch.float16"):
        moe_prefill(prepare(table, backend), x, slots, w, slab=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_moe_layer_takes_the_slab_experts_from_its_rows_per_expert(backend, tmp_path, monkeypatch):
    """A MoE layer's prompt runs its experts through slab_gemm where its rows per expert reach SLAB_EXPERT_ROWS on
    CUDA, within 2e-2 of the integer GEMMs' logits with the same pick; fewer rows, SLAB_GEMM "off" and the CPU never."""
    from sparkd.engine.kernels import moe_prefill as kernels_moe
    from sparkd.engine.layers import moe as moe_layer
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model

    calls = []
    slab_experts = kernels_moe._slab_experts
    monkeypatch.setattr(kernels_moe, "_slab_experts", lambda *a: calls.append(a[-1]) or slab_experts(*a))
    shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    m = load_model(write_model(tmp_path / "q.gguf", plan(shape, "Q4_K"), seed=3)[0], device=backend)
    n, A = m.cfg.n_expert, m.cfg.n_expert_used
    tokens = torch.tensor([(7 * i + 3) % m.cfg.n_vocab for i in range(2 * n // A)])  # 2 rows an expert
    try:
        logits = {}
        for way, rows in (("off", 2), ("bf16", 3), ("bf16", 2)):
            monkeypatch.setattr(linear, "SLAB_GEMM", way)
            monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", rows)
            before = len(calls)
            logits[way, rows] = m.net(tokens, m.net.new_cache(64), last=True)
            assert (len(calls) > before) == (backend == "cuda" and (way, rows) == ("bf16", 2)), (way, rows)
    finally:
        m.close()
    assert set(calls) <= {torch.bfloat16}
    assert torch.equal(logits["bf16", 3], logits["off", 2])  # too few rows: the integer GEMMs, their bits
    got, want = logits["bf16", 2], logits["off", 2]
    assert float((got - want).norm() / want.norm()) < 2e-2 and torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_plan_counts_the_slab_experts_on_cuda_from_their_rows(monkeypatch):
    """slab_experts_bytes (session 47): on CUDA, from SLAB_EXPERT_ROWS rows an expert, every expert's 16-bit values
    where they fit EXPERT_SLAB_BYTES (else that) and the routed rows' 16-bit copies, inside workspace_bytes; nothing on
    the CPU, below the rows or with the slabs switched off; session 48: from SLAB_EXPERT_ROWS_LOOPED rows where the GPU
    loops torch._grouped_mm (a GB10's compute capability 12.1: torch's answers stood in for, none here)."""
    from sparkd.engine.kernels import EXPERT_SLAB_BYTES
    from sparkd.engine.layers import moe as moe_layer
    from sparkd.engine.layers.rope import RopeConfig
    from sparkd.engine.models.config import ModelConfig
    from sparkd.engine.streaming.plan import slab_experts_bytes, workspace_bytes

    cfg = ModelConfig("qwen3moe", 512, 256, 2, 256, 4, 2, 64, 64, 1e-6, RopeConfig(64, 1e4, True), n_expert=8,
                      n_expert_used=2, n_ff_exp=256)
    n, A = cfg.n_expert, cfg.n_expert_used
    monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", 4)
    T = 4 * n // A  # 4 rows an expert
    assert slab_experts_bytes(cfg, T, cuda=True) == n * 3 * 256 * 256 * 2 + T * A * (256 + 3 * 256) * 2
    assert slab_experts_bytes(cfg, T) == 0 and slab_experts_bytes(cfg, T - 1, cuda=True) == 0
    assert workspace_bytes(cfg, T, T, cuda=True) - workspace_bytes(cfg, T, T) >= slab_experts_bytes(cfg, T, cuda=True)
    big = dataclasses.replace(cfg, n_expert=8192)  # 3.2 GB of bf16
    assert slab_experts_bytes(big, T * 1024, cuda=True) == EXPERT_SLAB_BYTES + T * 1024 * A * (256 + 3 * 256) * 2
    whole = slab_experts_bytes(cfg, T, cuda=True)
    monkeypatch.setattr(linear, "SLAB_GEMM", "off")
    assert slab_experts_bytes(cfg, T, cuda=True) == 0
    monkeypatch.setattr(linear, "SLAB_GEMM", "bf16")
    monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS_LOOPED", 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, at_4, at_8 in (((12, 1), 0, 2 * whole - n * 3 * 256 * 256 * 2), ((9, 0), whole, None)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert slab_experts_bytes(cfg, T, cuda=True) == at_4, capability
        assert at_8 is None or slab_experts_bytes(cfg, 2 * T, cuda=True) == at_8, capability


@pytest.mark.gpu
def test_a_prompt_with_slab_experts_holds_at_most_the_plans_workspace(tmp_path, monkeypatch):
    """A Q4_K MoE model's prompt whose rows an expert reach SLAB_EXPERT_ROWS runs its experts on slabs and holds at
    most the plan's workspace (the slab term in it)."""
    from test_attention_memory import chunk_peak

    from sparkd.engine.kernels import moe_prefill as kernels_moe
    from sparkd.engine.layers import moe as moe_layer
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.streaming.plan import workspace_bytes

    calls = []
    slab_experts = kernels_moe._slab_experts
    monkeypatch.setattr(kernels_moe, "_slab_experts", lambda *a: calls.append(a[-1]) or slab_experts(*a))
    shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    monkeypatch.setattr(moe_layer, "SLAB_EXPERT_ROWS", 4)
    cfg, peak = chunk_peak(write_model(tmp_path / "q.gguf", plan(shape, "Q4_K"), seed=3)[0], 0, 64, "cuda")
    assert calls and peak <= workspace_bytes(cfg, 64, 64, cuda=True), peak


@pytest.mark.gpu
def test_the_slab_experts_need_more_rows_where_grouped_mm_loops(tmp_path, monkeypatch):
    """Where torch._grouped_mm has no fused kernel (float16 slabs; compute capability 12.x, a GB10's: stood in for by
    patching torch's answer, this box is 9.x) a MoE layer takes the slabs from SLAB_EXPERT_ROWS_LOOPED rows an expert,
    with the fused bf16 kernels from SLAB_EXPERT_ROWS."""
    from sparkd.engine.layers import moe as moe_layer
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model

    shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    m = load_model(write_model(tmp_path / "q.gguf", plan(shape, "Q4_K"), seed=3)[0], device="cuda")
    try:
        layer = next(mod for mod in m.net.modules() if isinstance(mod, moe_layer.MoE))
        n, A = m.cfg.n_expert, m.cfg.n_expert_used
        fused, looped = (-(-rows * n // A) for rows in (moe_layer.SLAB_EXPERT_ROWS, moe_layer.SLAB_EXPERT_ROWS_LOOPED))
        assert torch.cuda.get_device_capability()[0] in (9, 10)
        assert [layer.slab_experts(t, torch.device("cuda")) for t in (fused - 1, fused)] == [None, torch.bfloat16]
        monkeypatch.setattr(linear, "SLAB_GEMM", "f16")
        assert [layer.slab_experts(t, torch.device("cuda")) for t in (fused, looped)] == [None, torch.float16]
        monkeypatch.setattr(linear, "SLAB_GEMM", "bf16")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 1))
        assert [layer.slab_experts(t, torch.device("cuda")) for t in (fused, looped)] == [None, torch.bfloat16]
    finally:
        m.close()
