"""The MoE decode's tiles by shape (moe_tiles.decode_tiles): DECODE_TILES, and from each WIDTH_TIERS
model width another gate/up or down tile; OLD_DECODE_TILES (session 4's) and
session 5's tiles with the old kernels stay selectable, per call or by $SPARKD_MOE_TILES=old|s5.
Session 6's kernels (moe_tiles.Kernels): Q8_0 weights as 32-bit words (q8_0_words) where every row
starts on 4 bytes, gate and up in one loop: the same integer sums per block; the pair loop and
words without the elementwise tile the same bits, words with it float32 rounding apart.

A tile changes which programs hold which rows and where the float sums of each block's integer
dp4a sum are added, never those integer sums: new and old tiles agree to float32 rounding, each
launch alone (float h from gate/up; the same quantized h into down), and the engine's call (h
quantized in the gate/up launch) gives the same bits run to run. Interpreter where there is no
GPU, compiled with the marker gpu.
"""

import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from bench_script import BENCH  # noqa: E402
from test_kernels import BACKENDS, BOUNDS, arena_table, moe_error, rel_err  # noqa: E402

from sparkd.engine.kernels import act_quant, moe, moe_tiles  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig  # noqa: E402

TYPES = [T.Q8_0, T.Q4_K]


def table_at(qtype: T, dim: int) -> moe.PreparedTable:
    """A one-expert table of model width dim on the CPU (the rule reads types and shape only)."""
    width = 32 if qtype == T.Q8_0 else 256
    return moe.prepare(arena_table(qtype, qtype, dim, width, 1, "cpu")[0], "cpu")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decode_tiles_follow_the_model_width(qtype):
    name = qtype.name
    gate_up, down = moe_tiles.DECODE_TILES[name]
    assert moe_tiles.decode_tiles(table_at(qtype, 2048)) == (gate_up, down)  # Qwen3-30B-A3B
    for width, tier_gate_up, tier_down in moe_tiles.WIDTH_TIERS[name]:
        below = moe_tiles.decode_tiles(table_at(qtype, width - 256))
        gate_up, down = tier_gate_up or gate_up, tier_down or down
        assert moe_tiles.decode_tiles(table_at(qtype, width)) == (gate_up, down) != below  # the tier starts there
    assert moe_tiles.decode_tiles(table_at(qtype, 7168), "old") == moe_tiles.OLD_DECODE_TILES[name]
    assert moe_tiles.decode_tiles(table_at(qtype, 2048), "s5") == moe_tiles.S5_DECODE_TILES[name]
    assert moe_tiles.decode_tiles(table_at(qtype, 7168), "s5")[1] == moe_tiles.S5_LARGE_DOWN_TILES[name][1]
    assert moe_tiles.decode_tiles(table_at(qtype, 7168)) != moe_tiles.decode_tiles(table_at(qtype, 7168), "s5")
    assert moe_tiles.decode_kernels("new") == moe_tiles.Kernels(words=True, pair=True)
    # (session 19's pipe, session 20's down ahead and session 21's pairx steps, pair fold and pairx down by width:
    # "new" only)
    assert moe_tiles.decode_kernels("s8") == moe_tiles.Kernels(pipe=0, down_ahead=False, pairx_gate_up="loop",
                                                              down_pair_fold=False, pairx_down_ahead=False, down_early=False)
    assert moe_tiles.decode_kernels("old") == moe_tiles.decode_kernels("s5") == moe_tiles.OLD_KERNELS


@pytest.mark.parametrize("qtype,fewer,same", [(T.Q8_0, (4096, 7168), (2048,)), (T.Q4_K, (2048,), (4096, 7168))],
                         ids=["Q8_0", "Q4_K"])
