"""The integer MoE decode (moe_decode: gate/up with activation, routing weight and h quantized in
the launch, as the engine runs it; down with its in-launch fold) at the shapes of large MoE models,
old tiles next to the default and candidates, as a fraction of the copy bandwidth of the same run.

Usage: PYTHONPATH=.:bench python bench/moe_tiles_bench.py [--types Q8_0,Q4_K]
       [--shapes 2048x768x8,4096x1536x8,7168x2048x8] [--gate-up T,...] [--down T,...] [--json F]
       [--defaults-only] [--compile-workers N] [--sets old,s5,s6] [--no-twins] [--floor] [--twin-loads vec,p13,vecp16]

Shapes are DxFxA (model width, expert width, experts per token): Qwen3-30B-A3B, Qwen3-235B-A22B,
DeepSeek-V3 / Kimi-K2. Rows per shape and type: "old" (moe_tiles.OLD_DECODE_TILES), "s5" (session 5's
tiles), both with moe_tiles.OLD_KERNELS, and "default" (moe_tiles.decode_tiles and moe_tiles.decode_kernels) as whole
moe_decode calls (x quantized, gate/up, down: 3 launches), then each launch alone, then each
gate/up candidate (down at its default) and each down candidate (gate/up at its default) timed
alone. Tiles: rows/warps/unroll/e|g[/split] as in gemv_tiles_bench.tile, then +pN (pipeliner
stages), then :FLAGS, the kernels (moe_tiles.Kernels): w Q8_0 words, p gate and up in one loop, v (V) Q4_K
headers as 128-bit loads in gate/up (the down), - none (no ":": moe_tiles.Kernels()); each down
candidate is timed alone and as a whole layer. Bytes per row: the selected experts' gate+up, down, or both; every tile is
first checked against the float64 reference through a whole moe_decode call (err). Timing as
kernels_bench: one CUDA graph over expert sets rotated past the L2, median of 15. The kernels
are compiled first by --compile-workers processes at the smallest shape (the same
specializations), so the timed process finds them in Triton's cache.

Session 7 (moe12): frac_same, the part's time over that of a device copy of the same bytes (half
read, half written, rotated and timed the same way: gemv_tiles_bench.same_copy_seconds), the
ceiling of a launch that small; "all qx" rows, the layer as the engine runs it after the norm (x
quantized before: 2 launches); "twin" rows (unless --no-twins), bench/moe_twin.py's load-only
launches at a tile's grid, steps and bytes: a twin near its kernel means the loads' structure
bounds the launch, a twin much faster means the kernel's instructions do. --sets: the tile sets
timed (moe_tiles.TILE_SETS; "new", the default, always). Session 8 (moe17): "down twin+fold" rows, the
down's twin with the down's in-launch fold (matmul.fold_part): the fold's share of a down's time.
Session 8 (fold19): a down tile's mode may end in "n" (4/1/1/gn/8, gemv_tiles_bench.NO_FOLD): the down
storing its partials with no fold (times only, err meaningless), timed alone; a --gate-up / --down item
TYPE@tile is timed for that type only (Q8_0@4/1/1/g/4). Session 12 (moe22): every gate/up and down
candidate is also timed as the whole layer the engine runs ("all qx"): a launch alone faster is not yet a
layer faster (the two launches overlap by PDL as they may). Session 13 (moe23): --variants off,late,start,again
times the default tiles' "all qx" layer also with PDL off (every launch), with the down let launch only after
the gate/up's loop (moe_tiles.Kernels.down_at_start False) or at its start (True; the default by width:
moe_tiles.down_launch_at_start), and the default once more (the drift between); session 20 (moe46): ahead / behind,
the Q8_0 down's loop with the next step's words loaded ahead or not (Kernels.down_ahead), NAME@TILE at down tile
TILE, in the order given (again,ahead,again,ahead interleaves them), and a down tile's flag a the same. Session 17 (moe39): --floor,
"floor" rows per shape and type (floor_rows): the layer's bytes as one copy, as the gate/up's then the down's in
two copies (torch's, and a Triton copy with and without PDL), and a line "floor:" of each "all qx" layer's time
against the pairs (the fraction of the floor the layer reaches). Session 18 (moe41): --twin-loads, the default
gate/up twin again with its weights as 128-bit loads (vec: moe_twin.gate_up's vec, offsets on 16 bytes) and/or on a
persistent grid of N programs an SM (pN, vecpN), GGUF types only. Session 19 (moe42): a trailing f (vecp16f), that
twin with the next step's words loaded before this step's arithmetic; --pipe PER[@TILE],..., the Q8_0 layer and gate/up
with moe_pipe's software-pipelined persistent gate/up, PER programs an SM (moe_tiles.Kernels.pipe; 0: the grid kernel,
the "default" rows' before the pipe became the default at 4096), at the default gate/up tile or TILE (rows/warps/unroll/e).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing as mp

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as T

import kernels_bench as kb
import gemv_tiles_bench
import moe_twin
from sparkd.engine.kernels import act_quant, dispatch, moe, moe_tiles, pdl
from sparkd.engine.kernels.matmul import GemvConfig

SHAPES = [(2048, 768, 8), (4096, 1536, 8), (7168, 2048, 8)]
# session 9 (moe20): --types Q4_KX, Q4_K experts with gate and up repacked into the tiled GEMV's bytes
# (moe.tiled_gate_up, pairx by default), the down in GGUF blocks; err against the GGUF bytes. Session 10
# (moe21): Q4_KXD, the down repacked too (moe.tiled_down)
PACKED, PACKED_DOWN = "Q4_KX", "Q4_KXD"


class _Packed:
    """Q4_K experts repacked at load as the engine does: gate/up (down too if `down`)."""

    def __init__(self, name: str, down: bool):
        self.name, self.down = name, down


PACKED_TYPES = {name: _Packed(name, name == PACKED_DOWN) for name in (PACKED, PACKED_DOWN)}


def qtype_of(name: str):
    """A --types name: a GGUF type, or a PACKED_TYPES marker."""
    return PACKED_TYPES.get(name) or T[name]
# session 6 candidates (the old, s5 and default tiles are timed anyway): the session-5 tiles with
# each kernel alone (:w, :p) and both, then more bytes per loop step where words or the pair loop
# freed registers (moe_kernels_sass.py: one-warp tiles at <= 64 registers keep 32 programs per SM)
GATE_UP = {"Q8_0": ["2/1/2/e:w", "2/1/2/e:p", "2/1/1/e", "1/1/2/e", "4/1/1/e", "2/1/2/g", "1/1/4/e", "2/1/4/e:w"],
           "Q4_K": ["4/1/2/e", "2/1/1/e", "2/1/2/e", "4/1/1/e:-", "4/1/2/g", "8/1/1/e"], PACKED: ["4/1/2/e"], PACKED_DOWN: []}
DOWN = {"Q8_0": ["4/1/1/g/8", "2/1/4/e/8", "2/1/2/e/8", "4/1/2/g/8", "4/1/2/e/8", "2/1/4/e/4", "4/1/1/g/4",
                 "2/1/8/e/8"],
        "Q4_K": ["4/1/2/e/4", "4/1/3/e/4", "4/1/4/e/2", "8/1/2/e/2", "4/1/2/e/2", "4/1/3/e/8"], PACKED: [],
        PACKED_DOWN: ["4/1/1/e/2", "4/1/2/e/2", "4/1/2/e/4", "4/1/1/e/4", "4/1/2/e/8", "4/1/4/e/2",
                      "4/1/2/e/2:wpvVf"]}
DEVICE = "cuda"


def tile(text: str) -> GemvConfig:
    """gemv_tiles_bench.tile's rows/warps/unroll/e|g[/split], then +pN for N pipeliner stages,
    then :FLAGS (the kernels: kernels_of)."""
    text, _, stages = text.partition(":")[0].partition("+p")
    return dataclasses.replace(gemv_tiles_bench.tile(text), stages=int(stages or 0))


# session 17 (moe39, --floor): the copies a layer's two launches could reach at best, the same bytes read + written
# as gemv_tiles_bench.same_copy_seconds; a Triton copy too, so the down's copy can launch under PDL as the down does
COPY_BLOCK = 2048  # int32 words a program: 8 KiB, 4 warps (16 words, 4 128-bit loads a thread)


@triton.jit
def _copy_kernel(src, dst, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    pdl.start(PDL)  # the next copy may launch now and wait for this one's end, as the down for the gate/up
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def triton_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src (int32) in one launch of _copy_kernel, under PDL where pdl.enabled."""
    _copy_kernel[(triton.cdiv(src.numel(), COPY_BLOCK),)](src, dst, src.numel(), BLOCK=COPY_BLOCK, num_warps=4,
                                                          **pdl.launch(src.device))


