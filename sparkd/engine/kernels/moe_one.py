"""The Q8_0 MoE decode layer in one persistent launch (session 20, moe45).

Why: the engine's layer is two launches (the gate/up, then the down under PDL), and at model width 2048 even two
plain copies of the layer's bytes in two launches stay under issue 8's 0.75 of a copy (session 17's "two-launch
floor"); one launch has no second launch, no PDL wait and no tail of the first launch in front of the down.

How: a grid of programs that are all resident at once (programs(): the compiled kernel's registers and shared memory
say how many fit an SM) walks the items pid, pid + P, ... of one list, the gate/up's (row tile, expert) tiles first,
then the down's (expert range, row tile) tiles, range by range. A gate/up tile runs moe_pipe's loop (the next
step's weight words in flight during this step's dots; OUT, moe._gate_up_out, its end: h quantized by a block's
last tile), then bumps its expert's counter with release semantics. A down tile reads expert a's h only once a's
counter shows all of a's gate/up tiles done (acquire), so the down starts on the experts already done while the
gate/up's last round runs. Static order with every program resident is progress: a tile waits only for items earlier
in the list, which programs that are not waiting run.

The counters are int64 and never reset: each launch adds one per gate/up tile, so launch k takes expert a's from
k * tiles to (k + 1) * tiles, and a program learns k from the value its own first gate/up tile's add returned (every
program has one: P <= the gate/up tiles). Nothing between replays of a CUDA graph; one counter set per (device,
experts, tiles an expert), so launches of another shape never mix into them.

The same h and y bits as the two launches: each gate/up tile's groups onto its elementwise tile in order (any
unroll, moe_pipe's), the down tile's experts in range order with the grid down's elementwise words step (its fused
multiply-adds written out: _down_rows), the ranges met by matmul.fold_part. Under the interpreter (programs run one after another) the launch is one program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl, q8_0_words
from sparkd.engine.kernels.matmul import fold_part
from sparkd.engine.kernels.moe_pipe import _step_dots, _step_words, _tile_rows

MAX_PER_SM = 32  # Hopper's blocks an SM
SM_REGISTERS = 65536
SM_SHARED_BYTES = 228 * 1024
BLOCK_RESERVED_SHARED_BYTES = 1024  # what the driver keeps a block (sm_80 and later)


@triton.jit
def _acquire(ptr, EMU: tl.constexpr):
    """The int64 at ptr, read with acquire semantics (gpu scope): an ld.acquire, no read-modify-write on the
    counters every down tile reads; the interpreter (EMU: no inline PTX) an atomic add of 0."""
    # (one return: triton 3.6 compiles the code after a return in a constexpr if too)
    if EMU:
        c = tl.atomic_add(ptr, 0, sem="acquire")
    else:
        c = tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [ptr], dtype=tl.int64,
                                      is_pure=False, pack=1)
    return c


@triton.jit
def _wait(ptr, target, EMU: tl.constexpr):
    """Spin until the counter at ptr reaches target, polling with volatile loads (an acquire at gpu scope empties the
    SM's L1, which the other programs on it read x and h from: session 20's first call, spinning on ld.acquire, ran
    the layer 1.5x slower), then one acquire; after it every thread's loads see what the releases published."""
    c = tl.load(ptr, volatile=True)
    while c < target:
        c = tl.load(ptr, volatile=True)
    _acquire(ptr, EMU)
    tl.debug_barrier()


