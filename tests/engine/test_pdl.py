"""Programmatic dependent launch (kernels/pdl.py): its modes, its rule (the wait before a PDL
kernel reads, writes or ends) in the kernels' sources and in their sm_90 PTX compiled offline, and
on the GPU box (marker gpu) the decode step's bits with PDL off and on, eager and graph-replayed."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from sparkd.engine import switches  # noqa: E402
from sparkd.engine.kernels import pdl  # noqa: E402

KERNELS_DIR = Path(pdl.__file__).parent
# the Triton kernels the decode step launches, each of which takes PDL (a new one belongs here)
DECODE_KERNELS = {"_igemv_kernel", "_kgemv_kernel", "_gemv_kernel", "_igate_up_kernel", "_idown_kernel",
                  "_gate_up_kernel", "_down_kernel", "_rms_norm_rows", "_rope_kv", "_decode_attention", "_router_topk", "_gate_topk",
                  "_rope_attention", "_grouped_attention", "_grouped_attention_fold",
                  "_quant_kernel", "gate_up_kernel"}  # moe_pipe.gate_up_kernel (session 19)


# the only calls a kernel may make before pdl.start(PDL): its weights' L2 prefetch (pdl.prefetch_l2), no load
BEFORE_START = {"prefetch_tile"}


def _is_start(stmt: ast.stmt) -> bool:  # (a second argument: where its dependents launch, pdl.start's DEPENDENTS)
    # (session 48: the MoE down's EARLY defers its wait to down_sums, pdl.py's exception; test_the_early_down_...)
    return ast.unparse(stmt) in ("pdl.start(PDL)", "pdl.start(PDL and (not EARLY))") or \
        ast.unparse(stmt).startswith("pdl.start(PDL, ")


def _before_start(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and ast.unparse(stmt.value.func) in BEFORE_START)


def _sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(KERNELS_DIR.glob("*.py"))}


def test_pdl_kernels_start_with_the_wait_and_launch_with_their_keywords():
    """Every kernel with a PDL argument calls pdl.start(PDL) first (after its docstring and the weight
    prefetch of BEFORE_START, test_only_the_weight_prefetch_goes_before_the_wait): before any load, store
    or return. Every launch with pdl.launch's keywords is of such a kernel, and each such kernel is
    launched so. Only pdl.py calls the griddepcontrol functions itself."""
    takes, starts, launched = set(), set(), set()
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and "PDL" in [a.arg for a in node.args.args]:
                takes.add(node.name)
                body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                    node.body[0].value, ast.Constant) else node.body
                while body and _before_start(body[0]):
                    body = body[1:]
                if _is_start(body[0]) and not any(_is_start(s) for s in body[1:]):
                    starts.add(node.name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and any(
                    k.arg is None and ast.unparse(k.value).startswith("pdl.launch(") for k in node.keywords):
                launched.add(ast.unparse(node.func.value).split(".")[-1])  # (moe_pipe.gate_up_kernel)
        if name != "pdl.py":
            assert "gdc_" not in (KERNELS_DIR / name).read_text(), f"{name} calls griddepcontrol outside pdl.start"
    assert takes - {"start", "dependents"} == DECODE_KERNELS
    assert starts == DECODE_KERNELS, f"no pdl.start(PDL) first in {sorted(DECODE_KERNELS - starts)}"
    assert launched == DECODE_KERNELS, f"launched without pdl.launch: {sorted(DECODE_KERNELS - launched)}"


def _functions(name: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(_sources()[name]) if isinstance(n, ast.FunctionDef)}


def test_only_the_weight_prefetch_goes_before_the_wait():
    """BEFORE_START's functions (matmul.prefetch_tile) compute addresses and call pdl.prefetch_l2 and
    nothing else that touches memory; prefetch_l2's inline PTX is L2 prefetches and register moves only
    (no ld/st: no byte an earlier kernel wrote reaches a register, no write)."""
    funcs = _functions("matmul.py")
    for name in BEFORE_START:
        calls = {ast.unparse(c.func) for c in ast.walk(funcs[name]) if isinstance(c, ast.Call)}
        assert "pdl.prefetch_l2" in calls
        assert all(c in {"tl.program_id", "tl.minimum", "tl.cdiv", "pdl.prefetch_l2"} or c.endswith(".to")
                   for c in calls), calls
    prefetch = _functions("pdl.py")["prefetch_l2"]
    asm = [c.args[0].value for c in ast.walk(prefetch) if isinstance(c, ast.Call)
           and ast.unparse(c.func) == "tl.inline_asm_elementwise"]
    assert len(asm) == 2
    calls = {ast.unparse(c.func) for c in ast.walk(prefetch) if isinstance(c, ast.Call)}
    assert not {c for c in calls if re.search(r"\b(load|store|atomic)", c)}, calls
    for text in asm:
        ops = [[t for t in op.split() if not t.startswith("@")][0] for op in text.strip("{} ").split(";") if op.strip()]
        assert all(o in (".reg", "mov.b32") or o.startswith(("setp.", "prefetch.global.L2", "cp.async.bulk.prefetch.L2"))
                   for o in ops), ops


def test_the_early_down_reads_only_the_selection_and_weights_before_its_wait():
    """pdl.py's exception (session 48): the MoE down that defers its wait (EARLY) waits in q4_k_pair.down_sums, after
    only its experts' offsets (the selection read from the L2: OFF's last argument WAIT) and its first step's weight
    words; the gate/up of DOWN_EARLY lets its dependents launch only after its own wait."""
    down = _functions("moe.py")["_idown_kernel"]
    assert "EARLY" in [a.arg for a in down.args.args]
    sums = _functions("q4_k_pair.py")["down_sums"]
    waits = [i for i, s in enumerate(sums.body) if ast.unparse(s) == "pdl.start(WAIT)"]
    assert len(waits) == 1
    calls = [c for s in sums.body[:waits[0]] for c in ast.walk(s) if isinstance(c, ast.Call)]
    names = {ast.unparse(c.func) for c in calls}
    allowed = {"OFF", "_step_wloads", "tl.program_id", "tl.arange", "tl.minimum"}
    assert all(n in allowed or n.endswith(".to") for n in names), names
    assert all(ast.unparse(c.args[-1]) == "WAIT" for c in calls if ast.unparse(c.func) == "OFF")
    gate_up = [ast.unparse(s) for s in _functions("moe.py")["_igate_up_kernel"].body[1:3]]
    assert gate_up[0] == "pdl.start(PDL, DOWN_AT_START and (not DOWN_EARLY))"
    assert gate_up[1].startswith("if DOWN_AT_START and DOWN_EARLY:\n    pdl.dependents(PDL)")


def test_compiled_kernels_wait_before_any_access_or_return():
    """sm_90 PTX of the decode kernels (pdl_compile.py): PDL on, launch_dependents then the wait before
    the first global load, store or atomic and the first return (the MoE gate/up of down_at_start False: the
    wait first, launch_dependents after its loop's loads); PDL off, no griddepcontrol at all.
    The igemv rows with a weight prefetch (lines, bulk) prefetch before the wait; the others never."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).parent / "pdl_compile.py"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^(\w+) pdl=(\d) launch=(\S+) wait=(\S+) first_access=(\S+) first_ret=(\S+) prefetch=(\S+) "
                      r"first_write=(\S+)$", out.stdout, re.M)
    assert len(rows) == 34, out.stdout  # pdl_compile.KERNELS, PDL off and on
    for name, on, launch, wait, access, ret, prefetch, write in rows:
        assert (prefetch != "-") == name.startswith("igemv_"), f"{name}: prefetch {prefetch}"
        if prefetch != "-":
            assert int(prefetch) < int(access), f"{name}: {prefetch} {access}"
            assert on == "0" or int(prefetch) < int(wait), f"{name}: {prefetch} {wait}"
        if on == "0":
            assert launch == wait == "-", f"{name} without PDL has griddepcontrol"
        elif name == "idown_early":  # pdl.py's exception: reads before the wait, no write and no return
            assert "-" not in (launch, wait, access, ret, write), f"{name}: {launch} {wait} {access} {ret} {write}"
            assert int(access) < int(wait) < min(int(write), int(ret)), f"{name}: {wait} {access} {write} {ret}"
        elif name == "igate_up_early":  # its dependents let launch after its wait
            assert "-" not in (launch, wait, access, ret), f"{name}: {launch} {wait} {access} {ret}"
            assert int(wait) < min(int(launch), int(access), int(ret)), f"{name}: {launch} {wait} {access} {ret}"
        elif name.endswith("_late"):  # its dependents let launch after the loop: after the wait and the first load
            assert "-" not in (launch, wait, access, ret), f"{name}: {launch} {wait} {access} {ret}"
            assert int(wait) < min(int(access), int(ret)) and int(access) < int(launch), f"{name}: {launch} {wait} {access}"
        else:
            assert "-" not in (launch, wait, access, ret), f"{name}: {launch} {wait} {access} {ret}"
            assert int(launch) < int(wait) < min(int(access), int(ret)), f"{name}: {launch} {wait} {access} {ret}"


