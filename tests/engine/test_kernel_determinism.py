"""The GEMV and MoE decode kernels give the same bits on every run: partial sums meet in a fixed
order (split-K ranges through an ordered sum, the MoE experts in table order inside one program),
never by atomic adds in arrival order. Same prompt at temperature 0, same answer; eager and
CUDA-graph runs comparable bit for bit.

Under the interpreter (programs run one by one) the fixed order itself is checked: y equals the
ordered fold of the parts computed separately. On the GPU, where arrival order really varies,
repeated runs must be bit-identical too (marker gpu).
"""

import dataclasses
import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, TILES, arena_table, random_blocks  # noqa: E402

from sparkd.engine.kernels import dispatch  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402
from sparkd.engine.kernels.moe import ExpertTable, moe_decode  # noqa: E402

# integer down (routing weight in the down kernel) and float down (routing weight in h)
MOE_PAIRS = [(T.Q8_0, T.Q8_0), (T.Q4_K, T.Q6_K)]
SPLIT = GemvConfig(block_n=8, num_warps=1, unroll=1, split=3)


def one_expert(table: ExpertTable, i: int) -> ExpertTable:
    return ExpertTable(table.gate, table.up, table.down, [table.gate_offsets[i]], [table.up_offsets[i]],
                       [table.down_offsets[i]], table.gate_up_type, table.down_type, table.dim, table.width)


def row_range(raw: torch.Tensor, qtype: T, rows: int, cols: int, first: int, last: int) -> torch.Tensor:
    """The weight bytes of columns [first, last) of every row (whole blocks), as a new matrix."""
    fam = dispatch.FAMILIES[qtype]
    a, b = fam.row_bytes(first), fam.row_bytes(last)
    return raw.reshape(rows, fam.row_bytes(cols))[:, a:b].contiguous().reshape(-1)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_split_gemv_is_the_ordered_sum_of_its_ranges(backend, qtype):
    """split 3 over 6 groups: ranges of 2 groups, each the GEMV of its column range, summed in order."""
    rows, cols = 19, 6 * 256
    raw = random_blocks(qtype, rows * cols // dispatch.FAMILIES[qtype].block_values)
    x = torch.randn(cols)
    y = gemv(raw.to(backend), qtype, (rows, cols), x.to(backend), config=SPLIT)
    one = GemvConfig(block_n=8, num_warps=1, unroll=1, split=1)
    parts = [gemv(row_range(raw, qtype, rows, cols, k, k + 512).to(backend), qtype, (rows, 512),
                  x[k:k + 512].contiguous().to(backend), config=one) for k in range(0, cols, 512)]
    assert torch.equal(y, torch.sum(torch.stack(parts), 0))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("gu_type,d_type", MOE_PAIRS, ids=lambda t: t.name)
@pytest.mark.skipif(ON_GPU, reason="the GPU may fuse the expert adds into FMAs the torch fold does not "
                                   "repeat; there the repeat test checks the same property")
def test_moe_decode_adds_its_experts_in_table_order(gu_type, d_type):
    """y is ((0 + e0) + e1) + e2 with e_i expert i's weighted down output, computed alone."""
    table, *_ = arena_table(gu_type, d_type, 256, 256, 3, "cpu")
    x, w = torch.randn(256), torch.rand(3)
    y = moe_decode(table, x, w, **TILES["cpu"])
    want = torch.zeros(256)
    for i in range(3):
        want += moe_decode(one_expert(table, i), x, w[i:i + 1].contiguous(), **TILES["cpu"])
    assert torch.equal(y, want)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("gu_type,d_type", MOE_PAIRS, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_runs_are_bit_identical(backend, gu_type, d_type):
    """The default tiles (the GPU's), a split MoE down and a split GEMV, several runs: one set of
    bits each."""
    dim, width, n, runs = (2048, 768, 8, 20) if backend == "cuda" else (256, 256, 3, 2)
    table, *_ = arena_table(gu_type, d_type, dim, width, n, backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows = 4099 if backend == "cuda" else 19
    raw = random_blocks(d_type, rows * dim // dispatch.FAMILIES[d_type].block_values).to(backend)
    ys = [moe_decode(table, x, w, **TILES[backend]) for _ in range(runs)]
    split = dataclasses.replace(TILES["cpu"]["down"] if backend == "cpu" else GemvConfig(), split=2)
    ys_split = [moe_decode(table, x, w, down=split, gate_up=TILES[backend].get("gate_up")) for _ in range(runs)]
    lin = [gemv(raw, d_type, (rows, dim), x, config=GemvConfig(split=4)) for _ in range(runs)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert all(torch.equal(ys_split[0], y) for y in ys_split[1:])
    assert all(torch.equal(lin[0], y) for y in lin[1:])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("gu_type,d_type", MOE_PAIRS, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_timing_switches_compute_the_same_sums(backend, gu_type, d_type):
    """atomic (the old reduction, kept to time against) and stages (the pipeliner) change how, not
    what: within the float32 bound of the ordered default."""
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (256, 256, 3)
    table, *_ = arena_table(gu_type, d_type, dim, width, n, backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows = 515 if backend == "cuda" else 19
    raw = random_blocks(d_type, rows * dim // dispatch.FAMILIES[d_type].block_values).to(backend)
    want_moe = moe_decode(table, x, w, **TILES[backend])
    want_lin = gemv(raw, d_type, (rows, dim), x, config=SPLIT)
    for change in (dict(atomic=True), dict(stages=3)):
        tiles = {k: dataclasses.replace(c, **change) for k, c in TILES["cpu"].items()}
        got_moe = moe_decode(table, x, w, **tiles)
        got_lin = gemv(raw, d_type, (rows, dim), x, config=dataclasses.replace(SPLIT, **change))
        assert float((got_moe - want_moe).norm() / want_moe.norm()) < 1e-6, change
        assert float((got_lin - want_lin).norm() / want_lin.norm()) < 1e-6, change


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("gu_type,d_type", MOE_PAIRS, ids=lambda t: t.name)
@pytest.mark.skipif(ON_GPU, reason="as test_moe_decode_adds_its_experts_in_table_order")
def test_split_down_folds_its_expert_ranges_in_order(gu_type, d_type):
    """down split 2 over 3 experts: programs sum experts {0, 1} and {2}, then one ordered sum."""
    table, *_ = arena_table(gu_type, d_type, 256, 256, 3, "cpu")
    x, w = torch.randn(256), torch.rand(3)
    down = dataclasses.replace(TILES["cpu"]["down"], split=2)
    y = moe_decode(table, x, w, gate_up=TILES["cpu"]["gate_up"], down=down)
    e = [moe_decode(one_expert(table, i), x, w[i:i + 1].contiguous(), **TILES["cpu"]) for i in range(3)]
    assert torch.equal(y, torch.sum(torch.stack([torch.zeros(256) + e[0] + e[1], torch.zeros(256) + e[2]]), 0))