def test_fewer_down_ranges_switch_back_to_s8(qtype, fewer, same):
    """Session 8 (fold19): fewer down ranges where they were faster on the H200; "s8" (and "s7", of the
    same tiles) keeps the ranges of before; the gate/up tiles and the other widths unchanged."""
    for dim in fewer + same:
        new, s8 = moe_tiles.decode_tiles(table_at(qtype, dim)), moe_tiles.decode_tiles(table_at(qtype, dim), "s8")
        s14 = moe_tiles.decode_tiles(table_at(qtype, dim), "s14")  # (the gate/up as s8's: session 15's tier apart)
        assert new[1] == s14[1] and s14[0] == s8[0]
        assert new[1].split < s8[1].split if dim in fewer else new[1] == s8[1]
        assert moe_tiles.decode_tiles(table_at(qtype, dim), "s7") == s8


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_q8_0_gate_up_in_4_group_steps_from_width_4096_switches_back_to_s14(qtype):
    """Session 15 (moe26): the Q8_0 gate/up from model width 4096 up to the 6144 tier in 4-group steps
    (Q8_0_GATE_UP_4096); "s14" keeps the tiles of before; every other width, type and the downs unchanged."""
    for dim in (4096 - 256, 4096, 6144):  # below the tier, at it, at the next
        new, s14 = (moe_tiles.decode_tiles(table_at(qtype, dim), w) for w in ("new", "s14"))
        changed = qtype == T.Q8_0 and 4096 <= dim < 6144
        assert new[1] == s14[1] and (new[0] == moe_tiles.Q8_0_GATE_UP_4096 != s14[0] if changed else new[0] == s14[0])
    assert moe_tiles.decode_kernels("s14") == dataclasses.replace(moe_tiles.decode_kernels("new"), pipe=0,
                                                                  down_ahead=False, pairx_gate_up="loop",
                                                                  down_pair_fold=False, pairx_down_ahead=False, down_early=False)


# GPU only: the interpreter's smallest case (one 32-row expert, 16 programs, 1024 wide) took 8-15 s here, and its
# numpy sums cannot contract differently at another unroll anyway; the tier's rule is tested on the CPU above
@pytest.mark.gpu
def test_q8_0_gate_up_in_4_group_steps_gives_the_2_group_bits():
    """Session 15 (moe26): the gate/up's groups in steps of 4 (the 4096 tier) add the same groups in the same order
    onto the same elementwise tile as steps of 2 (s14): h quantized in the launch, the same bits, and the layer's y
    at the shape's default tiles against s14's."""
    backend, (dim, width, n) = "cuda", (4096, 1536, 8)
    p = moe.prepare(arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)[0], backend)
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    tiles = [dataclasses.replace(t, fuse_quant=True) for t in (moe_tiles.Q8_0_GATE_UP_4096,
                                                               moe_tiles.DECODE_TILES["Q8_0"][0])]  # s14's at 4096
    assert tiles[0].unroll == 2 * tiles[1].unroll and moe_tiles.S14_WIDTH_TIERS["Q8_0"][0][1] is None
    hs = [moe._gate_up(p, x, w, False, "silu", t, None, "test", None, moe_tiles.Kernels()) for t in tiles]
    assert torch.equal(hs[0].words, hs[1].words) and torch.equal(hs[0].scales, hs[1].scales)  # (Q8_0: no sums)
    ys = [moe.moe_decode(p, x, w, gate_up=dataclasses.replace(t[0], fuse_quant=True), down=t[1])
          for t in (moe_tiles.decode_tiles(p, which) for which in ("new", "s14"))]
    assert moe_tiles.decode_tiles(p)[0] == moe_tiles.Q8_0_GATE_UP_4096 and torch.equal(ys[0], ys[1])


def test_an_unknown_tile_set_is_refused():
    with pytest.raises(moe.dispatch.KernelArgumentError, match=r"could not pick the MoE decode tiles: 's4'"):
        moe_tiles.decode_tiles(table_at(T.Q8_0, 2048), "s4")


@pytest.mark.parametrize("which", ["old", "s5"])
def test_the_environment_switches_back_to_the_old_tiles(monkeypatch, which):
    """TILES ($SPARKD_MOE_TILES, read at import: tests/engine/test_switches.py) is decode_tiles'
    and decode_kernels' default."""
    monkeypatch.setattr(moe_tiles, "TILES", which)
    assert moe_tiles.decode_tiles(table_at(T.Q4_K, 7168)) == moe_tiles.decode_tiles(table_at(T.Q4_K, 7168), which)
    assert moe_tiles.decode_kernels() == moe_tiles.OLD_KERNELS