def test_modes(monkeypatch):
    """auto: on from compute capability 9, off below and off CUDA; on: an older GPU is an error; off:
    never. The launch keywords follow."""
    major = {"value": 9}
    monkeypatch.setattr(pdl, "_major", lambda device: major["value"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "an old GPU")
    with pdl.using("auto"):
        assert pdl.launch("cuda:0") == {"PDL": True, "launch_pdl": True}
        assert pdl.launch("cpu") == {"PDL": False}
        major["value"] = 8
        assert pdl.launch("cuda:0") == {"PDL": False}
    with pdl.using("on"), pytest.raises(switches.SwitchError, match=r"could not use SPARKD_PDL=on on an old GPU"):
        pdl.enabled("cuda:0")
    with pdl.using("off"):
        major["value"] = 10
        assert pdl.launch("cuda:0") == {"PDL": False}
    # the weight prefetch: its MODE only where the launch uses PDL (CUDA, sm_90 and later, PDL not off: no wait,
    # nothing to overlap); "small": bulk up to SMALL_BYTES of weights, none above
    for mode, want in (("off", 0), ("lines", 1), ("bulk", 2), ("small", 2)):
        with pdl.prefetching(mode), pdl.using("auto"):
            assert (pdl.prefetch_mode("cuda:0"), pdl.prefetch_mode("cpu")) == (want, 0)
            assert pdl.prefetch_mode("cuda:0", pdl.SMALL_BYTES) == want
            assert pdl.prefetch_mode("cuda:0", pdl.SMALL_BYTES + 1) == (0 if mode == "small" else want)
            major["value"] = 8
            assert pdl.prefetch_mode("cuda:0") == 0
            assert pdl.prefetch_mode("cuda:0", pdl.SMALL_BYTES + 1) == 0
            major["value"] = 10
            with pdl.using("off"):
                assert pdl.prefetch_mode("cuda:0") == 0


def test_configure_refuses_an_unknown_mode_or_prefetch():
    before = pdl.current()
    with pytest.raises(switches.SwitchError, match=r"could not configure PDL 'maybe': choose one of auto, on, off"):
        pdl.configure("maybe")
    assert pdl.current() == before
    before = pdl.current_prefetch()
    with pytest.raises(switches.SwitchError, match=r"could not configure the weight prefetch 'l3': choose one of off, "
                                                   r"lines, bulk, small \(SPARKD_PDL_PREFETCH\)"):
        pdl.configure_prefetch("l3")
    assert pdl.current_prefetch() == before


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] < pdl.MIN_MAJOR,
                    reason="needs a GPU of compute capability 9 or more")
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_decode_bits_the_same_with_and_without_pdl(tmp_path, quant):
    """Greedy tokens and every step's logits of the eager step and of the graph-replayed static step
    (captured in each mode) are the same bits with PDL off and on."""
    from test_cuda_graphs import decode

    from sparkd.engine.cuda_graphs import StaticDecode
    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY
    from sparkd.engine.models import load_model

    shape = TINY["qwen3moe"] if quant == "Q8_0" else TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
    path = write_model(tmp_path / "q.gguf", plan(shape, quant), seed=3)[0]
    m = load_model(path, device="cuda")
    got, steps = {}, []
    try:
        for mode in ("off", "on"):
            with pdl.using(mode):
                assert pdl.enabled("cuda") == (mode == "on")
                got[mode] = (decode(m.net, lambda c: lambda t: m.net(torch.tensor([t]), c), 16, 32),
                             decode(m.net, lambda c: steps.append(StaticDecode(m.net, c, True, 4)) or steps[-1],
                                    16, 32))
    finally:
        m.close()
    assert all(step._graphs and not step.failed for step in steps)  # replayed, not run eagerly after a failure
    for (off_logits, off_ids), (on_logits, on_ids) in zip(got["off"], got["on"]):
        assert on_ids == off_ids
        assert torch.equal(on_logits, off_logits)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] < pdl.MIN_MAJOR,
                    reason="needs a GPU of compute capability 9 or more")
