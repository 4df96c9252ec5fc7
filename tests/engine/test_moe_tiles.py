"""The MoE decode's tiles by shape (moe.decode_tiles, session 5): the gate/up tile of two-group steps
and, from LARGE_DOWN_TILES' model width, another down tile; OLD_DECODE_TILES (session 4's)
stay selectable, per call or by $SPARKD_MOE_TILES=old.

A tile changes which programs hold which rows and where the float sums of each block's integer
dp4a sum are added, never those integer sums: new and old tiles agree to float32 rounding, each
launch alone (float h from gate/up; the same quantized h into down), and the engine's call (h
quantized in the gate/up launch) gives the same bits run to run. Interpreter where there is no
GPU, compiled with the marker gpu.
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

from test_kernels import BACKENDS, BOUNDS, arena_table, moe_reference, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, moe  # noqa: E402

TYPES = [T.Q8_0, T.Q4_K]


def table_at(qtype: T, dim: int) -> moe.PreparedTable:
    """A one-expert table of model width dim on the CPU (the rule reads types and shape only)."""
    width = 32 if qtype == T.Q8_0 else 256
    return moe.prepare(arena_table(qtype, qtype, dim, width, 1, "cpu")[0], "cpu")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decode_tiles_follow_the_model_width(qtype):
    name = qtype.name
    limit, large = moe.LARGE_DOWN_TILES[name]
    gate_up, small = moe.DECODE_TILES[name]
    assert moe.decode_tiles(table_at(qtype, 2048)) == (gate_up, small)  # Qwen3-30B-A3B
    assert moe.decode_tiles(table_at(qtype, limit - 256)) == (gate_up, small)
    assert moe.decode_tiles(table_at(qtype, limit)) == (gate_up, large)
    assert moe.decode_tiles(table_at(qtype, limit), old=True) == moe.OLD_DECODE_TILES[name]
    assert large != small and gate_up != moe.OLD_DECODE_TILES[name][0]  # else the rule changes nothing


def test_the_environment_switches_back_to_the_old_tiles(monkeypatch):
    """OLD_TILES ($SPARKD_MOE_TILES=old, read at import: tests/engine/test_switches.py) is decode_tiles' default."""
    monkeypatch.setattr(moe, "OLD_TILES", True)
    assert moe.decode_tiles(table_at(T.Q4_K, 7168)) == moe.OLD_DECODE_TILES["Q4_K"]


# Q4_K under the interpreter takes ~5 minutes even at 256x256 (too long for CI): compiled only;
# its GEMV tiles' sums against the old tile's: test_int_kernels.test_q4_k_tiles_give_the_old_tiles_sums
CASES = [pytest.param("cpu", T.Q8_0, id="interpret-Q8_0", marks=BACKENDS[0].marks)] + \
    [pytest.param("cuda", t, id=f"cuda-{t.name}", marks=pytest.mark.gpu) for t in TYPES]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend,qtype", CASES)
def test_new_tiles_give_the_old_tiles_sums(backend, qtype):
    # the interpreter runs programs one by one: narrow Q8_0 experts (one partial group per row), two
    # of them (the down's 8 ranges become 2: still a fold)
    dim, width, n = (2048, 768, 8) if backend == "cuda" else (64, 32, 2)
    table, gates, ups, downs = arena_table(qtype, qtype, dim, width, n, backend)
    p = moe.prepare(table, backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    new = moe.DECODE_TILES[qtype.name][0], moe.LARGE_DOWN_TILES[qtype.name][1]
    old = moe.OLD_DECODE_TILES[qtype.name]
    h_new, h_old = (moe._gate_up(p, x, w, False, "silu", t[0], None, "test") for t in (new, old))
    assert rel_err(h_new, h_old.cpu().double()) < 1e-6
    q = act_quant.quantize(h_old, p.down.act_fmt)  # one h into both downs
    y_new, y_old = torch.empty(dim, device=backend), torch.empty(dim, device=backend)
    moe._down(p, q, w, y_new, new[1], None, None)
    moe._down(p, q, w, y_old, old[1], None, None)
    assert rel_err(y_new, y_old.cpu().double()) < 1e-6
    # the engine's call: h quantized in the gate/up launch; the same bits twice, near the reference
    tiles = dict(gate_up=dataclasses.replace(new[0], fuse_quant=True), down=new[1])
    ys = [moe.moe_decode(p, x, w, **tiles) for _ in range(2)]
    assert torch.equal(ys[0], ys[1])
    want = moe_reference(x.cpu(), w.cpu(), gates, ups, downs, "silu", qtype, qtype)
    assert rel_err(ys[0], want) < BOUNDS["fp32"]
