"""The Q8_0 MoE down with the selected experts as rows of one program's tile (session 8, moe17).

moe._idown_kernel splits the A experts into ranges run by separate programs that meet in an
ordered fold (matmul.fold_part): each program stores its partial sums, fences (MEMBAR.GPU), takes a
ticket by an atomic, and the last of a row tile reads the partials back from L2. At the decode
shapes a program of the Q8_0 down is short (one expert, 3-8 groups), so that chain of dependent
round trips is a large part of it; the load-only twins (bench/moe_twin.py) do not fold.

Here one program holds R rows for all A experts: tile row r is expert r // R, model row
program_id * R + r % R, its weights at offsets[a] and its h row a (pointer tensors [R·A, 1, 1]
that q8_0_words' step broadcasts like the scalar ones). The same step per tile row as one expert's
range in moe._idown_kernel (the same per-group tile: the same bits per row, integer sums exact),
each row's sums times its routing weight from 0.0 as a range's are, and the A products added to
y from 0.0 in expert order, as fold_part adds one-expert ranges: every other row of a
tl.where-masked sum is exactly 0.0, so each masked sum is the one product and the order is the
loop's. So the bits of moe._idown_kernel with split == A (the default: 8 ranges for top-8), no
fold, no atomic, no partials buffer. Needs A a power of two and a Q8_0 down on words
(moe.rows_fit); Kernels.down_rows turns it on, moe_tiles.ROWS_DOWN_TILES has its tiles
(block_n = R, the real rows; the split is ignored).
"""

import triton
import triton.language as tl

from sparkd.engine.kernels import moe
from sparkd.engine.kernels.matmul import row_idot, stages_arg


@triton.jit
def _idown_rows_kernel(down_ptr, down_off, ids_ptr, hw_ptr, hd_ptr, hs_ptr, rw_ptr, y_ptr, res_ptr, D, F,
                       row_bytes, IDS: tl.constexpr, RES: tl.constexpr, IDOT: tl.constexpr, A1: tl.constexpr,
                       A2: tl.constexpr, A3: tl.constexpr, ROWS: tl.constexpr, NE: tl.constexpr,
                       UNROLL: tl.constexpr, EW: tl.constexpr, EMU: tl.constexpr, XBLOCK: tl.constexpr,
                       STAGES: tl.constexpr, ALIGN: tl.constexpr, NG: tl.constexpr):
    """y[rows] = sum over the NE experts, in order, of w[a] * (down_a @ h[a])[rows] (+ the residual
    if RES), for the ROWS rows of program_id(0). NG > 0: every row and group in range (moe._full)."""
    r = tl.arange(0, ROWS * NE)
    a = r // ROWS  # the tile row's expert
    rows = tl.program_id(0) * ROWS + r % ROWS
    w_off = moe._aligned_offset(down_off, ids_ptr, a, IDS, ALIGN) + rows.to(tl.int64) * row_bytes
    hw = (hw_ptr + a * (F // 4))[:, None, None]
    hd = (hd_ptr + a * (F // XBLOCK))[:, None, None]
    hs = (hs_ptr + a * (F // 32))[:, None, None]
    if NG > 0:
        part = moe._row_idot_full(down_ptr, w_off, hw, hd, hs, NG * 256, IDOT, A1, A2, A3, NG, UNROLL, EW, EMU)
    else:
        part = row_idot(down_ptr, w_off, rows < D, hw, hd, hs, F, 0, 1, IDOT, A1, A2, A3, UNROLL, EW, EMU, STAGES)
    acc = tl.zeros((ROWS * NE,), tl.float32)
    acc += part * tl.load(rw_ptr + a)  # a range's sums: from 0.0, as moe._idown_kernel has them
    acc = tl.reshape(acc, (NE, ROWS))
    e = tl.arange(0, NE)[:, None]
    total = tl.zeros((ROWS,), tl.float32)
    for s in tl.static_range(NE):  # fold_part's order; each masked sum is one product exactly
        total += tl.sum(tl.where(e == s, acc, 0.0), 0)
    out = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    omask = out < D
    if RES:
        total = total + tl.load(res_ptr + out, mask=omask)
    tl.store(y_ptr + out, total, mask=omask)


def launch(p, q, rw, y, residual, cfg, int_args: dict, emu: bool, xblock: int, ng: int) -> None:
    """The launch over p's down (moe.PreparedTable) on h quantized (q, act_quant.QuantX) into y;
    cfg.block_n real rows a program (moe.rows_fit held); int_args: moe._int_args' step."""
    D, F, n = p.table.dim, p.table.width, p.count
    ids = dict(ids_ptr=p.down_off if p.ids is None else p.ids, IDS=p.ids is not None)
    _idown_rows_kernel[(triton.cdiv(D, cfg.block_n),)](
        p.table.down, p.down_off, hw_ptr=q.words, hd_ptr=q.scales, hs_ptr=q.sums, rw_ptr=rw, y_ptr=y,
        res_ptr=y if residual is None else residual, D=D, F=F, row_bytes=p.down_row_bytes,
        RES=residual is not None, ROWS=cfg.block_n, NE=n, UNROLL=cfg.unroll, EW=cfg.elementwise, EMU=emu,
        XBLOCK=xblock, STAGES=stages_arg(cfg), NG=ng, num_warps=cfg.num_warps, **ids, **int_args)