@pytest.mark.parametrize("layout", ["Q4_K_TILED", "Q8_0_PACKED", "Q6_K_TILED"])
def test_gemv_bits_the_same_with_and_without_the_weight_prefetch(layout):
    """The resident layouts' GEMV, PDL on, each prefetch mode: the same bits as without the prefetch, at
    split-K shapes (each program prefetches a share of its tile) and at split 1 (8192x2048: Q4_K's head rule)."""
    from gguf import GGMLQuantizationType as T
    from test_kernels import random_blocks

    from sparkd.engine.kernels import dispatch, matmul, q4_k_tiled, q6_k_tiled, q8_0_packed

    raw_type, module = {"Q4_K_TILED": (T.Q4_K, q4_k_tiled), "Q8_0_PACKED": (T.Q8_0, q8_0_packed),
                        "Q6_K_TILED": (T.Q6_K, q6_k_tiled)}[layout]
    for rows, cols in ((4096, 2048), (6144, 4096), (8192, 2048)):
        fam = dispatch.FAMILIES[raw_type]
        w = module.pack(random_blocks(raw_type, rows * cols // fam.block_values).cuda(), (rows, cols))
        x = torch.randn(cols, device="cuda")
        got = {}
        for mode in pdl.PREFETCHES:
            with pdl.using("on"), pdl.prefetching(mode):
                got[mode] = matmul.gemv(w.data, module.FAMILY.qtype, (rows, cols), x)
        for mode in pdl.PREFETCHES[1:]:
            assert torch.equal(got[mode], got["off"]), (layout, rows, cols, mode)