def floor_seconds(parts: list[int], copy) -> float:
    """Seconds of copies one after another (parts: bytes read + written each) in one CUDA graph, each part's bytes
    rotated past the L2 as the weights are (copy(src, dst): torch's or triton_copy)."""
    words = [n // 8 for n in parts]  # int32 words copied: half the bytes read, half written
    sets = max(2, -(-kb.ROTATE_BYTES // sum(parts)))
    bufs = [(torch.randint(0, 1 << 30, (sets * w,), dtype=torch.int32, device=DEVICE),
             torch.empty(sets * w, dtype=torch.int32, device=DEVICE)) for w in words]

    def run(i):
        for w, (src, dst) in zip(words, bufs):
            copy(src[i * w:(i + 1) * w], dst[i * w:(i + 1) * w])
    return kb.graph_seconds(run, sets)


def floor_rows(s: "Shape", copy_bw: float) -> list[dict]:
    """The layer's floor (--floor): one copy of all its bytes, then the gate/up's bytes and the down's as two copies
    in stream order (torch: no PDL), and as two Triton copies with and without PDL; the bytes of every row are the
    layer's (frac comparable with its "all qx" rows)."""
    A, mb = s.shape[2], s.matrix_bytes
    layer, pair = 3 * A * mb, [2 * A * mb, A * mb]
    torch_copy = lambda src, dst: dst.copy_(src)  # noqa: E731
    rows = []
    for label, parts, copy, mode in (("torch 1 copy", [layer], torch_copy, "on"),
                                     ("torch pair", pair, torch_copy, "on"),
                                     ("triton 1 copy", [layer], triton_copy, "on"),
                                     ("triton pair pdl", pair, triton_copy, "on"),
                                     ("triton pair", pair, triton_copy, "off")):
        with pdl.using(mode):
            rows.append(s.row("floor", label, floor_seconds(parts, copy), layer, copy_bw, float("nan")))
    return rows


def kernels_of(text: str) -> moe_tiles.Kernels:
    """A tile text's :FLAGS as moe_tiles.Kernels (w: Q8_0 words, p: the pair loop, v / V:
    Q4_K headers as vectors in gate/up / the down, f: Q8_0 words unmasked where the shape allows,
    d: the down's groups a constant trip count where the shape allows, both types (moe14), a: the Q8_0 down's
    next step loaded ahead (session 20, moe46: Kernels.down_ahead), o: the down's two ranges folded by
    matmul.fold_pair (session 21, moe48: Kernels.down_pair_fold), A: the pairx down's next step loaded ahead
    (session 21, down49: Kernels.pairx_down_ahead); n: the pairx gate/up's constant trip count,
    the tile's unroll a step (session 21, q4k48: Kernels.pairx_gate_up "steps"; else its "loop"); no ":": the
    default)."""
    if ":" not in text:
        return moe_tiles.Kernels()
    flags = text.partition(":")[2]
    return moe_tiles.Kernels(words="w" in flags, pair="p" in flags, q4k_vec="v" in flags,
                             q4k_vec_down="V" in flags, full="f" in flags,
                             down_full=("Q8_0", "Q4_K", "Q4_K_TILED") if "d" in flags else (),
                             down_ahead="a" in flags, down_pair_fold="o" in flags, pairx_down_ahead="A" in flags,
                             pairx_gate_up="steps" if "n" in flags else "loop")


def engine_tiles(p: moe.PreparedTable, gu: GemvConfig | None, dn: GemvConfig | None,
                 which: str = "new") -> tuple[GemvConfig, GemvConfig]:
    """The tiles as the engine passes them (layers/moe.py): h quantized in the gate/up launch."""
    base = moe_tiles.decode_tiles(p, which)
    return dataclasses.replace(gu or base[0], fuse_quant=True), dn or base[1]


class Shape:
    """One shape and type: rotated expert sets, x, weights (seeded)."""

    def __init__(self, qtype: T, shape: tuple[int, int, int], reference: bool = True):
        D, F, A = shape
        torch.manual_seed(0)  # the same experts, x and weights every run: an error seen once is seen again
        self.qtype, self.shape = qtype, shape
        base = T.Q4_K if isinstance(qtype, _Packed) else qtype
        self.matrix_bytes = F * dispatch.FAMILIES[base].row_bytes(D)  # gate, up and down alike
        n = max(2, -(-kb.ROTATE_BYTES // (3 * A * self.matrix_bytes)))
        n = n if reference else 2  # compiling only
        full = table(base, n * A, shape, self.matrix_bytes)
        first = list(range(A))[::-1]
        self.ref = kb.subset(full, first)  # set 0 in GGUF blocks (err)
        if isinstance(qtype, _Packed):
            self.ref = dataclasses.replace(self.ref, gate=full.gate.clone())
            self.ref = dataclasses.replace(self.ref, up=self.ref.gate, down=self.ref.gate)
            full = moe.tiled_gate_up(full)
            full = moe.tiled_down(full) if qtype.down else full
        # each set's experts in descending slot order: the table, not the layout, decides
        self.sets = [moe.prepare(kb.subset(full, list(range(s * A, (s + 1) * A))[::-1]), DEVICE) for s in range(n)]
        self.x, self.w = torch.randn(D, device=DEVICE), torch.rand(A, device=DEVICE)
        self.y = torch.empty(D, device=DEVICE)
        self.name = f"moe {D}x{F} top{A}"
        self.same: dict[int, float] = {}  # same-bytes copy seconds by bytes (same_seconds)

    def call(self, i: int, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels) -> torch.Tensor:
        return moe.moe_decode(self.sets[i % len(self.sets)], self.x, self.w, out=self.y, gate_up=gu, down=dn,
                              kernels=k)

    def err(self, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels) -> float:
        """kb.moe_err of set 0 at these tiles: the float64 reference over the engine's own rounded h."""
        self.y.fill_(float("nan"))
        return kb.moe_err(self.sets[0], self.x, self.w, self.call(0, gu, dn, k), gu, k, self.ref)

    def same_seconds(self, nbytes: int) -> float:
        """gemv_tiles_bench.same_copy_seconds(nbytes), once per byte count: the copy of the bytes the
        part reads, the ceiling of a launch that small."""
        if nbytes not in self.same:
            self.same[nbytes] = gemv_tiles_bench.same_copy_seconds(nbytes)
        return self.same[nbytes]

    def row(self, part: str, label: str, sec: float, nbytes: int, copy_bw: float, err: float) -> dict:
        return dict(kernel=f"{self.name} {part}", type=self.qtype.name, config=label, us=sec * 1e6, bw=nbytes / sec,
                    frac=nbytes / sec / copy_bw, frac_same=self.same_seconds(nbytes) / sec, err=err)

    def whole(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        err = self.err(gu, dn, k)
        sec = kb.graph_seconds(lambda i: self.call(i, gu, dn, k), len(self.sets))
        return self.row("all", label, sec, 3 * self.shape[2] * self.matrix_bytes, copy_bw, err)

    def engine(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        """The whole layer as the engine runs it after the norm: x quantized before (qx), 2 launches."""
        err = self.err(gu, dn, k)
        qx = act_quant.quantize(self.x[None], self.sets[0].gate_up.act_fmt)

        def run(i):
            moe.moe_decode(self.sets[i % len(self.sets)], self.x, self.w, out=self.y, gate_up=gu, down=dn, kernels=k,
                           qx=qx)
        sec = kb.graph_seconds(run, len(self.sets))
        return self.row("all qx", label, sec, 3 * self.shape[2] * self.matrix_bytes, copy_bw, err)

    def twin_gate_up(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float,
                     vec: bool = False, persist: int = 0, ahead: bool = False) -> dict:
        """moe_twin.gate_up at gu's grid and steps (loads only; x quantized before); vec, persist, ahead: its 128-bit
        loads, its persistent grid of that many programs, the next step's words loaded ahead (--twin-loads)."""
        qx = act_quant.quantize(self.x[None], self.sets[0].gate_up.act_fmt)
        out = torch.empty(self.shape[2], self.shape[1], dtype=torch.float32 if isinstance(self.qtype, _Packed) else torch.int32,
                          device=DEVICE)
        sec = kb.graph_seconds(lambda i: moe_twin.gate_up(self.sets[i % len(self.sets)], qx, out, gu, vec, persist, ahead),
                               len(self.sets))
        return self.row("gate/up twin", label, sec, 2 * self.shape[2] * self.matrix_bytes, copy_bw, float("nan"))

    def twin_down(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        """moe_twin.down at dn's grid, steps and ranges (loads only; h as gate/up quantizes it)."""
        rw = self.w.contiguous()
        h = moe._gate_up(self.sets[0], self.x, rw, False, "silu", gu, None, "bench", None, k)
        out = torch.empty(max(1, min(dn.split, self.shape[2])), self.shape[0], dtype=down_twin_dtype(self.sets[0]),
                          device=DEVICE)
        sec = kb.graph_seconds(lambda i: moe_twin.down(self.sets[i % len(self.sets)], h, out, dn), len(self.sets))
        return self.row("down twin", label, sec, self.shape[2] * self.matrix_bytes, copy_bw, float("nan"))

    def twin_fold(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        """twin_down with the down's in-launch fold (moe_twin.down's y; moe17): the fold's share."""
        rw = self.w.contiguous()
        h = moe._gate_up(self.sets[0], self.x, rw, False, "silu", gu, None, "bench", None, k)
        out = torch.empty(max(1, min(dn.split, self.shape[2])), self.shape[0], dtype=torch.float32, device=DEVICE)
        sec = kb.graph_seconds(lambda i: moe_twin.down(self.sets[i % len(self.sets)], h, out, dn, self.y),
                               len(self.sets))
        return self.row("down twin+fold", label, sec, self.shape[2] * self.matrix_bytes, copy_bw, float("nan"))

    def gate_up(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        """x quantized and the gate/up launch (h quantized in it), as moe_decode runs them."""
        err = self.err(gu, dn, k)
        rw = self.w.contiguous()

        def run(i):
            return moe._gate_up(self.sets[i % len(self.sets)], self.x, rw, False, "silu", gu, None, "bench", None, k)
        sec = kb.graph_seconds(run, len(self.sets))
        return self.row("gate/up", label, sec, 2 * self.shape[2] * self.matrix_bytes, copy_bw, err)

    def down(self, label: str, gu: GemvConfig, dn: GemvConfig, k: moe_tiles.Kernels, copy_bw: float) -> dict:
        """The down launch alone (its in-launch fold included) on h quantized by gate/up."""
        err = self.err(gu, dn, k)
        rw = self.w.contiguous()
        h = moe._gate_up(self.sets[0], self.x, rw, False, "silu", gu, None, "bench", None, k)

        def run(i):
            moe._down(self.sets[i % len(self.sets)], h, rw, self.y, dn, None, None, k)
        sec = kb.graph_seconds(run, len(self.sets))
        return self.row("down", label, sec, self.shape[2] * self.matrix_bytes, copy_bw, err)


def down_twin_dtype(p: moe.PreparedTable) -> torch.dtype:
    """moe_twin.down's out: float32 for a tiled down (the pair twin), else int32."""
    return torch.float32 if p.down.row_tile > 1 else torch.int32


def table(qtype: T, n_experts: int, shape: tuple[int, int, int], matrix_bytes: int) -> moe.ExpertTable:
    """kernels_bench.moe_table's layout (4 KiB-aligned slots of gate | up | down in one arena) on DEVICE."""
    slot = -(-3 * matrix_bytes // 4096) * 4096
    arena = kb.random_blocks(qtype, n_experts * slot, DEVICE)
    offs = [[e * slot + k * matrix_bytes for e in range(n_experts)] for k in range(3)]
    return moe.ExpertTable(arena, arena, arena, *offs, qtype, qtype, shape[0], shape[1])


def candidates(qtype: T, args) -> tuple[list[str], list[str]]:
    if args.defaults_only:
        return [], []
    def given(text, default):  # "" times none; TYPE@tile: that type's only
        if text is None:
            return default
        named = [t.partition("@") if "@" in t else ("", "", t) for t in text.split(",") if t]
        return [t for name, _, t in named if name in ("", qtype.name)]
    return given(args.gate_up, GATE_UP[qtype.name]), given(args.down, DOWN[qtype.name])


SETS = moe_tiles.TILE_SETS  # --sets
# --variants: (PDL mode, kernels) of the default layer's extra rows; session 20 (moe46): "ahead" / "behind", the Q8_0
# down's next step loaded ahead or not (Kernels.down_ahead), so a list interleaves them (again,ahead,again,ahead), and
# NAME@TILE, the variant at down tile TILE (ahead@4/1/2/e/2); session 21 (moe48): "fold2" / "afold2", the down's two
# ranges folded by matmul.fold_pair (Kernels.down_pair_fold), without / with "ahead"; "tickets", fold_part's fold
# (the default before it at 4096-6143; with "behind": SPARKD_MOE_DOWN_AHEAD=off SPARKD_MOE_PAIR_FOLD=off); session 21
# (down49): "pahead" / "pafold2", the pairx down's next step loaded ahead (Kernels.pairx_down_ahead), with the pair
# fold by width / always (pafold2@4/1/3/e/2); session 48: "pahead" with its wait first (Kernels.down_early False),
# "pearly" with its first step's weight words before it (the default since)
VARIANTS = ("off", "late", "start", "again", "ahead", "behind", "fold2", "afold2", "tickets", "pahead", "pafold2",
            "pearly")


def variant(name: str, k: moe_tiles.Kernels) -> tuple[str, moe_tiles.Kernels, GemvConfig | None]:
    """A --variants name's PDL mode, kernels (k: the default's) and down tile (None: the default's)."""
    name, _, text = name.partition("@")
    at_start = {"late": False, "start": True}.get(name, k.down_at_start)
    ahead = {"ahead": True, "behind": False, "afold2": True}.get(name, k.down_ahead)
    pair_fold = {"fold2": True, "afold2": True, "tickets": False, "pafold2": True}.get(name, k.down_pair_fold)
    pairx_ahead = name in ("pahead", "pafold2", "pearly") or k.pairx_down_ahead
    early = {"pearly": True, "pahead": False}.get(name, k.down_early)
    return (("off" if name == "off" else "on"),
            dataclasses.replace(k, down_at_start=at_start, down_ahead=ahead, down_pair_fold=pair_fold,
                                pairx_down_ahead=pairx_ahead, down_early=early),
            tile(text) if text else None)


def baselines(p: moe.PreparedTable) -> list[tuple[str, GemvConfig, GemvConfig, moe_tiles.Kernels]]:
    """(label, gate/up, down, kernels) of the tile sets (SETS, "new" last as "default")."""
    return [(which if which != "new" else "default", *engine_tiles(p, None, None, which), moe_tiles.decode_kernels(which))
            for which in moe_tiles.TILE_SETS if which in SETS]


def shape_rows(qtype: T, shape: tuple[int, int, int], args, copy_bw: float) -> list[dict]:
    s = Shape(qtype, shape)
    sets = baselines(s.sets[0])
    timed = [(f"{label} {kb.tag(gu)}/{kb.tag(dn)}", part, gu, dn, k) for label, gu, dn, k in sets
             for part in (s.whole, s.engine)]
    timed += [(f"{label} {kb.tag(t)}", part, gu, dn, k) for label, gu, dn, k in sets
              for part, t in ((s.gate_up, gu), (s.down, dn))]
    if args.twins:  # each set's distinct tiles
        timed += list({(kb.tag(t), part.__name__): (f"{label} {kb.tag(t)}", part, gu, dn, k)
                       for label, gu, dn, k in sets
                       for part, t in ((s.twin_gate_up, gu), (s.twin_down, dn), (s.twin_fold, dn))}.values())
    rows = []
    for label, part, gu, dn, k in timed:
        try:
            rows.append(part(label, gu, dn, k, copy_bw))
        except Exception as e:  # noqa: BLE001 - a set that fails to build leaves the others
            print(f"FAILED {qtype.name} {shape} {label}: {type(e).__name__}: {e}", flush=True)
    print(f"{s.name} {qtype.name} same-bytes copies: " + ", ".join(
        f"{n / 1e6:.1f} MB {sec * 1e6:.1f} us ({n / sec / copy_bw:.2f})" for n, sec in sorted(s.same.items())),
        flush=True)
    new = sets[-1]
    for name in args.variants:
        mode, k, dn = variant(name, new[3])
        with pdl.using(mode):
            rows.append(s.engine(f"default {name}", new[1], dn or new[2], k, copy_bw))
            gemv_tiles_bench.print_rows(rows[-1:])
    if args.floor:
        rows += floor_rows(s, copy_bw)
    for item in args.pipe if qtype == T.Q8_0 else ():  # session 19: moe_pipe's gate/up (Kernels.pipe)
        per, _, text = item.partition("@")
        gu = dataclasses.replace(tile(text), fuse_quant=True) if text else new[1]
        k = dataclasses.replace(new[3], pipe=int(per))
        for part in (s.engine, s.gate_up):
            try:
                rows.append(part(f"default pipe {item}", gu, new[2], k, copy_bw))
                gemv_tiles_bench.print_rows(rows[-1:])
            except Exception as e:  # noqa: BLE001 - one device call measures everything it can
                print(f"FAILED {qtype.name} {shape} pipe {item}: {type(e).__name__}: {e}", flush=True)
    for name in args.twin_loads if not isinstance(qtype, _Packed) else ():  # session 18: the twin's load width, grid
        vec, _, per_sm = name.partition("p")
        ahead = per_sm.endswith("f")  # session 19: the next step's words loaded ahead (vecp16f)
        sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
        try:
            rows.append(s.twin_gate_up(f"default {kb.tag(new[1])} twin {name}", new[1], new[2], new[3], copy_bw,
                                       vec == "vec", int(per_sm.rstrip("f") or 0) * sms, ahead))
        except Exception as e:  # noqa: BLE001 - one device call measures everything it can
            print(f"FAILED {qtype.name} {shape} twin {name}: {type(e).__name__}: {e}", flush=True)
    gemv_tiles_bench.print_rows(rows)
    if args.floor:  # the layer against its floor: the pair of copies the two launches could reach at best
        layer = {r["config"]: r["us"] for r in rows if r["kernel"].endswith(" all qx")}
        floor = {r["config"]: r["us"] for r in rows if r["kernel"].endswith(" floor")}
        print(f"{s.name} {qtype.name} floor: " + ", ".join(
            f"{label} {us:.1f} us / {pair}: {floor[pair] / us:.2f}" for label, us in layer.items()
            for pair in ("torch pair", "triton pair pdl") if pair in floor), flush=True)
    gus, dns = candidates(qtype, args)
    # (session 12: each candidate's layer as the engine runs it too, "all qx": two launches overlap as they may)
    gu_parts = (s.gate_up, s.engine, s.twin_gate_up) if args.twins else (s.gate_up, s.engine)
    dn_parts = (s.down, s.whole, s.engine, s.twin_down, s.twin_fold) if args.twins else (s.down, s.whole, s.engine)
    timed = [(t, part, dataclasses.replace(tile(t), fuse_quant=True), new[2]) for t in gus for part in gu_parts] + \
        [(t, part, new[1], tile(t)) for t in dns for part in (dn_parts if tile(t).fold != gemv_tiles_bench.NO_FOLD
                                                               else (s.down,))]
    for t, part, gu, dn in timed:
        try:
            rows.append(part(t, gu, dn, kernels_of(t), copy_bw))
            gemv_tiles_bench.print_rows(rows[-1:])
        except Exception as e:  # noqa: BLE001 - a tile that fails to build leaves the others
            print(f"FAILED {qtype.name} {shape} {t}: {type(e).__name__}: {e}", flush=True)
    del s
    torch.cuda.empty_cache()
    return rows


def warm(job: tuple[str, tuple[int, int, int], list[str], list[str], tuple[str, ...]]) -> str:
    """Compile one type's kernels for the given tiles (a worker process: Triton's disk cache)."""
    global SETS
    name, shape, gus, dns, SETS, variants = job
    qtype = qtype_of(name)
    gguf = T.Q4_K if isinstance(qtype, _Packed) else qtype
    s = Shape(qtype, shape, reference=False)
    sets = baselines(s.sets[0])
    base, k = sets[-1][1:3], sets[-1][3]
    pairs = [(gu, dn, kk) for _, gu, dn, kk in sets]
    pairs += [(dataclasses.replace(tile(t), fuse_quant=True), base[1], kernels_of(t)) for t in gus]
    pairs += [(base[0], tile(t), kernels_of(t)) for t in dns]
    tiers = moe_tiles.WIDTH_TIERS[gguf.name]  # the wider shapes' tiles, compiled here at the smallest
    wide = [(dataclasses.replace(t[1] or base[0], fuse_quant=True), t[2] or base[1], k) for t in tiers]
    pairs += wide
    if "s5" in SETS:
        pairs += [(sets[1][1], moe_tiles.S5_LARGE_DOWN_TILES[gguf.name][1], moe_tiles.OLD_KERNELS)]
    failed = []
    for mode, kk, vdn in {variant(v, k) for v in variants}:  # the variants' specializations, every width's tiles
        for gu, dn, _ in [(*base, k)] + wide:
            try:
                with pdl.using(mode):
                    s.call(0, gu, vdn or dn, kk)
            except Exception as e:  # noqa: BLE001 - the timed run reports it again
                failed.append(f"{mode} {kb.tag(gu)}/{kb.tag(dn)}: {type(e).__name__}")
    qx = act_quant.quantize(s.x[None], s.sets[0].gate_up.act_fmt)
    for gu, dn, kk in pairs:
        try:
            s.call(0, gu, dn, kk)
            h = moe._gate_up(s.sets[0], s.x, s.w, False, "silu", gu, None, "bench", None, kk)
            moe_twin.gate_up(s.sets[0], qx, torch.empty(shape[2], shape[1], dtype=torch.float32 if isinstance(qtype, _Packed)
                                                        else torch.int32, device=DEVICE), gu)
            moe_twin.down(s.sets[0], h, torch.empty(shape[2], shape[0], dtype=down_twin_dtype(s.sets[0]), device=DEVICE),
                          dn)
            moe_twin.down(s.sets[0], h, torch.empty(shape[2], shape[0], device=DEVICE), dn, s.y)
        except Exception as e:  # noqa: BLE001 - the timed run reports it again
            failed.append(f"{kb.tag(gu)}/{kb.tag(dn)}: {type(e).__name__}")
    torch.cuda.synchronize()
    return f"{name} {len(pairs)} tile pairs {' '.join(failed)}"


def precompile(types: list[T], shape: tuple[int, int, int], args) -> None:
    jobs = []
    for qtype in types:
        gus, dns = candidates(qtype, args)
        jobs.append((qtype.name, shape, [], [], SETS, args.variants))  # the defaults (and the old tiles)
        jobs += [(qtype.name, shape, [t], [], SETS, ()) for t in gus] + \
            [(qtype.name, shape, [], [t], SETS, ()) for t in dns]
    with cf.ProcessPoolExecutor(args.compile_workers, mp_context=mp.get_context("spawn")) as ex:
        for done in ex.map(warm, jobs):
            print(f"compiled {done}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="DxFxA,...")
    ap.add_argument("--gate-up", default=None, help="gate/up tiles to time instead of GATE_UP[type] (\"\": none)")
    ap.add_argument("--down", default=None, help="down tiles to time instead of DOWN[type]")
    ap.add_argument("--defaults-only", action="store_true")
    ap.add_argument("--compile-workers", type=int, default=0, help="processes compiling first (0: none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sets", default=",".join(moe_tiles.TILE_SETS), help="tile sets timed (moe_tiles.TILE_SETS)")
    ap.add_argument("--no-twins", dest="twins", action="store_false", help="no load-only twins (moe_twin)")
    ap.add_argument("--variants", default="", help=f"the default layer's extra rows ({','.join(VARIANTS)})")
    ap.add_argument("--floor", action="store_true", help="the layer's floor: copies of its bytes (floor_rows)")
    ap.add_argument("--twin-loads", default="", help="the default gate/up twin's extra rows: vec (128-bit loads), "
                    "pN (a persistent grid, N programs an SM), vecpN (both), base (as the twin row); a trailing f "
                    "(p16f, vecp16f): the next step's words loaded ahead")
    ap.add_argument("--pipe", default="", help="Q8_0: the default layer's rows with moe_pipe's gate/up, PER[@TILE] "
                    "(programs an SM: moe_tiles.Kernels.pipe; the gate/up tile), comma-separated")
    args = ap.parse_args()
    args.pipe = [item for item in args.pipe.split(",") if item]
    args.twin_loads = [v for v in args.twin_loads.split(",") if v]
    args.variants = [v for v in args.variants.split(",") if v]
    if {v.partition("@")[0] for v in args.variants} - set(VARIANTS):
        ap.error(f"--variants: one of {', '.join(VARIANTS)}")
    global SETS
    SETS = tuple(args.sets.split(",")) + ("new",)
    types = [qtype_of(n) for n in args.types.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.compile_workers:
        precompile(types, min(shapes), args)
    copy_bw = kb.copy_bandwidth()
    print("kernel / type / tile / us / GB/s / frac (2 GiB copy) / frac_same (same-bytes copy) / err", flush=True)
    print(f"device {torch.cuda.get_device_name()}  d2d copy {copy_bw / 1e9:.0f} GB/s (read+write)  "
          f"tiles {moe_tiles.DECODE_TILES} by width {moe_tiles.WIDTH_TIERS} "
          f"kernels {moe_tiles.decode_kernels()}", flush=True)
    rows = []
    for shape in shapes:
        for qtype in types:
            try:
                rows += shape_rows(qtype, shape, args, copy_bw)
            except Exception as e:  # noqa: BLE001 - one device call measures everything it can
                print(f"FAILED {qtype.name} {shape}: {type(e).__name__}: {e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bytes_per_second=copy_bw,
                           tiles={k: [str(c) for c in v] for k, v in moe_tiles.DECODE_TILES.items()}, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
