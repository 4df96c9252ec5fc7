"""A matrix's blocks, or some of its rows, or several experts' matrices (dequantize_experts), as float32 or 16-bit
values on the device in one launch: for products the kernels do not run (MLA's prompt contracts its per-head k
matrices along their rows: KernelLinear.dense; the slab GEMMs, slab_gemm.py and moe_prefill's experts) and for the
token embedding's lookups (layers/embedding.py). Each program writes BLOCK_N rows of one 256-value group through the
family's dequant, the GEMM's tile (so every layout the kernels read works).

Session 35: the float GEMM times the identity did the same at ~1 and ~15 ms for DeepSeek V3's attn_k_b (Q5_0) and
attn_v_b (Q4_K) on the H200, a layer's prompt; this is a copy's time (bench/gpu_box/mla_heads_bench.py).

Session 48: a family with `words` (pairx Q4_K, tiled MXFP4: the layouts resident experts are kept in) runs
_words_kernel instead, a qs word a lane and its values stored 8 (or 4) consecutive at a time, the same values. The
tile kernel spent ~27 instructions a value (byte loads, its tile's layout conversions through shared memory, a
bfloat16 rounding by hand that only the interpreter needs) and was issue-bound (ncu, H100: SM 78 % busy, DRAM 62 %);
the word kernel 12 (pairx) to 17.5 (MXFP4), 13-35 % faster (docs/performance.md, session 48).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import dispatch
from sparkd.engine.kernels.matmul import aux_arg

BLOCK_N, WARPS = 16, 4  # rows a program (of one 256-value group), its warps
WORDS_ROWS, WORDS_WARPS = 16, 4  # the same for _words_kernel (a multiple of every words family's row tile)
WORDS = True  # _words_kernel where a family has `words` (False: the tile kernel everywhere, for benches)


@triton.jit
def _rounded(values, ROUND: tl.constexpr):
    """values (float32) as bfloat16 values to nearest, ties to even, by hand where ROUND (the interpreter: its cast
    truncates); on the GPU the store's cast rounds so."""
    if ROUND:
        bits = values.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        values = bits.to(tl.float32, bitcast=True)  # now a bfloat16 value: the store's cast is exact
    return values


