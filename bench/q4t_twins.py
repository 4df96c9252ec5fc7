"""Bench-only twins of the tiled Q4_K GEMV's integer step (kernels/q4_k_tiled.py), to tell which bound
the mid decode shapes hit (session 7, q4k12).

"loadonly": idot_vec's loads at the same addresses (qs words, the 128-bit header, x's words, per-32
sums and scale) in the same shapes, the program grid unchanged (matmul.igemv), but only an integer add
of every loaded word and one float multiply per word: nothing is dead, so every load stays, and the
step's instructions are nearly gone. If the twin is no faster than the step, the loads (their pattern,
the bytes in flight) bound the kernel; if it is much faster, the step's instructions do.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import matmul, q4_k_pair, q4_k_tiled
from sparkd.engine.kernels.act_quant import Q8_K
from sparkd.engine.kernels.family import Family


@triton.jit
def idot_loads_only(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr,
                    EMU: tl.constexpr):
    qs, hdr = q4_k_tiled._group(w_ptr, row_off, g, K)
    j = tl.arange(0, 4)[None, :, None, None]
    w = 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
    v = tl.arange(0, 4)[None, None, None, :]
    m = rmask[:, None, None, None]
    words = q4_k_tiled._qs_words(qs, m)
    zero = tl.zeros(words.shape, tl.int32)
    head = tl.load(hdr[:, None, None, None].to(tl.pointer_type(tl.int32)) + v + zero, mask=m, other=0)
    xw = xw_ptr + g * 64 + j * 16 + w + zero
    xs = xs_ptr + g * 8 + 2 * j
    t = words + head + tl.load(xw) + tl.load(xw + 8) + tl.load(xs) + tl.load(xs + 1)
    part = t.to(tl.float32) * tl.load(xd_ptr + g)
    return acc + tl.reshape(part, acc.shape)


TWINS = {"loadonly": Family(q4_k_tiled.TILED, 256, 144, 8, 32, q4_k_tiled.dequant, align=4, idot=idot_loads_only,
                            act_fmt=Q8_K, iacc=(4, 8), row_tile=q4_k_tiled.TILE_ROWS, isplit=4)}


def gemv(name: str, w, x: torch.Tensor, out: torch.Tensor, config: matmul.GemvConfig, qx=None) -> torch.Tensor:
    """A twin's y on tiled bytes w (q4_k_tiled.pack, either header order): not W @ x, only its time (a kstep
    candidate's: W @ x)."""
    fam = TWINS[name]
    return matmul.igemv(w.data, fam.idot, fam.iacc, fam.act_fmt, (w.rows, w.cols), fam.row_bytes(w.cols), x, out,
                        config, qx, fam.isplit, kstep=fam.kstep)



# session 12 (q4k21): q4k20's kstep (the ranges' sums taken out of [KW, 4] with KW masked tl.sum across the warps,
# each through shared memory) beside q4_k_pair.kstep's one exchange: the same sum order, so the same bits; rows
# "Q4T@kmasked:4/1/2/ew" on the default pairx bytes
@triton.jit
def kstep_masked(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr):
    rows = q4_k_pair.krows(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW, UNROLL, EMU)  # [KW, 4]
    k = tl.arange(0, KW)[:, None]
    total = tl.zeros((4,), tl.float32)
    for r in tl.static_range(KW):
        total += tl.sum(tl.where(k == r, rows, 0.0), 0)  # range r's sums exactly (one value plus zeros)
    return total


TWINS["kmasked"] = dataclasses.replace(q4_k_tiled.FAMILIES["pairx"], kstep=kstep_masked)
