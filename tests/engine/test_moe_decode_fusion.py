"""The fused MoE decode's work folded into its two launches, each against the torch code it
replaces (layers/moe.DECODE_PARTS, switchable back): the kernels read offsets[ids] themselves
instead of a gathering launch per table, a split down's ranges meet in the down launch (the
last program of each row tile adds them in order) instead of a torch.sum launch, and the
block's residual add happens in the down launch.

Under the interpreter each is bit-equal to the old path, in the kernels and in the engine's
decode step, and the step launches that many kernels fewer. On the GPU (marker gpu) the same
checks run compiled; the in-launch fold adds in range order where torch's sum may not, so
there it is held to the float32 bound instead.
"""

import dataclasses
import functools
import os
import subprocess
import sys
from unittest import mock

import pytest
from bench_script import load_bench_script
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, TILES, arena_table  # noqa: E402

from sparkd.engine.kernels import dispatch, fused, q4_0  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, tickets  # noqa: E402
from sparkd.engine.kernels.moe import moe_decode, prepare  # noqa: E402
from sparkd.engine.kernels.moe_tiles import DECODE_TILES  # noqa: E402
from sparkd.engine.layers import moe  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402

# integer down (routing weight in the down kernel), a float down (routing weight in h: Q4_0's float path, FLOAT_DOWN;
# Q6_K and Q4_0, once the float ones here, have had integer steps since) and the K-quants' integer down; the interpreter
# runs the first two (the integer and the float down kernel's fold and residual code) on small experts (D, F):
# two row tiles of the down's 64 rows. The GPU runs all three pairs.
PAIRS = {"cpu": [(T.Q8_0, T.Q8_0), (T.Q8_0, T.Q4_0)],
         "cuda": [(T.Q8_0, T.Q8_0), (T.Q8_0, T.Q4_0), (T.Q4_K, T.Q6_K)]}
CASES = [pytest.param(b.values[0], gu, d, id=f"{b.id}-{gu.name}-{d.name}", marks=b.marks)
         for b in BACKENDS for gu, d in PAIRS[b.values[0]]]
SHAPES = {"cpu": (128, 64), "cuda": (256, 256)}
FLOAT_DOWN = {T.Q4_0: q4_0.FLOAT_FAMILY}  # the pairs' float down (SPARKD_Q4_0_INT=0's family; 32-value blocks)
IDS = [3, 0, 4]  # out of table order: the kernels must follow the selection's order


def downs(backend: str) -> list[GemvConfig]:
    """Down tiles: unsplit, split 2 (ranges {0, 1}, {2}) and split 3 (an expert each)."""
    base = TILES["cpu"]["down"] if backend == "cpu" else GemvConfig()
    return [dataclasses.replace(base, split=s) for s in (1, 2, 3)]


@functools.cache
def selection(backend, gu_type, d_type):
    """The pair's selection, x, route weights and a residual, drawn once per pair from a seed of their own (the
    same data whichever test comes first), shared by the tests below."""
    D, F = SHAPES[backend]
    with torch.random.fork_rng(devices=[]):  # drawn on the host (arena_table's numpy draws are seeded off it)
        torch.manual_seed(7)
        table, *_ = arena_table(gu_type, d_type, D, F, 5, backend)
        x, w, r = torch.randn(D), torch.rand(len(IDS)), torch.randn(D)
    with mock.patch.dict(dispatch.FAMILIES, {d_type: FLOAT_DOWN[d_type]} if d_type in FLOAT_DOWN else {}):
        sel = prepare(table, backend).select(torch.tensor(IDS, device=backend))
    assert (sel.down.idot is None) == (d_type in FLOAT_DOWN)
    return sel, x.to(backend), w.to(backend), r.to(backend)


@functools.cache
def decoded(backend, gu_type, d_type, down: GemvConfig, gathered: bool = False, residual: bool = False):
    """moe_decode of the pair's selection (gathered: of its gathered offsets) at down, with the residual or
    without: one run per case under the interpreter, whichever tests ask (a case's bits do not change)."""
    sel, x, w, r = selection(backend, gu_type, d_type)
    return moe_decode(sel.gathered() if gathered else sel, x, w, down=down, gate_up=TILES[backend].get("gate_up"),
                      residual=r if residual else None)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's sigmoid of -large
