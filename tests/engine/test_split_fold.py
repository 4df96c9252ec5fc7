"""Split-K folded inside the GEMV launch (matmul.fold_part): the last program of a row tile adds
the ranges' partial sums in order, so y is the ordered sum of the ranges, the same bits as the
torch.sum fold it replaces (for up to 4 ranges, where torch.sum adds in order too), and the
tickets are left zero for the next call.

Interpreter (TRITON_INTERPRET=1) where there is no GPU: programs run one by one, in order, so the
check there is the order of the sum and the tickets' reset; on the GPU (marker gpu via BACKENDS)
programs really race.
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

from test_kernel_determinism import row_range  # noqa: E402
from test_kernels import BACKENDS, random_blocks  # noqa: E402

from sparkd.engine.kernels import dispatch, matmul  # noqa: E402
from sparkd.engine.kernels.matmul import GemvConfig, gemv  # noqa: E402

ROWS, GROUPS = 19, 8  # 19 rows: the second tile of 16 is partly masked
TILE = GemvConfig(block_n=16, num_warps=1, unroll=1)


def ordered_parts(raw, qtype, x, split, backend):
    """The ranges' sums, each the unsplit GEMV of its columns, added in order from 0.0."""
    cols, per = x.numel(), 256 * -(-GROUPS // split)
    total = torch.zeros(ROWS)
    for k in range(0, cols, per):
        part = row_range(raw, qtype, ROWS, cols, k, min(k + per, cols))
        xs = x[k:k + per].contiguous()
        total = total + gemv(part.to(backend), qtype, (ROWS, xs.numel()), xs.to(backend),
                             config=dataclasses.replace(TILE, split=1)).cpu()
    return total


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q6_K], ids=lambda t: t.name)  # integer and float kernels
@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_fold_is_the_ordered_sum_for_every_split(backend, qtype):
    cols = GROUPS * 256
    raw = random_blocks(qtype, ROWS * cols // dispatch.FAMILIES[qtype].block_values)
    x = torch.randn(cols)
    for split in range(1, 9):
        cfg = dataclasses.replace(TILE, split=split)
        got = gemv(raw.to(backend), qtype, (ROWS, cols), x.to(backend), config=cfg).cpu()
        assert torch.equal(got, ordered_parts(raw, qtype, x, split, backend)), split
        if split <= 4:  # torch.sum adds up to 4 rows in order: the old fold's bits
            old = gemv(raw.to(backend), qtype, (ROWS, cols), x.to(backend),
                       config=dataclasses.replace(cfg, fold="torch")).cpu()
            assert torch.equal(got, old), split


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_calls_reset_their_tickets(backend):
    """Calls of several shapes one after another: each leaves every ticket zero and gives the bits
    of the first call of its shape."""
    qtype, cols = T.Q8_0, GROUPS * 256
    shapes = [(ROWS, 3), (5, 2), (ROWS, 3), (33, 4), (5, 2)]
    raw = random_blocks(qtype, 33 * cols // 32)
    x = torch.randn(cols, device=backend)
    first = {}
    for rows, split in shapes:
        w = raw[:rows * dispatch.FAMILIES[qtype].row_bytes(cols)].to(backend)
        y = gemv(w, qtype, (rows, cols), x, config=dataclasses.replace(TILE, split=split))
        assert int(matmul.tickets(1, x.device).count_nonzero()) == 0
        assert torch.equal(first.setdefault((rows, split), y), y)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q6_K], ids=lambda t: t.name)
def test_unknown_fold_is_a_clear_error_before_any_launch(qtype):
    x = torch.randn(512, device="cuda" if ON_GPU else "cpu")
    raw = random_blocks(qtype, 4 * 512 // dispatch.FAMILIES[qtype].block_values).to(x.device)
    out = torch.full((4,), float("nan"), device=x.device)
    with pytest.raises(dispatch.KernelArgumentError, match="could not run the GEMV: fold 'atomics'"):
        gemv(raw, qtype, (4, 512), x, out=out, config=GemvConfig(split=2, fold="atomics"))
    assert bool(out.isnan().all())  # nothing written


def test_fold_compiles_for_the_gpu_with_one_atomic():
    """The interpreter runs no PTX: compile the split GEMVs for sm_90 offline (fold_compile.py);
    the ticket is the kernels' one atomic (the sums are plain loads and adds)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "fold_compile.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines.count("atomics=1") == 3, out.stdout