def test_the_down_launches_after_the_gate_up_loop_below_width_4096(monkeypatch):
    """Session 13 (moe23): $SPARKD_MOE_DOWN_LAUNCH (DOWN_LAUNCH, read at import: test_switches.py) "auto" lets the
    down launch after the gate/up's loop below model width LOOP_LAUNCH_BELOW, at its start from there; "start"
    and "loop" everywhere; Kernels.down_at_start None follows it, True / False override it."""
    below, at = moe_tiles.LOOP_LAUNCH_BELOW - 256, moe_tiles.LOOP_LAUNCH_BELOW
    assert moe_tiles.DOWN_LAUNCH == "auto" and moe_tiles.decode_kernels().down_at_start is None
    assert [moe_tiles.down_launch_at_start(d) for d in (2048, below, at, 7168)] == [False, False, True, True]
    assert all(moe_tiles.down_launch_at_start(d, "start") and not moe_tiles.down_launch_at_start(d, "loop")
               for d in (2048, 7168))
    monkeypatch.setattr(moe_tiles, "DOWN_LAUNCH", "start")
    assert moe_tiles.down_launch_at_start(2048)
    with pytest.raises(moe.dispatch.KernelArgumentError, match=r"where the MoE down launches: 'late'"):
        moe_tiles.down_launch_at_start(2048, "late")


def test_the_offline_compile_bench_builds_the_engine_kernels():
    """bench/moe_kernels_sass.py compiles the MoE decode kernels for sm_90 with every constexpr the launches
    pass (a constexpr the engine added and the bench left out broke it once: TILED, DOWN_AT_START); its rows
    count the integer dots of the largest loop, which the kernels cannot lack; --twins (moe25) each tile's
    load-only twin too (bench/moe_twin.py), a loop with no integer dot."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), str(BENCH), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(BENCH / "moe_kernels_sass.py"), "--type", "Q8_0", "--gate-up", "2/1/2/e",
                          "--down", "2/1/1/e/2", "--twins"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^Q8_0 (gate/up~?|down~?) +\S+ +(\d+) registers, .*loop (\d+) warp-instr(.*)$", out.stdout, re.M)
    assert [r[0] for r in rows] == ["gate/up", "gate/up~", "down", "down~"], out.stdout
    assert all(int(r[1]) > 0 and int(r[2]) > 0 and ("IDP=" in r[3]) != r[0].endswith("~") for r in rows), out.stdout


def test_the_offline_compile_bench_reads_a_loops_scoreboards():
    """bench/moe_kernels_sass.py's scoreboards (pipe48): a load counts as waited in its iteration where a wait on its
    write scoreboard comes by the last dp4a, else as in flight over the back edge, over the dp4a up to that wait."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), str(BENCH), env.get("PYTHONPATH", "")])
    body = ["--:-:2:Y:1\tLDG.E.128 R4, desc[UR4][R2.64] ;",  # SB2, waited by the first dp4a (mask 4)
            "--:-:3:Y:1\tLDG.E R8, desc[UR4][R6.64] ;",  # SB3, waited by the last dp4a (mask 8)
            "04:-:-:Y:1\tIDP.4A.S8.S8 R10, R4, R11, R10 ;",
            "--:-:-:Y:1\tIDP.4A.S8.S8 R12, R4, R13, R12 ;",
            "--:-:4:Y:1\tLDG.E R14, desc[UR4][R6.64] ;",  # SB4, waited at the back edge (mask 16)
            "08:-:-:Y:1\tIDP.4A.S8.S8 R10, R8, R11, R10 ;",
            "--:-:5:Y:1\tLDG.E.STRONG.GPU R16, desc[UR4][R6.64] ;",  # a ticket's: not counted
            "16:-:-:Y:1\tBRA `(.L_x_1) ;"]
    code = f"import moe_kernels_sass as m\nprint(m.scoreboards({body!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("loads waited in the iteration 2 (1 128-bit), in flight over the back edge 1 "
                                  "(0 128-bit) over 1.0 of the loop's 3 IDP each (min 1)"), out.stdout