@triton.jit
def _gate_up_tiles(gate_ptr, up_ptr, gate_off, up_off, ids_ptr, xw_ptr, xd_ptr, rw_ptr, h_ptr, hd_ptr, hs_ptr,
                   hf_ptr, tickets_ptr, cnt_ptr, F, row_bytes, n_tiles, IDS: tl.constexpr, OFF: tl.constexpr,
                   OUT: tl.constexpr, SUMS: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr,
                   G: tl.constexpr, UNROLL: tl.constexpr, BLOCK_N: tl.constexpr, EMU: tl.constexpr,
                   ACT: tl.constexpr, HBLOCK: tl.constexpr, H8K: tl.constexpr):
    """moe_pipe.gate_up_kernel's loop over this program's gate/up tiles, each tile's end followed by its expert's
    counter bumped (release) → this launch's target for every counter (its epoch's end)."""
    S: tl.constexpr = G // UNROLL  # steps a tile
    pid, progs = tl.program_id(0), tl.num_programs(0)
    tiles_f = F // BLOCK_N
    total = tl.cdiv(n_tiles - pid, progs) * S
    # (tiles clamped into the list: a launch of no gate/up tiles, launch's phase "down", reads tile 0's, unused)
    go, uo = _tile_rows(gate_off, up_off, ids_ptr, tl.maximum(tl.minimum(pid, n_tiles - 1), 0), tiles_f, row_bytes,
                        BLOCK_N, IDS, OFF)
    ngo, nuo = _tile_rows(gate_off, up_off, ids_ptr, tl.maximum(tl.minimum(pid + progs, n_tiles - 1), 0), tiles_f,
                          row_bytes, BLOCK_N, IDS, OFF)
    gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3 = _step_words(
        gate_ptr, up_ptr, go, uo, 0, UNROLL)
    acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
    acc_u = acc_g
    target = tl.zeros((), tl.int64)
    for i in range(total):
        s = i % S
        last = s == S - 1
        (ngw0, ngh0, nuw0, nuh0, ngw1, ngh1, nuw1, nuh1, ngw2, ngh2, nuw2, nuh2, ngw3, ngh3, nuw3,
         nuh3) = _step_words(gate_ptr, up_ptr, tl.where(last, ngo, go), tl.where(last, nuo, uo),
                             ((s + 1) % S) * UNROLL, UNROLL)
        acc_g, acc_u = _step_dots(gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1, gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3,
                                  xw_ptr, xd_ptr, s * UNROLL, acc_g, acc_u, UNROLL, EMU)
        if last:
            t = pid + (i // S) * progs
            a = t // tiles_f
            OUT(SUMS(acc_g, A1, A2, A3), SUMS(acc_u, A1, A2, A3), a, t % tiles_f, rw_ptr, h_ptr, hd_ptr, hs_ptr,
                hf_ptr, tickets_ptr, F, BLOCK_N, ACT, False, HBLOCK, H8K)
            tl.debug_barrier()  # every thread's h (and a block's quantization) stored before the release
            before = tl.atomic_add(cnt_ptr + a, 1, sem="release")
            target = tl.maximum(target, (before // tiles_f + 1) * tiles_f)
            acc_g = tl.zeros((BLOCK_N, A1, A2), tl.float32)
            acc_u = acc_g
            go, uo = ngo, nuo
            ngo, nuo = _tile_rows(gate_off, up_off, ids_ptr, tl.minimum(t + 2 * progs, n_tiles - 1), tiles_f,
                                  row_bytes, BLOCK_N, IDS, OFF)
        gw0, gh0, uw0, uh0, gw1, gh1, uw1, uh1 = ngw0, ngh0, nuw0, nuh0, ngw1, ngh1, nuw1, nuh1
        gw2, gh2, uw2, uh2, gw3, gh3, uw3, uh3 = ngw2, ngh2, nuw2, nuh2, ngw3, ngh3, nuw3, nuh3
    return target


@triton.jit
def _down_rows(w_ptr, row_off, hw_ptr, hd_ptr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, NG,
               BLOCK_N: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr, SUMS: tl.constexpr):
    """One expert's down row sums [BLOCK_N] on h's Q8_0 words: the grid down's step (q8_0_words.idot_full onto the
    elementwise tile, the groups in order) with its fused multiply-adds written out (q8_0_words.dot_words FMA),
    since this launch compiles without fp fusion for the gate/up's exact rounding while the down launch has it."""
    acc = tl.zeros((BLOCK_N, A1, A2), tl.float32)
    for g0 in range(0, NG, UNROLL):
        for u in tl.static_range(UNROLL):
            w, head = q8_0_words.words(w_ptr, row_off, g0 + u)
            acc = q8_0_words.dot_words(w, head, hw_ptr, hd_ptr, g0 + u, acc, EMU, not EMU)  # (interpreter: no fusion)
    return SUMS(acc, A1, A2, A3)


@triton.jit
def layer_kernel(gate_ptr, up_ptr, down_ptr, gate_off, up_off, down_off, ids_ptr, xw_ptr, xd_ptr, rw_ptr, h_ptr,
                 hd_ptr, hs_ptr, hf_ptr, tickets_ptr, fold_ptr, cnt_ptr, y_ptr, part_ptr, res_ptr, F, D, n,
                 row_bytes, down_row_bytes, n_tiles, IDS: tl.constexpr, OFF: tl.constexpr, OUT: tl.constexpr,
                 SUMS: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, G: tl.constexpr,
                 UNROLL: tl.constexpr, BLOCK_N: tl.constexpr, EMU: tl.constexpr, ACT: tl.constexpr,
                 HBLOCK: tl.constexpr, H8K: tl.constexpr, DOWN_N: tl.constexpr, DOWN_UNROLL: tl.constexpr,
                 SPLIT: tl.constexpr, RES: tl.constexpr, BLOCK_E: tl.constexpr, PDL: tl.constexpr = False):
    """y = sum_a rw[a] down_a @ h[a] (+ the residual if RES), h[a] = act(gate_a x, up_a x) quantized: the gate/up
    tiles of this program (the list's first n_tiles items), then its down tiles (range-major: the experts of the first
    range are done first), each expert's h read once its counter says so."""
    pdl.start(PDL, False)  # first: pdl's rule (the next kernel launches as this one's programs end)
    target = _gate_up_tiles(gate_ptr, up_ptr, gate_off, up_off, ids_ptr, xw_ptr, xd_ptr, rw_ptr, h_ptr, hd_ptr,
                            hs_ptr, hf_ptr, tickets_ptr, cnt_ptr, F, row_bytes, n_tiles, IDS, OFF, OUT, SUMS, A1, A2,
                            A3, G, UNROLL, BLOCK_N, EMU, ACT, HBLOCK, H8K)
    pid, progs = tl.program_id(0), tl.num_programs(0)
    row_tiles = tl.cdiv(D, DOWN_N)
    per = tl.cdiv(n, SPLIT)
    e = tl.arange(0, BLOCK_E)
    ready = tl.zeros((), tl.int32)  # 1: every expert's counter seen at the target, no more checks
    first_j = pid + tl.cdiv(n_tiles - pid, progs) * progs - n_tiles
    for j in range(first_j, SPLIT * row_tiles, progs):
        part, tile = j // row_tiles, j % row_tiles
        rows = tile * DOWN_N + tl.arange(0, DOWN_N)
        rmask = rows < D
        rb = rows.to(tl.int64) * down_row_bytes
        if ready == 0:  # one look at all counters before waiting on them one by one (volatile: as _wait)
            ce = cnt_ptr + tl.minimum(e, n - 1)
            ready = (tl.min(tl.where(e < n, tl.load(ce, volatile=True), target), 0) >= target).to(tl.int32)
            if ready != 0:  # each counter once with acquire: the h of every expert visible
                ready = (tl.min(tl.where(e < n, _acquire(ce, EMU), target), 0) >= target).to(tl.int32)
                tl.debug_barrier()
        first = part * per
        acc = tl.zeros((DOWN_N,), tl.float32)
        for a in range(first, tl.minimum(first + per, n)):
            if ready == 0:
                _wait(cnt_ptr + a, target, EMU)
            w_off = OFF(down_off, ids_ptr, a, IDS, 1) + rb
            part_a = _down_rows(down_ptr, w_off, h_ptr + a * (F // 4), hd_ptr + a * (F // HBLOCK), A1, A2, A3,
                                F // 256, DOWN_N, DOWN_UNROLL, EMU, SUMS)
            if EMU:  # the interpreter fuses nothing
                acc += part_a * tl.load(rw_ptr + a)
            else:
                acc = tl.fma(part_a, tl.load(rw_ptr + a), acc)
        if SPLIT == 1:
            if RES:
                acc = acc + tl.load(res_ptr + rows, mask=rmask)
            tl.store(y_ptr + rows, acc, mask=rmask)
        else:
            fold_part(y_ptr, part_ptr, fold_ptr, tile, part, rows, rmask, acc, D, SPLIT, res_ptr, RES)


# one counter set per (device, experts, gate/up tiles an expert): a launch's epoch arithmetic needs every counter of
# its set advanced by exactly its tiles an expert in every launch before it
_COUNTERS: dict[tuple[torch.device, int, int], torch.Tensor] = {}


def counters(n: int, tiles_f: int, device: torch.device) -> torch.Tensor:
    """The int64 [n] counters of launches with n experts of tiles_f gate/up tiles each (zero when made: make them
    on an eager call before a CUDA graph capture, as matmul.tickets)."""
    key = (torch.device(device), n, tiles_f)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(n, dtype=torch.int64, device=device)
    return _COUNTERS[key]


_RESIDENT: dict[tuple, int] = {}


def resident_per_sm(compiled, num_warps: int) -> int:
    """How many programs of a compiled kernel fit an SM at once: registers (allocated per warp in units of 256),
    shared memory, Hopper's 32 blocks."""
    regs = -(-compiled.n_regs * 32 // 256) * 256 * num_warps
    shared = compiled.metadata.shared + BLOCK_RESERVED_SHARED_BYTES
    return max(1, min(MAX_PER_SM, SM_REGISTERS // max(regs, 1), SM_SHARED_BYTES // shared))


PHASES = ("both", "gate_up", "down")


def launch(tensors: dict, consts: dict, n_tiles: int, per_sm: int, device: torch.device, phase: str = "both") -> int:
    """layer_kernel on its grid (→ its programs): per_sm programs an SM, at most as many as are resident at once
    (else a waiting program could hold the slot the program it waits for needs), at most one a gate/up tile; one
    under the interpreter. consts: the constexprs and launch options (the residency's key), tensors the rest.
    phase (a bench's measuring tool): "gate_up" runs no down tile (D 0), "down" no gate/up tile (no tiles: its
    waits pass at once, h as it lies), on the grid of both."""
    grid = 1
    if device.type == "cuda":
        key = (device, tuple(sorted((k, repr(v)) for k, v in consts.items())))
        if key not in _RESIDENT:
            compiled = layer_kernel.warmup(grid=(1,), **tensors, **consts, **pdl.launch(device))
            compiled._init_handles()  # n_regs comes with the loaded module
            _RESIDENT[key] = resident_per_sm(compiled, consts["num_warps"])
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        grid = min(n_tiles, min(per_sm, _RESIDENT[key]) * sms)
    if phase != "both":
        tensors = tensors | ({"D": 0} if phase == "gate_up" else {"n_tiles": 0})
    layer_kernel[(grid,)](**tensors, **consts, **pdl.launch(device))
    return grid
