"""The GEMV's split-K rule at decode shapes (matmul.split_for, session 6): "wave" caps session 5's
split (ranges of RANGE_GROUPS groups below TARGET_PROGRAMS row tiles) at one wave of resident
programs; $SPARKD_GEMV_SPLIT=old runs session 5's rule. A default launch gives the bits of the same
tile at the split the rule names (the rule only picks a compile-time split), the float64 reference
within the bound, the same bits twice and in a CUDA graph. The tiled Q4_K's vector steps refuse
the tiles that gave wrong sums on the H200 (programs of part of a 4-row tile).

Interpreter (TRITON_INTERPRET=1, emulated dp4a) where there is no GPU; marker gpu for the asm.
"""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
pytest.importorskip("triton", reason="triton is not installed (pip install triton runs the interpreter)")

from test_kernels import BACKENDS, BOUNDS, act_in, random_blocks, reference, rel_err  # noqa: E402

from sparkd.engine.kernels import dispatch, matmul, pdl, q4_k_tiled, q8_0_packed  # noqa: E402
from sparkd.engine.kernels.matmul import GEMV_TILES, GemvConfig, split_for  # noqa: E402

Q4T, Q8P = GEMV_TILES["Q4_K_TILED"], GEMV_TILES["Q8_0_PACKED"]


@pytest.mark.parametrize("shape, wave, old", [
    ((4096, 14336), 4, 14),  # 1024 row tiles: 14 ranges would be 3.4 waves
    ((6144, 4096), 2, 4),
    ((14336, 4096), 1, 1),
    ((2048, 4096), 4, 4),
    ((4096, 2048), 2, 2),
    ((5120, 2048), 2, 2),
    ((151936, 2048), 1, 1)])  # the output head
