"""The MoE decode launches' tiles and kernel variants by quant type and model width (kernels/moe.py
runs them), each table with the H200 measurement that chose it, and the older sets kept to time
against and to switch back to ($SPARKD_MOE_TILES: old, s5, s6, s6r2, s7, s8, s14, new); where the gate/up lets the
down launch under PDL ($SPARKD_MOE_DOWN_LAUNCH, session 13); the Q8_0 gate/up's persistent kernel by width
($SPARKD_MOE_PIPE, session 19), the Q8_0 down's loads ahead and its tile by width ($SPARKD_MOE_DOWN_AHEAD,
session 20) and the integer down's fold of two ranges by one atomic exchange by width ($SPARKD_MOE_PAIR_FOLD, session
21), the pairx down's loads ahead and its tile by width ($SPARKD_MOE_PAIRX_DOWN, session 21)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkd.engine import switches
from sparkd.engine.kernels import dispatch
from sparkd.engine.kernels.matmul import GemvConfig

if TYPE_CHECKING:
    from sparkd.engine.kernels.moe import PreparedTable

# decode tiles (gate/up, down): the H200 sweeps (docs/performance.md); the integer families' from
# the session-3 sweep (bench/results/kernels_h200_s3.log, per-group reduction: elementwise=False)
GATE_UP_CONFIG = GemvConfig(block_n=4, num_warps=1, unroll=2)
DOWN_CONFIG = GemvConfig(block_n=4, num_warps=1, unroll=1)
# the down tile splits the A experts into 8 ranges folded in order: deterministic, and on the H200
# (moe 2048x768 top-8, session 3 --compare run) 32.8 us vs 38.3 unsplit for Q8_0, 30.7 vs 43.4 for
# Q4_K; the old atomic sum took 29.3 / 29.0. Session 4 (kern6, H200): Q4_K 23.4 us per 2048x768
# top-8 layer vs 30.7 for 16 rows / 4 warps. OLD_DECODE_TILES: these, at every shape.
OLD_DECODE_TILES = {
    "Q8_0": (GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=False),
             GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=False, split=8)),
    "Q4_K": (GemvConfig(block_n=4, num_warps=1, unroll=4, elementwise=True),
             GemvConfig(block_n=4, num_warps=1, unroll=3, elementwise=True, split=8)),
}
# session 5 (moe8, H200, bench/moe_tiles_bench.py, bench/results/moe_tiles_h200_s5*): gate/up in
# two-group steps into the elementwise tile at every shape (<= 64 registers: 32 one-warp programs
# per SM; Q8_0 2048x768 top-8 20.5 -> 17.5 us, 7168x2048 122 -> 112 us; Q4_K 7168x2048 80 -> 57 us);
# the down as before up to S5_LARGE_DOWN_TILES' model width, its tile from there
S5_DECODE_TILES = {
    "Q8_0": (GemvConfig(block_n=2, num_warps=1, unroll=2, elementwise=True), OLD_DECODE_TILES["Q8_0"][1]),
    "Q4_K": (GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True), OLD_DECODE_TILES["Q4_K"][1]),
}
# (model width from which, down tile): Q8_0 7168x2048 top-8 down 79.6 -> 66.2 us (at 4096 the old
# tile stays faster: 30.2 vs 34.4 us); Q4_K two ranges of 4 experts, 4096x1536 17.8 -> 16.6 us,
# 7168x2048 41.2 -> 33.0 us (at 2048 the old 8 ranges: 7.5 vs 9.7 us for two ranges)
S5_LARGE_DOWN_TILES = {
    "Q8_0": (6144, GemvConfig(block_n=2, num_warps=1, unroll=4, elementwise=True, split=8)),
    "Q4_K": (4096, GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True, split=2)),
}
# session 6 (moe9, with Kernels(); H200 sweep bench/results/moe_tiles_h200_s6_call1.log, top-8):
# Q8_0 gate/up 2/1/2/e with words and the pair loop (7168x2048 111.3 -> 97.5 us, 4096x1536 55.1 ->
# 43.9, 2048x768 17.3 -> 14.9); Q4_K gate/up one group of both rows per step (two groups: 99
# registers, offline SASS; 7168x2048 57.2 -> 50.4 us); Q8_0 down 4/1/1/g with words (no barrier in
# the loop: 19 shuffles -> 7; 2048x768 9.9 -> 8.9 us, 4096x1536 29.8 -> 25.9)
S8_DECODE_TILES = {  # the default until session 8's fold19 (DECODE_TILES below); "s8" and the older sets
    "Q8_0": (GemvConfig(block_n=2, num_warps=1, unroll=2, elementwise=True),
             GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=False, split=8)),
    "Q4_K": (GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=True), S5_DECODE_TILES["Q4_K"][1]),
    # session 6 (q6k9, with session 5's kernels; H200, bench/results/gemv_tiles_h200_s6_q6k.log):
    # a Q4_K_M file's Q6_K down, 2048x768 top-8 with Q4_K gate/up, 31.2 us at DOWN_CONFIG -> 22.5 us at Q4_K's down tile (of 5);
    # a Q6_K gate/up keeps GATE_UP_CONFIG (not measured)
    "Q6_K": (GATE_UP_CONFIG, GemvConfig(block_n=4, num_warps=1, unroll=3, elementwise=True, split=8)),
}
# (model width from which, gate/up tile or None: as below, down tile or None), in rising width:
# Q8_0 from 6144 gate/up one group per step (7168x2048 97.5 -> 86.5 us; at 4096 46.6 vs 43.9) and
# down 2 rows / 2 groups (64.7 s5 -> 52.1 us); Q4_K down 4 ranges of 2 experts at 4096 (16.5 ->
# 15.2 us, as session 5's sweep had it), 2 ranges of 4 from 6144 (32.3 -> 31.8; 4 ranges 34.5)
S8_WIDTH_TIERS = {  # the default until fold19 (WIDTH_TIERS below); "s8" and the older sets
    "Q8_0": [(6144, GemvConfig(block_n=2, num_warps=1, unroll=1, elementwise=True),
              GemvConfig(block_n=2, num_warps=1, unroll=2, elementwise=True, split=8))],
    "Q4_K": [(4096, None, GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True, split=4)),
             (6144, None, S5_LARGE_DOWN_TILES["Q4_K"][1])],
}
# session 8 (fold19, H200, bench/results/fold19_h200_s8*): fewer expert ranges, so fewer programs pay the
# down's in-launch fold (store, fence, ticket, read-back: 0.7 / 2.3 / 7.5 us of the Q8_0 down at 2048 /
# 4096 / 7168 wide, its no-fold rows). Q8_0 from 4096 the 2-row 2-group tile in 2 ranges of 4 experts
# (4096x1536 top-8 down 24.0 -> 20.5 us, 7168x2048 45.8 -> 42.6); Q4_K below 4096 4 ranges of 2 (2048x768
# 7.4 -> 6.5 us). Fewer ranges add the experts in another order: float32 rounding apart from "s8", the
# same bits run to run. $SPARKD_MOE_TILES=s8 switches back.
Q8_0_FEW_RANGES = GemvConfig(block_n=2, num_warps=1, unroll=2, elementwise=True, split=2)
# session 9 (moe20, H200, bench/results/moe20_h200_s9*): a gate/up in q4_k_tiled's pairx bytes (moe.tiled_gate_up)
# on the step's one tile, gate and up of one group a step (7168x2048 top-8 41.4 us; 2 groups a step 45.6).
# Session 10 (moe21, H200, bench/results/moe21_h200_s10*): a down in the pairx bytes (moe.tiled_down) on the step's
# one tile takes Q4_K's down tiles and width tiers (all 4-row one-warp elementwise tiles), the fastest of 7 at each
# shape or tied: top-8 down 22.3 / 12.7 / 6.3 us at 7168x2048 / 4096x1536 / 2048x768 (GGUF down 32.1 / 14.5 / 7.0);
# without Kernels.down_full's constant trip count 24.7 / 15.6 us at the first two
Q4_K_DOWN = GemvConfig(block_n=4, num_warps=1, unroll=3, elementwise=True, split=4)
TILED_DOWN = Q4_K_DOWN
# session 25 (H200, bench/nibble_tiles_bench.py, docs/runs/2026-12-03-s25/): MXFP4's down in 4 ranges of experts, the
# tiled experts' layer after the norm at gpt-oss-20b's 2880x2880 top-4 54.7 -> 35.7 us (a range of all 4 experts: a
# program's loop of 45 one-group steps; 2 ranges 40.0), 4096x1536 top-8 62.3 -> 48.4 (8 ranges 47.8); gate/up tiles
# within 3 % of the default (4/1/1/e 52.9, 2/1/1/e 51.5 at 2880)
MXFP4_DOWN = GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=True, split=4)
# session 26 (H200, bench/nibble_tiles_bench.py, docs/runs/2026-12-03-s26/): Q4_0's tiled experts (q4_0_tiled) the same
# way, the down in 4 ranges of 2-group steps: top-8 down sweep 2048x768 28.5 -> 19.2 us, 4096x1536 54.3 -> 38.7 (a
# range of all 8 experts: 4/1/1/e); the gate/up on 2-row tiles 28.5 -> 24.4 / 54.3 -> 54.0. The file's blocks take them
# too (streamed experts; $SPARKD_MOE_Q4_0_LAYOUT=gguf), as MXFP4's do
Q4_0_TILES = (GemvConfig(block_n=2, num_warps=1, unroll=2, elementwise=True),
              GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True, split=4))
DECODE_TILES = {**S8_DECODE_TILES,
                "Q4_K": (S8_DECODE_TILES["Q4_K"][0], Q4_K_DOWN),
                "Q4_K_TILED": (GemvConfig(block_n=4, num_warps=1, unroll=1, elementwise=True), TILED_DOWN),
                "MXFP4": (GATE_UP_CONFIG, MXFP4_DOWN), "MXFP4_TILED": (GATE_UP_CONFIG, MXFP4_DOWN),
                "Q4_0": Q4_0_TILES, "Q4_0_TILED": Q4_0_TILES}
S14_WIDTH_TIERS = {"Q8_0": [(4096, None, Q8_0_FEW_RANGES),  # the default until session 15's moe26; "s14"
                            (6144, S8_WIDTH_TIERS["Q8_0"][0][1], Q8_0_FEW_RANGES)],
                   "Q4_K": S8_WIDTH_TIERS["Q4_K"],
                   "Q4_K_TILED": S8_WIDTH_TIERS["Q4_K"]}
# session 15 (moe26, H200, bench/results/moe26_h200_s15_tiles.log): the Q8_0 gate/up from width 4096 in 4-group steps
# (2/1/4/e: 72 registers, 28 one-warp programs per SM, the loop's steps halved): 4096x1536 top-8 layer after the norm
# 59.3 -> 57.4 us (the default's other rows of the call 59.5-59.8), its gate/up 41.7 -> 39.7; the same groups in the
# same order onto the same tile: the same bits (test_moe_tiles' GPU test). From 6144 it lost (7168x2048 112.3 ->
# 117.2 us: 2/1/1/e stays); "s14" switches back
Q8_0_GATE_UP_4096 = GemvConfig(block_n=2, num_warps=1, unroll=4, elementwise=True)
WIDTH_TIERS = {**S14_WIDTH_TIERS,
               "Q8_0": [(4096, Q8_0_GATE_UP_4096, Q8_0_FEW_RANGES), S14_WIDTH_TIERS["Q8_0"][1]]}


@dataclass(frozen=True)
class Kernels:
    """Which code the decode launches run, beside their tiles (session 6): words, Q8_0 weights as
    aligned 32-bit words where the table allows (q8_0_words; PreparedTable.*_words); pair, gate
    and up rows in one loop over x (_gate_up_idot); round 2 (moe10): q4k_vec / q4k_vec_down, Q4_K
    headers as vectors (_q4_k_vec; H200 7168x2048 top-8 layer 82.5 -> 78.2 us). (A down looping over
    all of a range's experts in each step was slower on the H200 at every shape but one and was
    removed: docs/performance.md, session 6 moe10.)"""

    words: bool = True
    pair: bool = True
    # Q4_K headers as one 128-bit load where rows start on 16 bytes (_q4_k_vec; PreparedTable.*_vec):
    # in gate/up, in the down
    q4k_vec: bool = True
    q4k_vec_down: bool = True
    # session 7 (moe13): q8_0_words.idot_full, no masks where every row and group is in range (moe._full);
    # H200 top-8 layer (engine, x quantized before) 7168x2048 135.3 -> 113.9 us, 4096x1536 68.7 -> 64.6
    full: bool = True
    # session 7 (moe14): for these down types the down's groups in a loop of constant trip count (the
    # row's groups a constexpr) on a mask true everywhere, where moe._full holds. H200 top-8 Q4_K down
    # (session 8, moe16, bench/results/moe16_h200_s8*): 4096x1536 14.7 -> 13.7 us, 7168x2048 30.4 -> 29.2,
    # 2048x768 7.5 = 7.5, the same err; Q8_0 lost in moe14 (7168x2048 46.9 -> 48.4 us)
    # session 10 (moe21): the tiled down too (Q4_K_TILED, moe.tiled_down)
    down_full: tuple[str, ...] = ("Q4_K", "Q4_K_TILED")
    # session 13 (moe23): where the integer gate/up lets the down launch under PDL (pdl.start's DEPENDENTS): True
    # at its start, so the down's programs take free slots and wait there; False after its loop; None by the
    # model width (down_launch_at_start: $SPARKD_MOE_DOWN_LAUNCH). The same bits
    down_at_start: bool | None = None
    # session 19 (moe42): > 0, the Q8_0 words gate/up as moe_pipe's software-pipelined persistent kernel, this many
    # programs an SM (the next loop step's weight words in flight during this step's dots); 0, the grid kernel;
    # None, by the model width (pipe_programs: $SPARKD_MOE_PIPE)
    pipe: int | None = None
    # session 20 (moe46): the Q8_0 words down's loop with the next step's weight words in flight during this step's
    # dots (moe_down_ahead, in the grid kernel) where its step is the grid kernel's (moe._ahead_ok); None, by the
    # model width (down_ahead: $SPARKD_MOE_DOWN_AHEAD)
    down_ahead: bool | None = None
    # session 21 (q4k48): the pairx (Q4_K_TILED) gate/up's loop: "loop" (_gate_up_idot's: the groups counted at run
    # time, clamped and masked), "steps" (q4_k_pair.gate_up: a constant trip count, the tile's unroll a step); None, by
    # the model width (pairx_way: $SPARKD_MOE_PAIRX_STEPS)
    pairx_gate_up: str | None = None
    # session 21 (moe48): an integer down of two expert ranges folded in the launch by matmul.fold_pair (one atomic
    # exchange of the sums) instead of fold_part (store, fence, ticket, read-back); the same bits. None, by the model
    # width (pair_fold: $SPARKD_MOE_PAIR_FOLD)
    down_pair_fold: bool | None = None
    # session 21 (down49): the pairx (Q4_K_TILED) down's loop with the next step's words loaded before this step's dots
    # (q4_k_pair.down_sums, moe._pairx_ahead_ok); the same bits. None, by the model width (pairx_down:
    # $SPARKD_MOE_PAIRX_DOWN)
    pairx_down_ahead: bool | None = None
    # session 48: the pairx down_sums' first step's weight words loaded before its PDL wait, the gate/up letting it
    # launch after its own wait (pdl.py's exception: the selection it reads there is written by then); the same bits.
    # None: down_early() ($SPARKD_MOE_DOWN_EARLY); moe._early keeps it only where the down runs down_sums
    down_early: bool | None = None


# the older sets run none of the later kernels: session 19's pipe, session 20's down ahead, session 21's pairx steps,
# pair fold and pairx down ahead
_LATER_OFF = dict(pipe=0, down_ahead=False, pairx_gate_up="loop", down_pair_fold=False, pairx_down_ahead=False,
                  down_early=False)
OLD_KERNELS = Kernels(words=False, pair=False, q4k_vec=False, q4k_vec_down=False, full=False, down_full=(),
                      **_LATER_OFF)  # sessions 4 and 5
S6_KERNELS = Kernels(q4k_vec=False, q4k_vec_down=False, full=False, down_full=(),
                     **_LATER_OFF)  # session 6's first round (moe9)
S6R2_KERNELS = Kernels(full=False, down_full=(), **_LATER_OFF)  # session 6's second round, until moe13
S7_KERNELS = Kernels(down_full=(), **_LATER_OFF)  # session 7's (moe13), the default until session 8
# "old": session 4's tiles, "s5": session 5's, both with OLD_KERNELS; "s6" S6_KERNELS, "s6r2" S6R2_KERNELS,
# "s7" S7_KERNELS; "s8": Kernels(**_LATER_OFF) at S8_DECODE_TILES / S8_WIDTH_TIERS (session 8 before fold19), the
# tiles of "s6" to "s7" too; "s14": Kernels(**_LATER_OFF) at DECODE_TILES / S14_WIDTH_TIERS (before session 15's moe26)
TILES_ENV = "SPARKD_MOE_TILES"
TILE_SETS = ("old", "s5", "s6", "s6r2", "s7", "s8", "s14", "new")
TILES = switches.choice(TILES_ENV, TILE_SETS, "new")  # read once


def decode_tiles(p: PreparedTable, which: str | None = None) -> tuple[GemvConfig, GemvConfig]:
    """The default (gate/up, down) tiles for the table's families and shape: which "new" (DECODE_TILES,
    WIDTH_TIERS; a Q8_0 down Q8_0_DOWN_AHEAD where ahead_tile_fits), "s14" (DECODE_TILES, S14_WIDTH_TIERS), "s8",
    "s7", "s6r2" and "s6" (S8_DECODE_TILES, S8_WIDTH_TIERS; they differ in decode_kernels), "s5" (session 5's),
    "old" (session 4's at every shape); default $SPARKD_MOE_TILES."""
    which = which or TILES
    if which not in TILE_SETS:
        raise dispatch.KernelArgumentError(f"could not pick the MoE decode tiles: {which!r} (${TILES_ENV} or "
                                           f"which) is not one of {', '.join(TILE_SETS)}")
    fallback = (GATE_UP_CONFIG, DOWN_CONFIG)
    if which == "old":
        return (OLD_DECODE_TILES.get(p.gate_up.qtype.name, fallback)[0],
                OLD_DECODE_TILES.get(p.down.qtype.name, fallback)[1])
    if which == "s5":
        down = S5_DECODE_TILES.get(p.down.qtype.name, fallback)[1]
        large = S5_LARGE_DOWN_TILES.get(p.down.qtype.name)
        if large is not None and p.table.dim >= large[0]:
            down = large[1]
        return S5_DECODE_TILES.get(p.gate_up.qtype.name, fallback)[0], down
    gu_name, d_name = p.gate_up.qtype.name, p.down.qtype.name
    tiles, tiers = {"new": (DECODE_TILES, WIDTH_TIERS), "s14": (DECODE_TILES, S14_WIDTH_TIERS)}.get(
        which, (S8_DECODE_TILES, S8_WIDTH_TIERS))
    down = _tier(tiers, d_name, p.table.dim, 2, tiles.get(d_name, fallback)[1])
    if which == "new" and d_name == "Q8_0" and ahead_tile_fits(p):  # session 20: the down's loads ahead
        down = Q8_0_DOWN_AHEAD
    if which == "new" and pairx_down_fits(p):  # session 21: the pairx down's loads ahead, 2 ranges
        down = PAIRX_DOWN_TILE
    if which == "new" and gu_name == "Q4_K_TILED" and pairx_steps(p.table.dim):  # session 21: the pairx steps
        return PAIRX_GATE_UP, down
    return _tier(tiers, gu_name, p.table.dim, 1, tiles.get(gu_name, fallback)[0]), down


def _tier(tiers: dict, name: str, dim: int, at: int, tile: GemvConfig) -> GemvConfig:
    """tile, or that of the widest tiers entry (WIDTH_TIERS' form) of the type up to model width dim
    that sets one (at 1: the gate/up tile, 2: the down tile)."""
    for tier in tiers.get(name, []):
        if dim >= tier[0] and tier[at] is not None:
            tile = tier[at]
    return tile


def decode_kernels(which: str | None = None) -> Kernels:
    """The decode's kernels for a tile set (decode_tiles' which): this session's for "new" (its pipe by width)."""
    older = Kernels(**_LATER_OFF)
    return {"new": Kernels(), "s14": older, "s8": older,
            "s6": S6_KERNELS, "s6r2": S6R2_KERNELS, "s7": S7_KERNELS}.get(which or TILES, OLD_KERNELS)


# Session 13 (moe23, H200, bench/results/moe23_h200_s13*): under PDL the gate/up let the down launch at its start,
# so the down's programs took the slots its programs left free and waited there. Below model width 4096 the gate/up
# lets it launch only after its loop: top-8 layer after the norm ("all qx") at 2048x768 Q8_0 23.0 -> 21.2 us (0.42
# -> 0.46 of copy), Q4_KX 16.1 -> 16.0; 12-layer Qwen3-30B-A3B-shaped Q4_K resident decode +3.1 % (3 interleaved
# rounds, +3.1 to +4.4 % each, the same bits). From 4096 it lost (4096x1536 Q8_0 59.0 -> 60.9 us, Q4_KXD 33.0 ->
# 33.3; 7168x2048 Q8_0 111.3 -> 112.9): "auto" keeps the early launch there. "start": at the start everywhere (the
# code before), "loop": after the loop everywhere.
DOWN_LAUNCH_ENV = "SPARKD_MOE_DOWN_LAUNCH"
DOWN_LAUNCHES = ("auto", "start", "loop")
DOWN_LAUNCH = switches.choice(DOWN_LAUNCH_ENV, DOWN_LAUNCHES, "auto")  # read once
LOOP_LAUNCH_BELOW = 4096  # "auto": the model widths below this let the down launch after the gate/up's loop


def down_launch_at_start(dim: int, which: str | None = None) -> bool:
    """Whether the gate/up lets the down launch at its start (else after its loop) at model width dim: which
    "auto", "start" or "loop" (DOWN_LAUNCHES; default $SPARKD_MOE_DOWN_LAUNCH)."""
    which = which or DOWN_LAUNCH
    if which not in DOWN_LAUNCHES:
        raise dispatch.KernelArgumentError(f"could not pick where the MoE down launches: {which!r} (${DOWN_LAUNCH_ENV} "
                                           f"or which) is not one of {', '.join(DOWN_LAUNCHES)}")
    return which == "start" or (which == "auto" and dim >= LOOP_LAUNCH_BELOW)


AUTO_OFF = ("auto", "off")  # the choices of a kernel switched on by model width


def _auto_at(dim: int, which: str | None, default: str, env: str, widths: tuple[int, int], what: str) -> bool:
    """Whether an AUTO_OFF switch (which, else default: env's value) runs its kernel at model width dim: "auto" at
    the widths [from, below)."""
    which = which or default
    if which not in AUTO_OFF:
        raise dispatch.KernelArgumentError(f"could not pick {what}: {which!r} (${env} or which) is not one of "
                                           f"{', '.join(AUTO_OFF)}")
    return which == "auto" and widths[0] <= dim < widths[1]


# Session 19 (moe42, H200, bench/results/moe42_h200_s19_*): the Q8_0 gate/up at model widths 4096-6143 (its 2/1/4/e tile,
# Q8_0_GATE_UP_4096) as moe_pipe's software-pipelined persistent kernel, 16 programs an SM (~2.9 tiles each; 96
# registers, 21 resident): 4096x1536 top-8 layer after the norm ("all qx") 57.7 / 57.2 and 57.3 / 57.0 (two processes)
# -> 53.9 / 52.7 us (0.66 -> 0.70-0.72 of the 2 GiB copy), its gate/up 40.2 / 39.6 -> 36.1 / 35.5; 12, 21 and 8 an SM
# and the 2/1/2/e tile lost or tied. At 2048x768 (23.1 vs 21.0 us) and 7168x2048 (142.4 vs 112.1, one-group steps) it
# lost: the grid kernel there. The same h and y bits. "off": the grid kernel at every width (Kernels.pipe per call)
PIPE_ENV = "SPARKD_MOE_PIPE"
PIPE = switches.choice(PIPE_ENV, AUTO_OFF, "auto")  # read once
PIPE_WIDTHS = (4096, 6144)  # "auto": the model widths [from, below) that run it
PIPE_PROGRAMS = 16  # programs an SM
PIPE_UNROLL = Q8_0_GATE_UP_4096.unroll  # "auto": only a gate/up tile of the measured steps (another, a bench's, not)


def pipe_programs(dim: int, tile: GemvConfig, which: str | None = None) -> int:
    """Programs an SM of the Q8_0 gate/up's persistent kernel at model width dim and gate/up tile (0: the grid
    kernel): which "auto" or "off" (default $SPARKD_MOE_PIPE)."""
    on = _auto_at(dim, which, PIPE, PIPE_ENV, PIPE_WIDTHS, "the MoE gate/up's kernel")
    return PIPE_PROGRAMS if on and tile.unroll == PIPE_UNROLL else 0


# Session 20 (moe46, H200, bench/results/moe46_h200_s20_*): the Q8_0 down's loop with the next step's words loaded
# before this step's dots (moe_down_ahead, in the grid kernel). At model widths 2048-4095, where an expert's row is
# whole 3-group steps, on the tile 2/1/3/e/2 (one step an expert: the next expert's row in flight during this one's
# dots; two ranges of 4): 2048x768 top-8 layer after the norm ("all qx") 20.9-21.2 -> 19.3-19.5 us (-7 to -8.5 %, two
# calls, each interleaved), its down alone 10.1-10.3 -> 9.3; the same tile without the loads ahead 20.9 (the old tile's
# time). At 4096x1536 (the engine's 2/1/2/e/2) -2.0 % and -0.8 % in two processes, at 7168x2048 -1.9 % (one): under
# the bar, the loop as before there. Session 21 (moe48, bench/results/moe48_h200_s21_*): at 4096-6143 too, on the
# engine's 2/1/2/e/2, with the pair fold (PAIR_FOLD_WIDTHS): the two together won in two processes (below); the loads
# ahead alone -1.5 % and -1.7 % in two calls, the pair fold alone -2.8 % in one. "off": the loop as before and session
# 19's down tile at every width.
DOWN_AHEAD_ENV = "SPARKD_MOE_DOWN_AHEAD"
DOWN_AHEAD = switches.choice(DOWN_AHEAD_ENV, AUTO_OFF, "auto")  # read once
DOWN_AHEAD_WIDTHS = (2048, 6144)  # "auto": the model widths [from, below) that run it
AHEAD_TILE_WIDTHS = (2048, 4096)  # of them, those that take Q8_0_DOWN_AHEAD (its 3-group step lost at 4096: moe48)
Q8_0_DOWN_AHEAD = GemvConfig(block_n=2, num_warps=1, unroll=3, elementwise=True, split=2)


def down_ahead(dim: int, which: str | None = None) -> bool:
    """Whether the Q8_0 down's loop loads the next step's words ahead at model width dim: which "auto" or "off"
    (default $SPARKD_MOE_DOWN_AHEAD)."""
    return _auto_at(dim, which, DOWN_AHEAD, DOWN_AHEAD_ENV, DOWN_AHEAD_WIDTHS, "the MoE down's loop")


def ahead_tile_fits(p: PreparedTable, which: str | None = None) -> bool:
    """Whether the "new" tiles give a Q8_0 down Q8_0_DOWN_AHEAD (its loop loading ahead): down_ahead at the model width
    (which: "auto" or "off") in AHEAD_TILE_WIDTHS, rows on 32-bit words (the words step) and an expert's row whole steps of the tile."""
    return p.down_words and p.table.width % (256 * Q8_0_DOWN_AHEAD.unroll) == 0 and down_ahead(p.table.dim, which) \
        and AHEAD_TILE_WIDTHS[0] <= p.table.dim < AHEAD_TILE_WIDTHS[1]


# Session 21 (q4k48, H200, bench/results/q4k48_h200_s21_*): the pairx (Q4_K_TILED) gate/up's loop with a constant trip
# count (q4_k_pair.gate_up: D // 256 groups a row, no clamp, no mask), 2 groups a step (PAIRX_GATE_UP; 64 registers,
# 131 warp instructions a group against the loop's 146), at model widths 2048-6143 (rows of whole steps): top-8 layer
# after the norm ("all qx", Q4_KXD) 4096x1536 33.0-33.5 / 32.8-32.9 -> 31.7 / 31.3 us (-4 to -5 %, two processes;
# 0.61-0.62 -> 0.65 of the 2 GiB copy), its gate/up 22.4-23.0 -> 20.9-21.3; 2048x768 15.5-15.7 -> 14.9 / 14.9 (-4 to
# -5 %), gate/up 10.4-10.5 -> 9.7. 1, 4 and 8 groups a step and the loads a group ahead (taken out) lost to it or tied
# at 4096. The same bits as the loop. Unmeasured widths (7168) keep the loop. "off": the loop and the one-group tile
# at every width.
PAIRX_STEPS_ENV = "SPARKD_MOE_PAIRX_STEPS"
PAIRX_STEPS = switches.choice(PAIRX_STEPS_ENV, AUTO_OFF, "auto")  # read once
PAIRX_STEPS_WIDTHS = (2048, 6144)  # "auto": the model widths [from, below) that run it
PAIRX_GATE_UP = GemvConfig(block_n=4, num_warps=1, unroll=2, elementwise=True)


def pairx_steps(dim: int, which: str | None = None) -> bool:
    """Whether the pairx gate/up runs q4_k_pair.gate_up's steps (on PAIRX_GATE_UP) at model width dim (a row whole
    steps): which "auto" or "off" (default $SPARKD_MOE_PAIRX_STEPS)."""
    on = _auto_at(dim, which, PAIRX_STEPS, PAIRX_STEPS_ENV, PAIRX_STEPS_WIDTHS, "the pairx MoE gate/up's loop")
    return on and dim % (256 * PAIRX_GATE_UP.unroll) == 0


def pairx_way(kernels: Kernels, dim: int) -> str:
    """The pairx gate/up's loop ("loop" or "steps": Kernels.pairx_gate_up) at model width dim."""
    if kernels.pairx_gate_up is not None:
        return kernels.pairx_gate_up
    return "steps" if pairx_steps(dim) else "loop"


# Session 21 (moe48, H200, bench/results/moe48_h200_s21_call2_*): the integer down's two expert ranges folded in the
# launch by matmul.fold_pair (each program exchanges its sums into its rows' slots; the second holds both: one atomic
# round trip) instead of fold_part (store, fence, ticket, read-back: ~1.5 us of the 4096 down, moe39's twin). At
# 4096x1536 Q8_0 top-8 with the loads ahead (DOWN_AHEAD_WIDTHS), the layer after the norm ("all qx"): 53.7 / 53.8 ->
# 52.0 / 52.3 us (-3.0 %) in one process, 53.3 / 53.4 -> 51.9 / 52.0 (-2.6 %) in a second, the same bits. Session 21
# (down49, bench/results/down49_h200_s21_*, two processes each, interleaved): Q8_0 2048x768 (2/1/3/e/2, the loads
# ahead) 19.2 / 19.2 -> 18.4 / 18.4 (-4.2 %) and 19.3 / 19.2 -> 18.6 / 18.6 (-3.4 %); 7168x2048 (the grid down on
# 2/1/2/e/2) 111.9 / 114.5 -> 109.4 / 111.3 (-2.5 %) and 112.8 / 112.3 -> 109.9 / 110.0 (-2.3 %); the pairx down's
# 2-range tile at 2048 (PAIRX_DOWN) runs it. By down type: the widths measured (Q4_K's 2-range downs from 6144 were
# not). "off": fold_part at every width.
PAIR_FOLD_ENV = "SPARKD_MOE_PAIR_FOLD"
PAIR_FOLD = switches.choice(PAIR_FOLD_ENV, AUTO_OFF, "auto")  # read once
# "auto": the model widths [from, below) that run it, by down type
PAIR_FOLD_WIDTHS = {"Q8_0": (2048, 8192), "Q4_K_TILED": (2048, 4096)}


def pair_fold(dim: int, down_type: str = "Q8_0", which: str | None = None) -> bool:
    """Whether the integer down's two expert ranges fold by matmul.fold_pair at model width dim for down type
    down_type (a family's name): which "auto" or "off" (default $SPARKD_MOE_PAIR_FOLD)."""
    return _auto_at(dim, which, PAIR_FOLD, PAIR_FOLD_ENV, PAIR_FOLD_WIDTHS.get(down_type, (0, 0)),
                    "the MoE down's fold")


# Session 21 (down49, H200, bench/results/down49_h200_s21_*): the pairx (Q4_K_TILED) down at model widths 2048-4095
# in 2 ranges of 4 experts on 4/1/3/e/2 (PAIRX_DOWN: one 3-group step an expert) with the next step's words loaded
# before this step's dots (q4_k_pair.down_sums) and the pair fold (PAIR_FOLD_WIDTHS), where the row is whole steps:
# 2048x768 Q4_KXD top-8 layer after the norm ("all qx") 14.8 / 14.7 / 14.8 / 14.7 -> 13.8 x 4 (-6.4 %), and 14.8 /
# 14.8 -> 13.8 x 4 (-6.8 %) in a second process; the down alone 6.3 -> 7.5 (its last programs' tail is what the layer
# waits on). 2 ranges without the loads ahead 15.0, the loads ahead on 4 ranges 14.7 (a tie). At 4096x1536 every 2-range
# form lost (33.8-37.4 against 31.5-31.6 us) and the loads ahead on 4 ranges tied (31.6): the tile as before there.
# Other float rounding than the 4-range tile (the experts summed in 2 ranges), within the fp32 bound. "off": the
# 4-range tile and the grid loop at every width.
PAIRX_DOWN_ENV = "SPARKD_MOE_PAIRX_DOWN"
PAIRX_DOWN = switches.choice(PAIRX_DOWN_ENV, AUTO_OFF, "auto")  # read once
# Session 48 (H100, docs/runs/2026-12-06-s48/call3-5, Q4_KXD top-8 "all qx"): with its first step's weight words
# loaded before its PDL wait (DOWN_EARLY) the loads ahead won from width 4096 too, on the width tiers' tiles:
# 4096x1536 39.2-39.3 -> 37.9-38.0 us (0.72 -> 0.75 of the 2 GiB copy; another process 38.0-38.2 -> 36.8, 0.77),
# 5120x1536 47.0-47.1 -> 46.2-46.3, 6144x2048 68.6-69.4 -> 68.2-68.8, 7168x2048 76.8-77.2 -> 76.4-76.6; the 2-range
# tile stays below 4096
PAIRX_DOWN_WIDTHS = (2048, 1 << 30)  # "auto": the model widths [from, below) that run it
PAIRX_DOWN_TILE = GemvConfig(block_n=4, num_warps=1, unroll=3, elementwise=True, split=2)
PAIRX_DOWN_TILE_BELOW = 4096  # PAIRX_DOWN_TILE's widths: [PAIRX_DOWN_WIDTHS[0], this)


def pairx_down(dim: int, which: str | None = None) -> bool:
    """Whether the pairx down loads the next step's words ahead (q4_k_pair.down_sums) at model width dim: which
    "auto" or "off" (default $SPARKD_MOE_PAIRX_DOWN)."""
    return _auto_at(dim, which, PAIRX_DOWN, PAIRX_DOWN_ENV, PAIRX_DOWN_WIDTHS, "the pairx MoE down's loop")


# Session 48: the pairx down (q4_k_pair.down_sums) loads its first step's weight words before its PDL wait, the gate/up
# letting it launch only after its own wait (pdl.py's exception), wherever it runs (moe._early); the same bits.
# Measured with the widths above. "off": the wait first, as before.
DOWN_EARLY_ENV = "SPARKD_MOE_DOWN_EARLY"
DOWN_EARLY = switches.choice(DOWN_EARLY_ENV, AUTO_OFF, "auto")  # read once


def down_early(which: str | None = None) -> bool:
    """Whether the pairx down loads its first weight words before its wait: which "auto" or "off" (default
    $SPARKD_MOE_DOWN_EARLY)."""
    return _auto_at(0, which, DOWN_EARLY, DOWN_EARLY_ENV, (0, 1), "the MoE down's early weight words")  # any width


def pairx_down_fits(p: PreparedTable, which: str | None = None) -> bool:
    """Whether the "new" tiles give a pairx down PAIRX_DOWN_TILE: pairx_down at the model width (which: "auto" or
    "off") and an expert's row whole steps of the tile."""
    return p.down.qtype.name == "Q4_K_TILED" and p.table.width % (256 * PAIRX_DOWN_TILE.unroll) == 0 \
        and p.table.dim < PAIRX_DOWN_TILE_BELOW and pairx_down(p.table.dim, which)