def test_the_floor_bench_copies_its_bytes():
    """bench/moe_tiles_bench.py --floor (moe39) times Triton copies beside torch's: its copy kernel (interpreter, in a
    process of its own: the bench's imports patch the fold for timing) copies every word, a short last block too."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), str(BENCH), env.get("PYTHONPATH", "")])
    code = ("import torch, moe_tiles_bench as b\n"
            "src = torch.randint(0, 1 << 30, (b.COPY_BLOCK + 77,), dtype=torch.int32); dst = torch.zeros_like(src)\n"
            "b.triton_copy(src, dst); print(torch.equal(src, dst))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1:] == ["True"], out.stderr[-2000:]


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
    new = moe_tiles.decode_tiles(table_at(qtype, 7168))  # the widest models' tiles
    old = moe_tiles.OLD_DECODE_TILES[qtype.name]
    k_new, k_old = moe_tiles.decode_kernels("new"), moe_tiles.OLD_KERNELS
    h_new, h_old = (moe._gate_up(p, x, w, False, "silu", t[0], None, "test", None, k)
                    for t, k in ((new, k_new), (old, k_old)))
    assert rel_err(h_new, h_old.cpu().double()) < 1e-6
    q = act_quant.quantize(h_old, p.down.act_fmt)  # one h into both downs
    y_new, y_old = torch.empty(dim, device=backend), torch.empty(dim, device=backend)
    moe._down(p, q, w, y_new, new[1], None, None, k_new)
    moe._down(p, q, w, y_old, old[1], None, None, k_old)
    assert rel_err(y_new, y_old.cpu().double()) < 1e-6
    # the engine's call: h quantized in the gate/up launch; the same bits twice, near the reference
    tiles = dict(gate_up=dataclasses.replace(new[0], fuse_quant=True), down=new[1], kernels=k_new)
    ys = [moe.moe_decode(p, x, w, **tiles) for _ in range(2)]
    assert torch.equal(ys[0], ys[1])
    if backend == "cuda":  # session 13 (moe23): the down let launch at the gate/up's start or after its loop (PDL)
        for at_start in (True, False):
            k = dataclasses.replace(k_new, down_at_start=at_start)
            assert torch.equal(moe.moe_decode(p, x, w, **(tiles | {"kernels": k})), ys[0]), at_start
    err = moe_error(ys[0], p, x, w, gates, ups, downs, "silu", qtype, qtype, tiles["gate_up"], k_new)
    assert err < BOUNDS["fp32"]



def shifted(table: moe.ExpertTable, by: int) -> moe.ExpertTable:
    """The table's experts moved by `by` bytes in a copy of its arena (rows no longer on 4 bytes)."""
    arena = torch.cat([torch.zeros(by, dtype=torch.uint8, device=table.gate.device), table.gate])
    offs = [[o + by for o in t] for t in (table.gate_offsets, table.up_offsets, table.down_offsets)]
    return dataclasses.replace(table, gate=arena, up=arena, down=arena, gate_offsets=offs[0], up_offsets=offs[1],
                               down_offsets=offs[2])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_0_words_and_the_pair_loop_give_the_old_kernels_sums(backend):
    # rows of 192 values (a partial group: 3 of 4 block pairs) into 64-wide experts (down: K=64)
    dim, width, n = (192, 64, 2) if backend == "cpu" else (2048 + 192, 768, 8)
    table, gates, ups, downs = arena_table(T.Q8_0, T.Q8_0, dim, width, n, backend)
    p = moe.prepare(table, backend)
    assert p.gate_up_words and p.down_words
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows = 32 if backend == "cpu" else 2  # the interpreter runs programs one by one
    for ew in (False, True):
        gu = GemvConfig(block_n=rows, num_warps=1, unroll=2, elementwise=ew)
        old = moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, moe_tiles.OLD_KERNELS)
        for k in (moe_tiles.Kernels(words=True, pair=False), moe_tiles.Kernels(words=False, pair=True), moe_tiles.Kernels()):
            h = moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, k)
            if ew and k.words:  # integer sums equal, float order per lane differs
                assert rel_err(h, old.cpu().double()) < 1e-6, k
            else:
                assert torch.equal(h, old), k
        q = act_quant.quantize(old, p.down.act_fmt)
        dn = GemvConfig(block_n=rows, num_warps=1, unroll=2, elementwise=ew, split=2)
        ys = [torch.empty(dim, device=backend) for _ in range(2)]
        for y, k in zip(ys, (moe_tiles.OLD_KERNELS, moe_tiles.Kernels())):
            moe._down(p, q, w, y, dn, None, None, k)
        assert (rel_err(ys[1], ys[0].cpu().double()) < 1e-6) if ew else torch.equal(ys[1], ys[0])
    tiles = dict(gate_up=GemvConfig(block_n=rows, fuse_quant=True), down=GemvConfig(block_n=rows, split=2))
    # rows 2 bytes off 4 too: the old 16-bit loads, the same sums
    p2 = moe.prepare(shifted(table, 2), backend)
    assert not (p2.gate_up_words or p2.down_words)
    for pp in (p, p2):
        y = moe.moe_decode(pp, x, w, kernels=moe_tiles.Kernels(), **tiles)
        err = moe_error(y, pp, x, w, gates, ups, downs, "silu", T.Q8_0, T.Q8_0, tiles["gate_up"], moe_tiles.Kernels())
        assert err < BOUNDS["fp32"]