def test_wave_rule_at_decode_shapes(shape, wave, old):
    """The tiled Q4_K tile on 132 SMs (DEFAULT_SMS: the H200's count); the packed Q8_0 tile keeps
    its split of 1 under both rules."""
    rows, cols = shape
    assert matmul.wave_programs(1) == 132 * 32
    assert split_for(Q4T, rows, cols // 256, rule="wave") == wave
    assert split_for(Q4T, rows, cols // 256, rule="old") == old
    assert split_for(Q8P, rows, cols // 256, rule="wave") == split_for(Q8P, rows, cols // 256, rule="old") == 1


def test_wave_split_shrinks_as_rows_grow_and_never_passes_the_old_rule():
    """What lets a stack of parts share one launch: the split only falls with the row count."""
    for groups in (8, 16, 56):
        splits = [split_for(Q4T, rows, groups, rule="wave") for rows in range(4, 40000, 4)]
        assert splits == sorted(splits, reverse=True)
        assert max(splits) == -(-groups // matmul.RANGE_GROUPS) and min(splits) == 1
        assert all(w <= split_for(Q4T, rows, groups, rule="old") for w, rows in zip(splits, range(4, 40000, 4)))
    assert split_for(GemvConfig(split=3), 1 << 20, 8) == 3  # a tile's own split wins


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(dispatch.KernelArgumentError, match="could not choose the GEMV's split: rule 'fast'"):
        split_for(Q4T, 4096, 8, rule="fast")


def test_split_env_switches_back():
    """$SPARKD_GEMV_SPLIT=old: session 5's rule (unknown values: tests/engine/test_switches.py)."""
    code = ("from sparkd.engine.kernels import matmul as m; "
            "print(m.SPLIT_RULE, m.split_for(m.GEMV_TILES['Q4_K_TILED'], 4096, 56))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TRITON_INTERPRET="1")
    for value, want in (("old", "old 14"), ("wave", "wave 4")):
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, SPARKD_GEMV_SPLIT=value),
                             capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split()


def layouts(backend: str, rows: int, cols: int):
    """(name, GGUF blocks, qtype, run(config) -> y, tile) for the packed Q8_0 and the tiled Q4_K."""
    q8 = random_blocks(T.Q8_0, rows * cols // 32).to(backend)
    q4 = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
    p8, t4 = q8_0_packed.pack(q8, (rows, cols)), q4_k_tiled.pack(q4, (rows, cols))
    return [("Q8_0P", q8, T.Q8_0, lambda x, c: q8_0_packed.gemv(p8, x, config=c), Q8P),
            ("Q4T", q4, T.Q4_K, lambda x, c: q4_k_tiled.gemv(t4, x, config=c), Q4T)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_split_is_the_rules_split(backend, monkeypatch):
    """The default launch where the wave rule lowers the old split (a small wave on the
    interpreter, the H200's own at 4096x14336): the bits of the tile at that split, the same bits
    twice, within the float bound of the float64 reference; and a CUDA graph replay on the GPU."""
    rows, cols = (4096, 14336) if backend == "cuda" else (16, 8 * 256)
    if backend != "cuda":  # 4 row tiles of 4 rows, 2 ranges of 4 groups: a wave of 4 programs allows 1
        monkeypatch.setattr(matmul, "wave_programs", lambda num_warps, device=None: 4)
    x = torch.randn(cols, device=backend)
    for name, raw, qtype, run, tile in layouts(backend, rows, cols):
        split = split_for(tile, rows, cols // 256, backend)
        assert split < split_for(tile, rows, cols // 256, rule="old") or tile.split, name  # the rule lowered it
        got = run(x, None)
        assert torch.equal(got, run(x, dataclasses.replace(tile, split=split))), name
        assert torch.equal(got, run(x, None)), name
        ref = reference(raw, qtype, (rows, cols)) @ act_in(qtype, x.cpu())
        scale = reference(raw, qtype, (rows, cols)).abs() @ act_in(qtype, x.cpu()).abs()
        assert rel_err(got, ref, scale) < BOUNDS["fp32"], name
        if backend == "cuda":
            y = torch.empty(rows, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y.copy_(run(x, None))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, got), name


@pytest.mark.parametrize("loads", ["vector", "bytes"])
def test_vector_steps_on_programs_of_part_of_a_tile(loads):
    """2-row programs on one warp, with and without split-K: wrong sums on the H200 until session 8
    (triton 3.6 summed the tile over the wrong lanes: docs/performance.md, diag12; row_tiles.row_sums
    sums it since, diag16): q4_k's own step's bits under the interpreter, within the float bound of
    it on the GPU (one-warp tiles give its bits there too: test_q4_k_tiled.same_bits_on_cuda)."""
    dev = "cuda" if ON_GPU else "cpu"
    rows, cols = 8, 3 * 256
    raw = random_blocks(T.Q4_K, rows * cols // 256).to(dev)
    x = torch.randn(cols, device=dev)
    w, scalar = q4_k_tiled.pack(raw, (rows, cols), loads=loads), q4_k_tiled.pack(raw, (rows, cols), loads="scalar")
    ref = reference(raw, T.Q4_K, (rows, cols))
    for split in (1, 2):
        cfg = GemvConfig(block_n=2, split=split)
        got = q4_k_tiled.gemv(w, x, config=cfg, loads=loads)
        if not ON_GPU:
            assert torch.equal(got, q4_k_tiled.gemv(scalar, x, config=cfg, loads="scalar"))
        assert rel_err(got, ref @ act_in(T.Q4_K, x.cpu()), ref.abs() @ act_in(T.Q4_K, x.cpu()).abs()) < BOUNDS["fp32"]

@pytest.mark.parametrize("backend", BACKENDS)
def test_warps_k_gives_the_split_k_bits(backend):
    """GemvConfig.warps_k (session 12): the tiled Q4_K's split-K ranges on the warps of one program, folded there,
    give the split-K launch's bits (its in-launch fold's order) at splits 2, 4 and 8, uneven and empty ranges
    included (9 groups in 4 ranges of 3: the last one empty), PDL on and off on the GPU; the default tile runs
    it at the wave rule's split. Interpreter: one tiny case."""
    if q4_k_tiled.LOADS != "pairx":
        pytest.skip("warps_k runs the pairx step (Family.kstep)")
    cases = ([(4096, 14336, 4), (6144, 4096, 2), (2048, 4096, 4), (4096, 2048, 8), (64, 9 * 256, 4),
              (64, 7 * 256, 8)] if backend == "cuda" else [(8, 9 * 256, 4)])
    for rows, cols, split in cases:
        raw = random_blocks(T.Q4_K, rows * cols // 256).to(backend)
        w, x = q4_k_tiled.pack(raw, (rows, cols)), torch.randn(cols, device=backend)
        launch = GemvConfig(block_n=4, num_warps=1, unroll=2, split=split)
        assert matmul.uses_kstep(dataclasses.replace(launch, warps_k=True), split, q4_k_tiled.FAMILY.kstep)
        want = q4_k_tiled.gemv(w, x, config=launch)
        for mode in ("off", "on") if backend == "cuda" else ("off",):
            with pdl.using(mode):
                got = q4_k_tiled.gemv(w, x, config=dataclasses.replace(launch, warps_k=True))
            assert torch.equal(got, want), (rows, cols, split, mode)
    assert Q4T.warps_k == matmul.WARPS_K
    assert not matmul.uses_kstep(Q4T, 3, q4_k_tiled.FAMILY.kstep)  # 3 warps: the split-K launch
    assert not matmul.uses_kstep(Q8P, 2, None)