@triton.jit
def _dequantize_kernel(w_ptr, aux_ptr, ids_ptr, off_ptr, y_ptr, N, M, K, row_bytes, stride_ye, DEQ: tl.constexpr,
                       NSUB: tl.constexpr, SUBLEN: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr,
                       EXPERTS: tl.constexpr, ROUND: tl.constexpr):
    if EXPERTS:  # matrix program_id(2) of several: its blocks at byte off[j] of w, its values at y + j * stride_ye
        j = tl.program_id(2)
        w_ptr += tl.load(off_ptr + j)
        y_ptr += j.to(tl.int64) * stride_ye
    out = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None, None]  # [BN, 1, 1]: y's rows
    omask = out < M
    if GATHER:  # y's row i is W's row ids[i]; ids outside W read nothing and come back as zeros
        rows = tl.load(ids_ptr + out, mask=omask, other=-1).to(tl.int64)
    else:
        rows = out
    g = tl.program_id(1)
    first = g * (NSUB * SUBLEN) + tl.arange(0, NSUB)[None, :, None] * SUBLEN  # [1, NSUB, 1]: each sub-block's column
    values = DEQ(w_ptr, aux_ptr, rows * row_bytes, g, omask & (rows >= 0) & (rows < N) & (first < K))
    values = _rounded(values, ROUND and y_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(y_ptr + out * K + first + tl.arange(0, SUBLEN)[None, None, :], values, mask=omask & (first < K))


@triton.jit
def _words_kernel(w_ptr, off_ptr, y_ptr, M, K, stride_ye, WORDS: tl.constexpr, ROWS: tl.constexpr,
                  EXPERTS: tl.constexpr, ROUND: tl.constexpr):
    """_dequantize_kernel (no gather) for a family with `words`: ROWS rows of one 256-value group a program."""
    if EXPERTS:
        j = tl.program_id(2)
        w_ptr += tl.load(off_ptr + j)
        y_ptr += j.to(tl.int64) * stride_ye
    values, rows, cols = WORDS(w_ptr, K, tl.program_id(0) * ROWS, tl.program_id(1), M, ROWS)
    values = _rounded(values, ROUND and y_ptr.dtype.element_ty == tl.bfloat16)
    run = tl.arange(0, values.shape[2])[None, None, :]  # a run's consecutive values
    tl.store(y_ptr + rows.to(tl.int64) * K + cols + run, values, mask=(rows < M) & (cols < K))


def _launch(fam, weight: torch.Tensor, offsets: torch.Tensor | None, ids: torch.Tensor | None, y: torch.Tensor,
            shape: tuple[int, int], row_bytes: int, n: int, rows: int) -> None:
    """One launch writing y's [rows, cols] values (of n matrices at offsets, or W's rows ids, or W itself)."""
    cols = shape[1]
    groups = triton.cdiv(cols, fam.nsub * fam.sublen)
    stride = y.stride(0) if offsets is not None else 0
    if WORDS and fam.words is not None and ids is None:
        _words_kernel[(triton.cdiv(rows, WORDS_ROWS), groups, n)](
            weight, y if offsets is None else offsets, y, rows, cols, stride, WORDS=fam.words, ROWS=WORDS_ROWS,
            EXPERTS=offsets is not None, ROUND=not weight.is_cuda, num_warps=WORDS_WARPS)
        return
    _dequantize_kernel[(triton.cdiv(rows, BLOCK_N), groups, n)](
        weight, aux_arg(fam, cols, weight.device), y if ids is None else ids.contiguous(),
        y if offsets is None else offsets, y, shape[0], rows, cols, row_bytes, stride, DEQ=fam.dequant, NSUB=fam.nsub,
        SUBLEN=fam.sublen, BLOCK_N=BLOCK_N, GATHER=ids is not None, EXPERTS=offsets is not None,
        ROUND=not weight.is_cuda, num_warps=WARPS)


def dequantize(weight: torch.Tensor, qtype, shape: tuple[int, int], ids: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [rows, cols] as float32 on weight's device (a new tensor): weight the raw blocks of a kernel layout. ids
    (integers [n] on that device): W's rows ids only, [n, cols] (an embedding lookup; an id outside W gives zeros:
    callers check token ids first). dtype: the values rounded to a 16-bit float type instead (slab_gemm's)."""
    what = f"the {qtype.name} dequantization"
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_matrix(weight, fam, shape, what)
    if ids is not None and (ids.dim() != 1 or ids.dtype.is_floating_point or ids.is_complex()
                            or ids.device != weight.device):
        raise dispatch.KernelArgumentError(f"could not run {what}: row ids must be integers [n] on {weight.device}, "
                                           f"got {ids.dtype} of shape {list(ids.shape)} on {ids.device}")
    n = rows if ids is None else ids.numel()
    y = torch.empty(n, cols, dtype=dtype, device=weight.device)
    if n == 0:
        return y
    _launch(fam, weight, None, ids, y, shape, row_bytes, 1, n)
    return y


def dequantize_experts(weight: torch.Tensor, offsets: torch.Tensor, qtype, shape: tuple[int, int],
                       out: torch.Tensor) -> torch.Tensor:
    """Several matrices of one shape in one launch (moe_prefill's expert slabs): W_j [rows, cols] the raw blocks at
    byte offsets[j] of weight (int64 [n] on its device, each checked by the caller to leave W_j inside weight: a
    PreparedTable's), their values into out [n, rows, cols] (float32 or SLAB_TYPES', each row contiguous; a view such
    as half of a [n, 2 rows, cols] buffer). Returns out."""
    what = f"the {qtype.name} dequantization of experts"
    fam = dispatch.family(qtype)
    rows, cols = shape
    row_bytes = dispatch.check_cols(fam, cols, what)
    dispatch.check_weight(weight, what, fam.align)
    n = offsets.numel()
    if (offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.device != weight.device or out.dim() != 3
            or out.shape != (n, rows, cols) or out.stride()[1:] != (cols, 1) or out.device != weight.device
            or out.dtype not in (torch.float32, torch.bfloat16, torch.float16) or rows % fam.row_tile):
        raise dispatch.KernelArgumentError(
            f"could not run {what}: need int64 offsets [n] and out [n, {rows}, {cols}] (float32 or 16-bit, rows "
            f"contiguous, rows a multiple of {fam.row_tile}) on {weight.device}, got offsets {offsets.dtype} "
            f"{list(offsets.shape)} on {offsets.device}, out {out.dtype} {list(out.shape)} strides "
            f"{list(out.stride())} on {out.device}")
    if n == 0 or rows == 0:
        return out
    _launch(fam, weight, offsets.contiguous(), None, out, shape, row_bytes, n, rows)
    return out
