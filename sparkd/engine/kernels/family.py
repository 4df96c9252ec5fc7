"""What a quant family's Triton code tells the generic kernels: its block layout, one jitted
`dequant` that turns one 256-value group of a tile of rows into float32 values (the GEMM's tile),
and optionally a jitted `dot` that multiplies one group straight into per-row sums (the GEMV's
inner step, written per family so it can load packed words and skip the float conversion unit).

Every family dequantizes a group as [BN rows, NSUB sub-blocks, SUBLEN values] (the sub-block is
the unit that carries one scale), so the generic kernels load the activations in the same shape
and never need a per-family layout conversion.

dequant(w_ptr, aux_ptr, row_off, g, smask) contract:
  w_ptr   uint8 pointer (a weight tensor, an arena, or mapped host memory)
  aux_ptr float32 pointer to the family's codebook in device memory (grids.grid_table(Family.grid,
          device)); families without one get a placeholder and ignore it
  row_off int64 [BN, 1, 1] byte offset of each row's first block
  g       group index along the row (values g*256 ... g*256+255)
  smask   bool [BN, NSUB, 1]: which (row, sub-block) pairs exist (row past the end, or a Q8_0
          row that ends inside the group); masked values must come back as 0.

dot(w_ptr, aux_ptr, row_off, rmask, x_ptr, g, K, acc, EW) contract: aux_ptr as above, row_off
int64 [BN], rmask bool [BN] (False rows contribute 0 and are not read), x float32 [K]; adds group
g's share of sum_k W[row, k] * x[k] to acc and returns it. EW (compile-time) picks the accumulator: True, an
elementwise float32 tile in the family's own shape, summed once after the loop (no cross-thread
reduction per group); False, float32 [BN] (each group reduced at once). acc0(rmask, EW) makes the
zero accumulator and total(acc, EW) reduces it to [BN]. Families without a dot get dequant
followed by a multiply.

idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW, EMU) contract (families whose
activations llama.cpp rounds to int8 blocks, act_fmt "q8_0" or "q8_k"): aux_ptr int32 pointer to the family's
codebook as int8 values packed 4 to a word (grids.grid_words(Family.grid, device): the grid i-quants' since
session 22; families without a grid get a placeholder and ignore it); x comes quantized
(act_quant.QuantX: int32 words of 4 quants at xw_ptr, float32 block scales at xd_ptr, int32
per-32 quant sums at xs_ptr for q8_k); adds group g's share of the row dot products, computed
per block in integers with dp4a, to acc: EW False, float32 [BN] (reduced every group); True,
the elementwise tile float32 [BN, *iacc], summed once after the loop (the H200-measured default
tiles of both families, matmul.GEMV_TILES). EMU: emulate dp4a (interpreter).

iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes) contract (the integer prefill GEMM, prefill_gemm.gemm at
precision "int8"; families with an idot whose sub-blocks are 32 values; kblock and wblock take the same arguments):
aux_ptr as idot's (read by the grid i-quants since session 23: their int8 codebook words; ignored by the others),
block b (values b*32 ... b*32+31) of the rows at byte offsets row_off int64 [BN] (row_bytes: the GGUF layout's
bytes per row, from which a tiled layout finds a row's place in its tile); rows not in rmask come back as 0 (or
with scales of 0: Q6_K, IQ4_XS, the grid i-quants). Without igroup (act_fmt "q8_0": Q8_0 and its packed layout,
Q4_0) it returns (quants int8 [BN, 32], scales float32 [BN]) and the GEMM adds isum * (d_x * d) per block.
With igroup (act_fmt "q8_k", blocks of 32 with an integer scale and min: Q4_K and its tiled layouts; IQ4_XS,
IQ2_XXS, IQ3_XXS and IQ1_S with min and dmin 0, a term the compiler folds away: the grid i-quants' scale is
2 * scale + 1, their power-of-two constant is in igroup's d, IQ1_S's delta in its quants) it returns (quants int8
[BN, 32], scale int32 [BN], min int32 [BN]) and igroup(w_ptr, row_off, rmask, g, row_bytes) the float (d, dmin)
[BN] of group g (values g*256 ...): the GEMM sums sc * isum and mn * xsum (x's per-32 sums) over the group's 8
blocks in int32 and adds d_x * (d * qsum - dmin * msum), the decode idot's arithmetic (q4_k.idot_rows_at). With
igroup and ihalf (Q6_K, IQ2_XS: integer scales per 16 values, no min) iblock returns (quants int8 [BN, 32], the
scale of values 0-15, the scale of values 16-31) (int32 [BN]), each half gets its own tl.dot (x's other half
zeroed), and a group adds qsum * (d_x * d) (q6_k.idot's rows step; igroup's dmin is not read). The quants are
multiplied with x's int8 blocks in tl.dot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf.constants import GGMLQuantizationType

from sparkd.engine.errors import EngineError


class KernelArgumentError(EngineError, ValueError):
    """A kernel wrapper was handed tensors that do not fit together."""


@dataclass(frozen=True)
class LayoutType:
    """The qtype of a byte layout the engine makes from a GGUF type at load (q8_0_packed,
    q4_k_tiled; not a GGUF type): what KernelLinear and gemv are handed."""

    name: str


@dataclass(frozen=True)
class Family:
    qtype: GGMLQuantizationType
    block_values: int  # values per GGUF block
    block_bytes: int  # bytes per GGUF block
    nsub: int  # sub-blocks per 256-value group
    sublen: int  # values per sub-block
    dequant: Any  # triton.JITFunction
    dot: Any = None  # triton.JITFunction, or None: dequant then multiply
    acc0: Any = None  # triton.JITFunction, with dot
    total: Any = None  # triton.JITFunction, with dot
    align: int = 2  # byte alignment the kernels' loads need of every row start (f16 scales: 2)
    idot: Any = None  # triton.JITFunction, or None: no integer path
    act_fmt: str | None = None  # with idot: how x is quantized (act_quant.Q8_0 / Q8_K)
    iacc: tuple[int, int] = (1, 1)  # with idot: its accumulator tile per row, reduced after the loop
    grid: str | None = None  # the gguf class whose codebook the kernels get as aux_ptr (i-quants)
    # rows come in tiles of this many (a repacked layout, q4_k_tiled): the matrix has whole tiles,
    # and its dequant gets the row width as aux_ptr (int32 [1]) to find a row's place in its tile
    row_tile: int = 1
    # with idot: iacc's last dimension is (2, isplit) merged (a step's [.., 2, 4] reshaped, as the
    # K-quants' are): row_idot sums each row in the fixed order of row_tiles.row_sums over that split
    # (the same bits compiled and interpreted, right on every tile: session 8, diag16); 0: tl.sum
    isplit: int = 0
    # with idot: (block_n, num_warps) of the one elementwise tile the step runs on (pairx: its lanes
    # are laid out for 4 rows on one warp), else None: any tile
    one_tile: tuple[int, int] | None = None
    iblock: Any = None  # triton.JITFunction, or None: no integer GEMM (the float one at "ieee" instead)
    igroup: Any = None  # triton.JITFunction with an iblock of integer scales and mins (K-quants), else None
    ihalf: bool = False  # with igroup: iblock's scales are per 16 values (Q6_K), no min
    # with an iblock: iblock's values loaded as 32-bit (Q8_0: 16-bit) words and unpacked in registers instead of
    # byte loads (session 11's GEMM, prefill_gemm._igemm_steps: the pipeliner copies word loads ahead); None: iblock
    kblock: Any = None
    # with a kblock: the same block unpacked with 32-bit word ops into the int8 tile (pairx, session 12), or None
    wblock: Any = None
    # with idot: the row loop of a one-warp tile's step with a split-K launch's ranges on the warps of one program,
    # folded in it (matmul.GemvConfig.warps_k; q4_k_pair.kstep), else None
    kstep: Any = None
    # with an iblock of Q8_0's form whose block scales are powers of two (MXFP4): fblock(w_ptr, row_off, rmask, b,
    # row_bytes) gives block b as bfloat16 [BN, 32], each value times its block's scale (exact), or None
    # (prefill_gemm._igemm_steps' FBLOCK, IgemmTile.fold)
    fblock: Any = None
    # dequantize's word kernel (session 48): words(w_ptr, K, first, g, M, ROWS) gives group g of rows [first, first +
    # ROWS) (rows from M none) as dequant's values a 32-bit word a lane: values float32 [n, RUNS, LEN], each run LEN
    # consecutive values of one row, their row int [n, 1, 1] and first column [n, RUNS, 1]; None: dequant's tile
    words: Any = None
    # its values are tf32 values (F16: 11 significant bits, BF16: 8; tf32 keeps 11): with x rounded to the same type, as
    # the callers round it (act_round: F16's and BF16's vec_dot types are themselves), a tf32 tl.dot's products are
    # exact and its sums float32, so the default prompt GEMM runs at "tf32" (prefill_gemm.float_precision)
    tf32_exact: bool = False

    def row_bytes(self, cols: int) -> int:
        return cols // self.block_values * self.block_bytes