def on_16_bytes(table: moe.ExpertTable) -> moe.ExpertTable:
    """The table's experts copied into a new arena at offsets that are multiples of 16 bytes
    (arena_table places them on 4 only)."""
    gu = table.width * moe.dispatch.FAMILIES[table.gate_up_type].row_bytes(table.dim)
    d = table.dim * moe.dispatch.FAMILIES[table.down_type].row_bytes(table.width)
    parts = [(o, gu) for o in table.gate_offsets] + [(o, gu) for o in table.up_offsets] + \
        [(o, d) for o in table.down_offsets]
    at, offs, chunks = 0, [], []
    for o, nbytes in parts:
        offs.append(at)
        chunks.append(table.gate[o:o + nbytes])
        pad = -nbytes % 16 + 16
        chunks.append(torch.zeros(pad, dtype=torch.uint8, device=table.gate.device))
        at += nbytes + pad
    arena = torch.cat(chunks)
    n = len(table)
    return dataclasses.replace(table, gate=arena, up=arena, down=arena, gate_offsets=offs[:n],
                               up_offsets=offs[n:2 * n], down_offsets=offs[2 * n:])


VEC_CASES = [pytest.param("cpu", id="interpret", marks=BACKENDS[0].marks),
             pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("backend", VEC_CASES)
def test_q4_k_headers_as_vectors_give_the_same_bits(backend):
    """Kernels.q4k_vec (the 16-byte header in one load where rows start on 16 bytes): the
    elementwise tiles' bits unchanged, gate/up and down; rows 4 bytes off 16: the old step."""
    dim, width, n = (256, 256, 1) if backend == "cpu" else (2048, 768, 8)
    table = on_16_bytes(arena_table(T.Q4_K, T.Q4_K, dim, width, n, backend)[0])
    p = moe.prepare(table, backend)
    assert p.gate_up_vec and p.down_vec and not moe.prepare(shifted(table, 4), backend).gate_up_vec
    x, w = torch.randn(dim, device=backend), torch.rand(n, device=backend)
    rows = 64 if backend == "cpu" else 4  # the interpreter runs programs one by one
    gu = GemvConfig(block_n=rows, num_warps=1, unroll=1, elementwise=True)
    hs = [moe._gate_up(p, x, w, False, "silu", gu, None, "test", None, k) for k in (moe_tiles.S6_KERNELS, moe_tiles.Kernels())]
    assert torch.equal(hs[1], hs[0])
    q = act_quant.quantize(hs[0], p.down.act_fmt)
    dn = GemvConfig(block_n=rows, num_warps=1, unroll=2, elementwise=True, split=2)
    ys = [torch.empty(dim, device=backend) for _ in range(2)]
    for y, k in zip(ys, (moe_tiles.S6_KERNELS, moe_tiles.Kernels())):
        moe._down(p, q, w, y, dn, None, None, k)
    assert torch.equal(ys[1], ys[0])
    # 2-row tiles take it too since session 8 (row_tiles.row_sums; the H200 had given wrong sums there):
    # on the GPU within a float32 rounding of q4_k's step (the interpreter: test_gemv_split.py's 2-row bits)
    if backend == "cuda":
        two = dataclasses.replace(gu, block_n=2)
        h2 = [moe._gate_up(p, x, w, False, "silu", two, None, "test", None, k)
              for k in (moe_tiles.S6_KERNELS, moe_tiles.Kernels())]
        assert torch.allclose(h2[1], h2[0], rtol=1e-5, atol=1e-6)
    assert moe._use_vec(True, True) and not moe._use_vec(True, False) and not moe._use_vec(False, True)
