"""Session 8 (moe16): the MoE references take the down's input from the engine (moe.down_input:
h from the gate/up launch, rounded by the engine's own act_quant), so a near-tie in h cannot put the
reference and the kernel on two sides of an int8 rounding boundary. The old references rounded an
h of their own (float64 g and u), which can differ from the kernel's fp32 h by an ulp: at a tie that
is a whole quant step, ~1e-3 of y, 200x the fp32 bound (moe14's box run: 3.0e-4 once).
Interpreter where there is no GPU."""

import os

import pytest
import torch
from gguf import GGMLQuantizationType as T

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, act_in, arena_table, moe_reference, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

pytestmark = list(BACKENDS[0].marks)  # CPU tensors through the interpreter


def near_ties(width: int, up: bool) -> torch.Tensor:
    """[1, width] float32 h whose Q8_0 blocks have scale 1 (amax 127) and every other value an ulp
    above (up) or below a half-integer: round-half-even sends the two to different quants."""
    h = (torch.arange(width) % 31 - 15).float() + 0.5
    h = torch.nextafter(h, torch.full_like(h, float("inf") if up else float("-inf")))
    h[::32] = 127.0
    return h[None]


def test_a_near_tie_flips_an_h_rounded_apart_but_not_the_engines_own():
    dim, width = 32, 256  # one expert, one 256-value group per down row
    table, gates, ups, downs = arena_table(T.Q8_0, T.Q8_0, dim, width, 1, "cpu")
    p = moe.prepare(table, "cpu")
    h_kernel, h_apart = near_ties(width, up=True), near_ties(width, up=False)
    assert torch.equal(torch.nextafter(h_apart, h_kernel), torch.nextafter(h_kernel, h_apart))  # an ulp off one tie
    w = torch.rand(1)
    y = torch.empty(dim)
    tile = GemvConfig(block_n=dim, num_warps=1, unroll=1, split=1)
    moe._down(p, act_quant.quantize(h_kernel, p.down.act_fmt), w, y, tile, None, None, moe_tiles.Kernels())
    x = torch.zeros(dim)  # unused: the references below are given h
    old = moe_reference(x, w, gates, ups, downs, "silu", T.Q8_0, T.Q8_0, h=[act_in(T.Q8_0, h_apart[0])])
    assert rel_err(y, old) > 100 * BOUNDS["fp32"]  # one quant step per tie: the old way fails
    engine_h = act_quant.quantize(h_kernel, p.down.act_fmt).dequantize()  # what moe.down_input returns
    new = moe_reference(x, w, gates, ups, downs, "silu", T.Q8_0, T.Q8_0, h=engine_h)
    assert rel_err(y, new) < BOUNDS["fp32"]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
def test_down_input_is_what_the_down_multiplies():
    dim, width = 256, 256
    table, *_ = arena_table(T.Q8_0, T.Q8_0, dim, width, 1, "cpu")
    p = moe.prepare(table, "cpu")
    x, w = torch.randn(dim), torch.rand(1)
    gu = GemvConfig(block_n=64, num_warps=1, unroll=1, fuse_quant=True)
    dn = GemvConfig(block_n=64, num_warps=1, unroll=1, split=1)
    h, h32 = moe.down_input(p, x, gate_up=gu), moe.down_input(p, x, gate_up=gu, rounded=False)
    assert torch.equal(act_quant.quantize(h32, p.down.act_fmt).dequantize(), h)  # the interpreter: no fp fusion
    y, y_h = torch.empty(dim), torch.empty(dim)
    moe.moe_decode(p, x, w, gate_up=gu, down=dn, out=y)
    moe._down(p, act_quant.quantize(h, p.down.act_fmt), w, y_h, dn, None, None, None)
    assert torch.equal(y, y_h)