@pytest.mark.parametrize("backend, gu_type, d_type", CASES)
def test_kernels_read_the_selection_as_the_gathered_offsets(backend, gu_type, d_type):
    sel = selection(backend, gu_type, d_type)[0]
    gathered = sel.gathered()
    assert gathered.ids is None and gathered.gate_off.tolist() == [sel.gate_off[i].item() for i in IDS]
    for down in downs(backend):
        got = decoded(backend, gu_type, d_type, down)
        assert torch.equal(got, decoded(backend, gu_type, d_type, down, gathered=True)), down.split


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend, gu_type, d_type", CASES)
def test_fold_in_the_down_launch_equals_the_torch_fold(backend, gu_type, d_type):
    """Bit-equal under the interpreter (torch's CPU sum of few rows is the sequential one); on
    the GPU within the float32 bound and the same bits run to run."""
    sel, x, w, _ = selection(backend, gu_type, d_type)
    for down in downs(backend)[1:]:
        got = decoded(backend, gu_type, d_type, down)
        want = decoded(backend, gu_type, d_type, dataclasses.replace(down, fold="torch"))
        if backend == "cpu":
            assert torch.equal(got, want), down.split
        else:
            assert torch.equal(got, moe_decode(sel, x, w, down=down, gate_up=TILES[backend].get("gate_up")))
            assert float((got - want).norm() / want.norm()) < 1e-6
        tiles = -(-SHAPES[backend][0] // down.block_n)
        assert not tickets(tiles, got.device)[:tiles].any()  # reset for the next launch


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend, gu_type, d_type", CASES)
def test_residual_in_the_down_launch_is_the_same_add(backend, gu_type, d_type):
    """residual + the sum, whether the launch adds it (unsplit, in-launch fold) or torch after
    it (torch fold, atomic adds): unsplit, split 2 and atomic."""
    r = selection(backend, gu_type, d_type)[3]
    one, two = downs(backend)[:2]
    cases = [one, two, dataclasses.replace(two, fold="torch")]
    if backend == "cpu":  # arrival-order adds on the GPU: two calls need not agree
        cases.append(dataclasses.replace(one, atomic=True))
    for down in cases:
        want = r + decoded(backend, gu_type, d_type, down)
        assert torch.equal(decoded(backend, gu_type, d_type, down, residual=True), want), down


def test_bad_selections_and_switches_are_refused():
    dev = "cuda" if ON_GPU else "cpu"
    table, *_ = arena_table(T.Q8_0, T.Q8_0, 256, 256, 4, dev)
    p = prepare(table, dev)
    bad = [torch.tensor([[0, 1]], device=dev), torch.tensor([0.0, 1.0], device=dev),
           torch.tensor([0, 9, 1, 9], device=dev)[::2]]
    for ids in bad:
        with pytest.raises(dispatch.KernelArgumentError, match="need expert ids int32/int64 \\[A\\] contiguous"):
            p.select(ids)
    out = torch.full((256,), float("nan"), device=dev)
    with pytest.raises(dispatch.KernelArgumentError, match="fold 'late' is not one of"):
        moe_decode(p, torch.randn(256, device=dev), torch.rand(4, device=dev), out=out,
                   down=GemvConfig(split=2, fold="late"))
    with pytest.raises(dispatch.KernelArgumentError, match="residual"):
        moe_decode(p, torch.randn(256, device=dev), torch.rand(4, device=dev), out=out,
                   residual=torch.randn(255, device=dev))
    assert torch.isnan(out).all()
    assert moe.decode_parts("all") == frozenset(moe.DECODE_PARTS) and moe.decode_parts("none") == frozenset()
    assert moe.decode_parts(" ids , fold") == {"ids", "fold"}
    with pytest.raises(ValueError, match="unknown gather .*SPARKD_MOE_DECODE"):
        moe.decode_parts("ids,gather")


@pytest.mark.skipif(ON_GPU, reason="counts the CPU dispatch of the interpreted step; the GPU box "
                                   "counts a graph replay in decode_profile.py")
def test_decode_step_is_bit_equal_with_fewer_launches(tmp_path, monkeypatch):
    """qwen3moe with Q8_0 experts through the MoE kernels, static decode step: the parts that keep
    the bits (ids, fold, residual, quant_h) on against every part off, same logits bits and per
    layer 3 index launches, the fold's sum, the residual add and h's quantization fewer; the
    router part on too, the gate's matmul gone and the logits within the step bound."""
    path = write_model(tmp_path / "m.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=3)[0]
    m = load_model(path, device="cpu", kernels=True)
    counts, logits = {}, {}
    try:
        for spec in ("none", "ids,fold,residual,quant_h", "all"):
            monkeypatch.setattr(moe, "DECODE_ON", moe.decode_parts(spec))
            first = []  # the logits of the step before the counted one (the prompt 1, 7, 42 then 5)
            counts[spec] = load_bench_script("gpu_box/launch_count.py").static_step_counts(m.net, "all", True, first)
            logits[spec] = first[0]
        n_layer = len(m.net.blocks)
    finally:
        m.close()
    assert torch.equal(logits["ids,fold,residual,quant_h"], logits["none"])
    assert float((logits["all"] - logits["none"]).norm() / logits["none"].norm()) < 5e-6
    none, kept, every = (counts[s]["ops"] for s in ("none", "ids,fold,residual,quant_h", "all"))
    assert none["triton:_idown_kernel"] == kept["triton:_idown_kernel"] == n_layer  # the kernels ran
    for op, fewer in (("index", 3 * n_layer), ("sum", n_layer), ("add", n_layer), ("triton:_quant_kernel", n_layer)):
        assert none.get(op, 0) - kept.get(op, 0) == fewer, op
    assert counts["none"]["total"] - counts["ids,fold,residual,quant_h"]["total"] == 6 * n_layer
    assert kept["mm"] - every.get("mm", 0) == n_layer  # the router gates' matmuls
    assert every["triton:_gate_topk"] == n_layer and "triton:_router_topk" not in every
    assert counts["ids,fold,residual,quant_h"]["total"] - counts["all"]["total"] == n_layer


# (E, D, top_k, gating, norm_w, scale, bias): row tails (E not a multiple of 4), column tails and
# splits (D over tiles of 32 columns), every gating
GATES = [(37, 100, 4, "softmax", True, 0.0, False), (8, 64, 2, "sigmoid", False, 2.5, True),
         (20, 300, 16, "sqrt_softplus", True, 1.5, False), (7, 32, 7, "softmax_weight", False, 0.0, False)]


@pytest.mark.parametrize("E, D, top_k, gating, norm_w, scale, bias", GATES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_router_gate_gemv_in_the_topk_launch(backend, E, D, top_k, gating, norm_w, scale, bias):
    """gate_topk against Router's torch code (matmul, then the selection): the same experts, the
    weights within the router bound (the logits are summed in another order than torch's), the
    same bits on every run, and the ticket back at zero."""
    from sparkd.engine.kernels.router_topk import gate_topk
    from sparkd.engine.layers.linear import Linear

    # logits of std 4, as test_fused_kernels' router test: far below 0 the sqrt-softplus weights
    # are tiny, and ties of (nearly) 0 may come in either order
    weight, x = torch.randn(E, D) * (4 / D ** 0.5), torch.randn(1, D)
    sel_bias = torch.rand(E) if bias else None
    router = moe.Router(Linear(weight), top_k, gating, norm_w, scale, sel_bias)
    before = fused.configure("none")
    try:
        want_w, want_ids = router(x)
    finally:
        fused.configure(before)
    runs = [gate_topk(weight.to(backend), x.to(backend), top_k, gating, norm_w, scale, 6.103515625e-5,
                      None if sel_bias is None else sel_bias.to(backend), cols=32) for _ in range(2)]
    (got_w, got_ids), (again_w, again_ids) = runs
    assert torch.equal(got_w, again_w) and torch.equal(got_ids, again_ids)
    assert torch.equal(got_ids.cpu(), want_ids)
    # a weight's relative error is about its logit's absolute one: D products of |w x| ~ 0.3 summed
    # in another order than torch's (1.9e-6 on the H200 at D=100 for some data, session 6)
    assert float((got_w.cpu() - want_w).norm() / want_w.norm()) < 1e-5
    assert not tickets(1, got_w.device)[0]


def test_router_gate_gemv_refuses_bad_arguments():
    """A gate that is not float32 [E, D], x that is not [1, D], or a selection router_topk cannot
    make: the clear error, and no launch (the ticket stays zero)."""
    from sparkd.engine.kernels.router_topk import gate_topk

    weight, x = torch.randn(16, 64), torch.randn(1, 64)
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the router gate GEMV: .*float16 \[16, 64\]"):
        gate_topk(weight.half(), x, 2, "softmax", True, 0.0, 6e-5)
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run the router gate GEMV: .* x .* \[2, 64\]"):
        gate_topk(weight, torch.randn(2, 64), 2, "softmax", True, 0.0, 6e-5)
    with pytest.raises(dispatch.KernelArgumentError, match=r"could not run router_topk on 16 experts, top_k 17"):
        gate_topk(weight, x, 17, "softmax", True, 0.0, 6e-5)
    assert not tickets(1, x.device)[0]


def test_a_moe_with_shared_experts_refuses_the_residual():
    """Block hands the residual only to a MoE that takes it; handed one anyway, a MoE with shared
    experts says so before routing anything."""
    from sparkd.engine.layers.ffn import GatedFFN
    from sparkd.engine.layers.linear import Linear

    shared = GatedFFN(Linear(torch.randn(8, 16)), Linear(torch.randn(8, 16)), Linear(torch.randn(16, 8)), "silu")
    layer = moe.MoE(3, moe.Router(Linear(torch.randn(4, 16)), 2), store=None, shared=shared)
    assert not layer.takes_residual
    with pytest.raises(ValueError, match="could not add the residual inside MoE layer 3: it has shared experts"):
        layer(torch.randn(1, 16), residual=torch.randn(1, 16))


@pytest.mark.skipif(ON_GPU, reason="the interpreter variant; the GPU box runs the step tests")
def test_router_takes_the_gate_kernel_only_where_it_fits(monkeypatch):
    """One float32 token with the switches on: gate_topk (one launch); several tokens, the
    "router" part off, or a rounded gate: the matmul, then router_topk."""
    from sparkd.engine.layers.linear import Linear

    launched = []
    import sparkd.engine.kernels.router_topk as rt
    for name in ("gate_topk", "router_topk"):
        real = getattr(rt, name)
        monkeypatch.setattr(rt, name, lambda *a, _real=real, _name=name, **k: launched.append(_name) or _real(*a, **k))
    before = fused.configure("all", on_cpu=True)
    try:
        router = moe.Router(Linear(torch.randn(16, 64)), 2)
        router(torch.randn(1, 64))
        router(torch.randn(3, 64))
        monkeypatch.setattr(moe, "DECODE_ON", moe.decode_parts("ids,fold,residual,quant_h"))
        router(torch.randn(1, 64))
        monkeypatch.setattr(moe, "DECODE_ON", moe.decode_parts("all"))
        moe.Router(Linear(torch.randn(16, 64), act_fmt="q8_0"), 2)(torch.randn(1, 64))
    finally:
        fused.configure(before)
    assert launched == ["gate_topk", "router_topk", "router_topk", "router_topk"]


def test_last_program_paths_compile_for_the_gpu_with_one_atomic():
    """The interpreter runs no PTX: compile the down folds (with and without the residual, and the
    large-shape down tile), the late h quantization and the router's gate GEMV for sm_90 offline
    (moe_compile.py), and Q8_0's down with the loads ahead, with fold_part's ticket and with fold_pair's exchange;
    the ticket (the exchange) is each kernel's one atomic (the sums are plain loads and adds)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "moe_compile.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    gguf_types = [q for q in DECODE_TILES if q in T.__members__]  # not the load-time Q4_K_TILED gate/up tile
    # 3 downs and the gate/up a type, Q8_0's down ahead (two folds), the router
    assert out.stdout.split().count("atomics=1") == 4 * len(gguf_types) + 3, out.stdout
