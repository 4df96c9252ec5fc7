"""The tiled Q4_K "pairx" byte order and integer step (session 8, q4k19; bench/q4t_pair.py's "pairx"):
q4_k_tiled's 4-row tiles, the same 576 bytes per tile and group in the same places (qs of every group first,
group g's 512 at g * 512, then the headers, group g's 64 at 512 G + 64 g), re-laid so that a one-warp program
loads each x word twice instead of 4 times and a thread makes one row's float values per group:
- qs: thread t = 2c + p (c = 0..15 along K, p the row pair: rows 2p, 2p+1) owns elements 16c..16c+15 of its 2
  rows; word 4t + 2r + k is row 2p + r's for elements 16c + 8k .. + 7 (byte b: element 16c + 8k + b in the low
  nibble, 16c + 8k + 4 + b in the high one). One 128-bit load of qs and one of x words 4c..4c+3 per thread.
- header: words 0-3 d | dmin << 16 of rows 0-3; word 4 + s byte r: sc[s] of row r (6 bits) with mn[s]'s bits
  4-5 on top; word 12 + s // 2 byte r: mn[s]'s bits 0-3 in nibble s % 2.
The step: each thread's 2 rows' integer sums (dp4a), then the 2 threads of a sub-block and row pair (e = c % 2)
trade one row's sum (one butterfly shuffle) so thread e keeps row 2p + e and makes its d, dmin (times x's scale),
sc and mn alone. q4_k's integer sums; another float order (within the fp32 bound, not the bytes step's bits).
H200 (bench/results/q4k19_h200_s8.log, its own kernel, 2 groups a step): 10.8 / 13.3 / 7.6 / 52.3 / 4.9 us (bytes)
-> 10.4 / 11.4 / 6.9 / 44.1 / 4.4 at 14336x4096 / 4096x14336 / 6144x4096 / 151936x2048 / 4096x2048.
The step runs only on the default one-warp 4-row elementwise tile (q4_k_tiled.gemv checks it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparkd.engine.kernels import pdl
from sparkd.engine.kernels.act_quant import dp4a, dp4a_add
from sparkd.engine.kernels.nibble_tiles import word_values
from sparkd.engine.kernels.row_tiles import row_sums


def pack_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_K blocks as q4_k_tiled's tiles (uint8 [tiles, G, 4, 144]) -> the pairx bytes (uint8, flat)."""
    b = blocks.long()
    tiles, groups = b.shape[:2]
    q = b[..., 16:].reshape(tiles, groups, 4, 4, 32)  # chunk j, byte i: elements 64j + i, 64j + 32 + i
    nib = torch.stack([q & 15, q >> 4], 4).reshape(tiles, groups, 2, 2, 16, 2, 2, 4)  # [.., p, r, c, k, half, b]
    qs = (nib[..., 0, :] | (nib[..., 1, :] << 4)).permute(0, 1, 4, 2, 3, 5, 6)  # [.., c, p, r, k, b]
    hdr = b[..., :16]
    a, m, c = hdr[..., 4:8], hdr[..., 8:12], hdr[..., 12:16]
    sc = torch.cat([a & 63, (c & 0xF) | ((a >> 6) << 4)], -1)  # [tiles, G, row, 8] (q4_k.scale_min_words)
    mn = torch.cat([m & 63, (c >> 4) | ((m >> 6) << 4)], -1)
    scw = (sc | ((mn >> 4) << 6)).transpose(2, 3)  # [tiles, G, s, row]
    lo = (mn & 15).transpose(2, 3).reshape(tiles, groups, 4, 2, 4)  # [.., s // 2, s % 2, row]
    head = torch.cat([hdr[..., :4].reshape(tiles, groups, 16), scw.reshape(tiles, groups, 32),
                      (lo[..., 0, :] | (lo[..., 1, :] << 4)).reshape(tiles, groups, 16)], -1)
    return torch.cat([qs.reshape(tiles, -1), head.reshape(tiles, -1)], 1).to(torch.uint8).reshape(-1)


def unpack_blocks(data: torch.Tensor, tiles: int, groups: int) -> torch.Tensor:
    """pack_blocks' inverse: the pairx bytes of `tiles` tiles of `groups` groups (uint8, flat) -> GGUF Q4_K blocks
    as q4_k_tiled's tiles (uint8 [tiles, G, 4, 144]): for a torch dequantization of repacked experts."""
    b = data.reshape(tiles, -1).long()
    qs = b[:, :groups * 512].reshape(tiles, groups, 16, 2, 2, 2, 4)  # [.., c, p, r, k, b]
    nib = torch.stack([qs & 15, qs >> 4], -2).permute(0, 1, 3, 4, 2, 5, 6, 7)  # [.., p, r, c, k, half, b]
    nib = nib.reshape(tiles, groups, 4, 4, 2, 32)  # [.., row, chunk j, half, i]: element 64j + 32 half + i
    q = nib[..., 0, :] | (nib[..., 1, :] << 4)  # [.., row, j, i]
    head = b[:, groups * 512:].reshape(tiles, groups, 64)
    d = head[..., :16].reshape(tiles, groups, 4, 4)
    scw = head[..., 16:48].reshape(tiles, groups, 8, 4).transpose(2, 3)  # [.., row, s]
    lo = head[..., 48:].reshape(tiles, groups, 4, 4).transpose(2, 3)  # [.., row, s // 2]
    mn_lo = torch.stack([lo & 15, lo >> 4], -1).reshape(tiles, groups, 4, 8)
    sc, mn = scw & 63, mn_lo | ((scw >> 6) << 4)
    a = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)  # q4_k.scale_min_words' 12 bytes back
    m = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    c = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return torch.cat([d, a, m, c, q.reshape(tiles, groups, 4, 128)], -1).to(torch.uint8)


def unpack_raw(data: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The pairx bytes of W [rows, cols] (rows a multiple of 4) -> its raw GGUF Q4_K blocks (uint8, flat)."""
    rows, cols = shape
    return unpack_blocks(data, rows // 4, cols // 256).transpose(1, 2).reshape(-1)


@triton.jit
def _f16(bits):
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _col(v, i):
    """Column i of a thread's own [32, n] values as [32, 1] (a register pick, no data moves between threads)."""
    return tl.sum(tl.where(tl.arange(0, v.shape[1])[None, :] == i, v, 0), 1, keep_dims=True)


@triton.jit
def _row_isum(a, b, x0, x1, x2, x3, EMU: tl.constexpr):
    """The dp4a sum of a row's 2 qs words (a: elements 16c..16c+7, b: 16c+8..16c+15) with the thread's 4 x words."""
    m = 0x0F0F0F0F
    return dp4a_add((b >> 4) & m, x3, dp4a_add(b & m, x2, dp4a_add((a >> 4) & m, x1, dp4a(a & m, x0, EMU), EMU),
                                                 EMU), EMU)


@triton.jit
def _partner(v, EMU: tl.constexpr):
    """v [32, 1] of thread t ^ 2 (the other thread of the sub-block and row pair): a butterfly shuffle; the
    interpreter (EMU) flips the tensor's thread dimension (t = 4s + 2e + p: e flipped)."""
    if EMU:
        out = tl.reshape(tl.flip(tl.reshape(v, (v.shape[0] // 4, 2, 2)), 1), v.shape)
    else:
        out = tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 2, 31, -1;", "=r,r", [v], dtype=tl.int32,
                                        is_pure=True, pack=1)
    return out


@triton.jit
def _part(base, xw_ptr, xd_ptr, xs_ptr, lane, g, live, K, EMU: tl.constexpr):
    """Group g's float share [T, 1] of each thread's row and sub-block (lane = t % 32 = 4s + 2e + p: row 2p + e,
    sub-block s) in the 4-row tile at base (_math); g and live (False: the group is past the range, its share 0)
    are scalars or per thread [T, 1]. The loads are _wloads' and x's, interleaved in the order the dense GEMV was
    timed in (through _wloads they compile to other SASS, longer: session 21)."""
    w = tl.arange(0, 4)[None, :]
    c = lane // 2
    s = c // 2
    q = tl.load(base + g * 128 + 4 * lane + w)  # [T, 4]: words (r, k) = 2r + k
    x = tl.load(xw_ptr + g * 64 + 4 * c + w)  # [T, 4]: x words 4c .. 4c + 3
    hb = base + K // 256 * 128 + g * 16
    hd = tl.load(hb + (2 * (lane % 2) + c % 2))  # the thread's row 2p + e
    scw = tl.load(hb + 4 + s)
    mnw = tl.load(hb + 12 + s // 2)
    xs = tl.load(xs_ptr + g * 8 + s)
    dx = tl.where(live, tl.load(xd_ptr + g), 0.0)  # 0 past the range (whole tiles)
    return _math((q, hd, scw, mnw), (x, xs, dx), lane, EMU)


@triton.jit
def _tile_base(w_ptr, K):
    """The program's 4-row tile (program 0's row tile) as int32 words."""
    return (w_ptr + tl.program_id(0).to(tl.int64) * (K // 256 * 576)).to(tl.pointer_type(tl.int32))


@triton.jit
def idot(w_ptr, aux_ptr, row_off, rmask, xw_ptr, xd_ptr, xs_ptr, g, K, acc, EW: tl.constexpr, EMU: tl.constexpr):
    """Group g of the program's 4-row tile added into acc [4, 8, 1] (row, sub-block): matmul's idot contract on
    the one-warp 4-row elementwise tile only (the tile is program 0's row tile; rmask: the group is in range)."""
    tl.static_assert(EW and rmask.shape[0] == 4, "the pairx step runs on the 4-row elementwise tile only")
    part = _part(_tile_base(w_ptr, K), xw_ptr, xd_ptr, xs_ptr, tl.arange(0, 32)[:, None], g,
                 tl.max(rmask.to(tl.int32), 0) > 0, K, EMU)  # [32, 1]: t = 4s + 2e + p
    return acc + _as_tile(part)


@triton.jit
def gate_up(gate_ptr, up_ptr, xw_ptr, xd_ptr, xs_ptr, NG: tl.constexpr, STEP: tl.constexpr, EMU: tl.constexpr):
    """(gate, up) accs [4, 8, 1] of the program's 4-row tile (idot's program-id tile, a uniform value) in both
    matrices over all NG groups of a row, idot's loop (moe._gate_up_idot) with a constant trip count: STEP groups a
    step unrolled (NG: the whole row, every address a constant offset of the two tiles), no clamp, no mask. The same
    adds in the same order as idot's: the same bits. Session 21 (q4k48): 2 groups a step is what the H200 ran fastest
    (moe_tiles.PAIRX_GATE_UP); a form with a group's loads before the previous group's dots lost (the branch history,
    3d354d5)."""
    lane = tl.arange(0, 32)[:, None]
    gb, ub = _tile_base(gate_ptr, NG * 256), _tile_base(up_ptr, NG * 256)
    acc_g = tl.zeros((32, 1), tl.float32)
    acc_u = tl.zeros((32, 1), tl.float32)
    for g0 in tl.range(0, NG, STEP):
        for u in tl.static_range(STEP):
            gw, uw, xv = _loads(gb, ub, xw_ptr, xd_ptr, xs_ptr, lane, g0 + u, NG)
            acc_g += _math(gw, xv, lane, EMU)
            acc_u += _math(uw, xv, lane, EMU)
    zero = tl.zeros((4, 8, 1), tl.float32)  # idot's acc starts at 0.0: the same adds
    return zero + _as_tile(acc_g), zero + _as_tile(acc_u)


@triton.jit
def _loads(gb, ub, xw_ptr, xd_ptr, xs_ptr, lane, g, NG: tl.constexpr):
    """gate_up's loads of group g: each matrix's words (_wloads), x's (its words, the sub-block's sum, the scale)."""
    c = lane // 2
    x = tl.load(xw_ptr + g * 64 + 4 * c + tl.arange(0, 4)[None, :])
    xv = (x, tl.load(xs_ptr + g * 8 + c // 2), tl.load(xd_ptr + g))
    return _wloads(gb, lane, g, NG * 256), _wloads(ub, lane, g, NG * 256), xv


@triton.jit
def _wloads(base, lane, g, K):
    """One matrix's words of group g in the tile at base: the thread's 2 rows' qs [T, 4] (words (r, k) = 2r + k)
    and its row's header words (d | dmin, scales, mins' low bits) [T, 1]."""
    c = lane // 2
    s = c // 2
    q = tl.load(base + g * 128 + 4 * lane + tl.arange(0, 4)[None, :])
    hb = base + K // 256 * 128 + g * 16
    return q, tl.load(hb + (2 * (lane % 2) + c % 2)), tl.load(hb + 4 + s), tl.load(hb + 12 + s // 2)


@triton.jit
def _math(w, xv, lane, EMU: tl.constexpr):
    """The float share [T, 1] of each thread's row and sub-block (lane = t % 32 = 4s + 2e + p: row 2p + e, sub-block
    s) from one matrix's _wloads w and x's loads xv of a group (its words, the sub-block's sum, the scale)."""
    q, hd, scw, mnw = w
    x, xs, dx = xv
    c = lane // 2
    s = c // 2
    e = c % 2
    sh = 8 * (2 * (lane % 2) + e)  # [T, 1]: the thread's row 2p + e, its byte in the scale words
    x0, x1, x2, x3 = _col(x, 0), _col(x, 1), _col(x, 2), _col(x, 3)
    i0 = _row_isum(_col(q, 0), _col(q, 1), x0, x1, x2, x3, EMU)
    i1 = _row_isum(_col(q, 2), _col(q, 3), x0, x1, x2, x3, EMU)
    isum = tl.where(e == 0, i0, i1) + _partner(tl.where(e == 0, i1, i0), EMU)
    sc = (scw >> sh) & 63
    mn = ((mnw >> (sh + 4 * (s % 2))) & 15) | (((scw >> sh) >> 2) & 48)
    d = _f16(hd & 0xFFFF) * dx
    dmin = _f16(hd >> 16) * dx
    return d * (sc * isum).to(tl.float32) - dmin * (mn * xs).to(tl.float32)


@triton.jit
def _as_tile(part):
    """A [32, 1] share (t = 4s + 2e + p) as the tile's acc [4, 8, 1]: row 2p + e, sub-block s."""
    return tl.reshape(tl.permute(tl.reshape(part, (8, 2, 2)), (2, 1, 0)), (4, 8, 1))


@triton.jit
def krows(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr):
    """The program's 4-row tile with its KW warps on matmul.row_idot's KW ranges of groups (warp k: range k of a
    split-K launch of SPLIT = KW, stepped UNROLL groups at a time as there), each thread summing as idot's: each
    range's row sums (row_sums' tl.sum over the 8 sub-blocks), float32 [KW, 4] (range, row)."""
    base = _tile_base(w_ptr, K)
    t = tl.arange(0, 32 * KW)[:, None]
    n_groups = tl.cdiv(K, 256)
    per = tl.cdiv(n_groups, KW)
    start = (t // 32) * per
    end = tl.minimum(start + per, n_groups)
    acc = tl.zeros((32 * KW, 1), tl.float32)
    for i in range(0, per, UNROLL):
        for u in tl.static_range(UNROLL):
            g = start + i + u
            acc += _part(base, xw_ptr, xd_ptr, xs_ptr, t % 32, tl.minimum(g, end - 1), g < end, K, EMU)
    return tl.sum(tl.reshape(tl.permute(tl.reshape(acc, (KW, 8, 2, 2)), (0, 3, 2, 1)), (KW, 4, 8)), 2)


@triton.jit
def kstep(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW: tl.constexpr, UNROLL: tl.constexpr, EMU: tl.constexpr):
    """krows' ranges added in range order from 0.0 in the program (fold_part's order, no partials in memory, no
    ticket): float32 [4], the split-K launch's y. Session 12 (q4k21): the [4, KW] sums taken apart with tl.split,
    which puts the KW axis in one thread (one exchange through shared memory, one barrier; q4k20's KW masked
    tl.sum across the warps took KW exchanges and 2 KW - 1 barriers)."""
    v = tl.trans(krows(w_ptr, xw_ptr, xd_ptr, xs_ptr, K, KW, UNROLL, EMU))  # [4, KW]
    total = tl.zeros((4,), tl.float32)
    if KW == 2:
        r0, r1 = tl.split(v)
        total = total + r0 + r1
    elif KW == 4:
        e, o = tl.split(tl.reshape(v, (4, 2, 2)))  # ranges 0, 2 and 1, 3
        r0, r2 = tl.split(e)
        r1, r3 = tl.split(o)
        total = total + r0 + r1 + r2 + r3
    else:
        tl.static_assert(KW == 8, "kstep runs 2, 4 or 8 ranges (matmul.KSTEP_WARPS)")
        e, o = tl.split(tl.reshape(v, (4, 4, 2)))  # ranges 0, 2, 4, 6 and 1, 3, 5, 7
        ee, eo = tl.split(tl.reshape(e, (4, 2, 2)))  # 0, 4 and 2, 6
        oe, oo = tl.split(tl.reshape(o, (4, 2, 2)))  # 1, 5 and 3, 7
        r0, r4 = tl.split(ee)
        r2, r6 = tl.split(eo)
        r1, r5 = tl.split(oe)
        r3, r7 = tl.split(oo)
        total = total + r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7
    return total


@triton.jit
def dequant(w_ptr, aux_ptr, row_off, g, smask):
    """Group g of each row as floats [BN, 8, 32] (aux_ptr: int32 [1], the row width): q4_k.dequant's values."""
    K = tl.load(aux_ptr.to(tl.pointer_type(tl.int32)))
    row_bytes = K // 256 * 144
    lane = (row_off // row_bytes) % 4  # [BN, 1, 1]: the row's place in its tile
    tile = w_ptr + (row_off - lane * row_bytes)
    s = tl.arange(0, 8)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    el = 32 * s + i  # element of the group
    word = 4 * (2 * (el // 16) + lane // 2) + 2 * (lane % 2) + (el // 8) % 2
    q = tl.load(tile + g * 512 + 4 * word + el % 4, mask=smask, other=0).to(tl.int32)
    q = (q >> (4 * ((el // 4) % 2))) & 0xF
    hb = tile + K // 256 * 512 + g * 64
    d = tl.load((hb + 4 * lane).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    dmin = tl.load((hb + 4 * lane + 2).to(tl.pointer_type(tl.float16)), mask=smask, other=0.0).to(tl.float32)
    scb = tl.load(hb + 16 + 4 * s + lane, mask=smask, other=0).to(tl.int32)
    mnb = tl.load(hb + 48 + 4 * (s // 2) + lane, mask=smask, other=0).to(tl.int32)
    sc = (scb & 63).to(tl.float32)
    mn = (((mnb >> (4 * (s % 2))) & 15) | ((scb >> 6) << 4)).to(tl.float32)
    return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def _tile_at(w_ptr, row_off, row_bytes):
    """(the start of each row's 4-row tile, the row's place in it) from its GGUF-layout byte offset row_off."""
    lane = (row_off // row_bytes) % 4
    return w_ptr + (row_off - lane * row_bytes), lane


@triton.jit
def iblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.iblock on the pairx bytes (dequant's element order): sub-block b % 8 of group b // 8."""
    tile, lane = _tile_at(w_ptr, row_off, row_bytes)  # [BN]
    g, s = b // 8, b % 8
    el = 32 * s + tl.arange(0, 32)[None, :]  # element of the group
    ln = lane[:, None]
    word = 4 * (2 * (el // 16) + ln // 2) + 2 * (ln % 2) + (el // 8) % 2
    q = tl.load(tile[:, None] + g * 512 + 4 * word + el % 4, mask=rmask[:, None], other=0).to(tl.int32)
    q = (q >> (4 * ((el // 4) % 2))) & 0xF
    sc, mn = _scale_min(tile, lane, rmask, g, s, row_bytes)
    return q.to(tl.int8), sc, mn


@triton.jit
def kblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """family.kblock on the pairx bytes. Word w of the sub-block (w = 2a + k: its values 8w + 4h + j in nibble h of
    byte j) is word 4 (4s + 2a + lane // 2) + 2 (lane % 2) + k of the group's qs (loaded once per nibble: the
    q4_k.kblock shape, [BN, 8 words, 4 bytes], which Triton unpacks where the pipeliner's copy lands), and its
    scale bytes come in the header's words (4 + s, 12 + s // 2: a byte per lane): word loads, no byte loads."""
    tile, lane = _tile_at(w_ptr, row_off, row_bytes)  # [BN]
    g, s = b // 8, b % 8
    v = tl.arange(0, 8)[None, :]  # values 4v .. 4v + 3: word w = v // 2, nibble h = v % 2
    w = v // 2
    ln = lane[:, None]
    qs = (tile[:, None] + g * 512).to(tl.pointer_type(tl.int32))
    words = tl.load(qs + 4 * (4 * s + ln // 2) + 2 * (ln % 2) + 8 * (w // 2) + w % 2, mask=rmask[:, None], other=0)
    words = tl.where(v % 2 == 0, words, words >> 4)  # the nibble at the bottom of each byte
    j = tl.arange(0, 4)[None, None, :]  # byte of the word
    q = (tl.reshape(words, (words.shape[0], 8, 1)) >> (8 * j)) & 0xF  # [BN, 8, 4]
    hw = (tile + row_bytes // 144 * 512 + g * 64).to(tl.pointer_type(tl.int32))
    at = 8 * lane.to(tl.int32)
    scb = (tl.load(hw + 4 + s, mask=rmask, other=0) >> at) & 0xFF
    mnb = (tl.load(hw + 12 + s // 2, mask=rmask, other=0) >> at) & 0xFF
    sc, mn = _sc_mn(scb, mnb, s)
    return tl.reshape(q, (words.shape[0], 32)).to(tl.int8), sc, mn


@triton.jit
def wblock(w_ptr, aux_ptr, row_off, rmask, b, row_bytes):
    """kblock unpacked with 32-bit word ops (session 12): the sub-block's 4 qs words (word a: values 8a + 4h + j
    in nibble h of byte j) loaded once each, `(w >> 4h) & 0x0F0F0F0F` four int8 values a word op, and each
    unpacked word's bytes taken in order (join, no per-value shift by a lane-dependent amount) as the int8 tile:
    values in dequant's order, the same integer sums as kblock and iblock."""
    tile, lane = _tile_at(w_ptr, row_off, row_bytes)  # [BN]
    g, s = b // 8, b % 8
    a = tl.arange(0, 4)[None, :]
    ln = lane[:, None]
    qs = (tile[:, None] + g * 512).to(tl.pointer_type(tl.int32))
    w = tl.load(qs + 4 * (4 * s + ln // 2) + 2 * (ln % 2) + 8 * (a // 2) + a % 2, mask=rmask[:, None], other=0)
    m = 0x0F0F0F0F
    u = tl.reshape(tl.join(w & m, (w >> 4) & m), (w.shape[0], 8))  # word 2a + h: values 8a + 4h .. + 3
    b0, b1, b2, b3 = u.to(tl.int8), (u >> 8).to(tl.int8), (u >> 16).to(tl.int8), (u >> 24).to(tl.int8)
    q = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (w.shape[0], 32))  # [.., v, k, m]: byte 2k + m
    hw = (tile + row_bytes // 144 * 512 + g * 64).to(tl.pointer_type(tl.int32))
    at = 8 * lane.to(tl.int32)
    scb = (tl.load(hw + 4 + s, mask=rmask, other=0) >> at) & 0xFF
    mnb = (tl.load(hw + 12 + s // 2, mask=rmask, other=0) >> at) & 0xFF
    sc, mn = _sc_mn(scb, mnb, s)
    return q, sc, mn


@triton.jit
def _scale_min(tile, lane, rmask, g, s, row_bytes):
    """The 6-bit scale and min (int32 [BN]) of sub-block s of group g of each row (its tile, its lane in it)."""
    hb = tile + row_bytes // 144 * 512 + g * 64 + lane
    scb = tl.load(hb + 16 + 4 * s, mask=rmask, other=0).to(tl.int32)
    mnb = tl.load(hb + 48 + 4 * (s // 2), mask=rmask, other=0).to(tl.int32)
    return _sc_mn(scb, mnb, s)


@triton.jit
def _sc_mn(scb, mnb, s):
    """(scale, min) of sub-block s from its scale byte and its mins' byte (int32)."""
    return scb & 63, ((mnb >> (4 * (s % 2))) & 15) | ((scb >> 6) << 4)


@triton.jit
def igroup(w_ptr, row_off, rmask, g, row_bytes):
    tile, lane = _tile_at(w_ptr, row_off, row_bytes)
    hd = (tile + row_bytes // 144 * 512 + g * 64 + 4 * lane).to(tl.pointer_type(tl.float16))
    return (tl.load(hd, mask=rmask, other=0.0).to(tl.float32), tl.load(hd + 1, mask=rmask, other=0.0).to(tl.float32))


@triton.jit
def _step_wloads(down_ptr, off, lane, g0, U: tl.constexpr, K):
    """_wloads of groups g0..g0+U-1 (U 1 to 3) of the tile at byte offset off, flat; groups past U repeat the first
    (no load)."""
    base = (down_ptr + off).to(tl.pointer_type(tl.int32))
    q0, d0, s0, m0 = _wloads(base, lane, g0, K)
    q1, d1, s1, m1, q2, d2, s2, m2 = q0, d0, s0, m0, q0, d0, s0, m0
    if U > 1:
        q1, d1, s1, m1 = _wloads(base, lane, g0 + 1, K)
    if U > 2:
        q2, d2, s2, m2 = _wloads(base, lane, g0 + 2, K)
    return q0, d0, s0, m0, q1, d1, s1, m1, q2, d2, s2, m2


@triton.jit
def _xmath(w, xw_ptr, xd_ptr, xs_ptr, lane, g, EMU: tl.constexpr):
    """_math of group g's words w with x's loads of the group (h's row of the expert: words, sub-block sums, scale)."""
    c = lane // 2
    x = tl.load(xw_ptr + g * 64 + 4 * c + tl.arange(0, 4)[None, :])
    return _math(w, (x, tl.load(xs_ptr + g * 8 + c // 2), tl.load(xd_ptr + g)), lane, EMU)


@triton.jit
def down_sums(down_ptr, down_off, ids_ptr, hw_ptr, hd_ptr, hs_ptr, rw_ptr, first, last, F, IDS: tl.constexpr,
              OFF: tl.constexpr, ALIGN: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr,
              NG: tl.constexpr, STEP: tl.constexpr, XBLOCK: tl.constexpr, EMU: tl.constexpr,
              WAIT: tl.constexpr = False):
    """sum over experts a in [first, last) of rw[a] * (down_a's 4-row tile of program_id(0) @ h[a]), float32 [4]: the
    pairx down's grid loop (moe._idown_kernel, TILED, NG groups a row in steps of STEP, 1 to 3, dividing NG) as one
    flat loop over (expert, step) with the next step's weight words (the next expert's first where this step is an
    expert's last) loaded before this step's dots: moe_down_ahead's form (session 20, moe46). The next expert's
    offset is read an expert ahead, so its two dependent loads (ids, offsets) never stand in front of a step's loads.
    Each thread's shares added in idot's order, the expert's tile summed by row_sums: the grid loop's bits. Session 21
    (down49, H200): on 2 ranges of 4/1/3/e/2 with the pair fold at 2048x768 the layer -6.4 / -6.8 % (moe_tiles.
    PAIRX_DOWN); at 4096x1536 it tied the grid loop on 4 ranges and lost on 2. OFF(off_ptr, ids_ptr, a, IDS, ALIGN, L2)
    the expert's byte offset (moe._aligned_offset). WAIT (session 48, moe._idown_kernel's EARLY): the launch's PDL wait
    here, after the first step's weight words (pdl.py's exception; the selection read before it from the L2)."""
    S: tl.constexpr = NG // STEP  # steps an expert
    K: tl.constexpr = NG * 256
    lane = tl.arange(0, 32)[:, None]
    tile = tl.program_id(0).to(tl.int64) * (NG * 576)  # the program's tile in an expert's matrix
    end = last - 1  # the range's last expert: where the reads ahead stop (an empty range reads it, unused)
    wo = OFF(down_off, ids_ptr, tl.minimum(first, end), IDS, ALIGN, WAIT) + tile
    nwo = OFF(down_off, ids_ptr, tl.minimum(first + 1, end), IDS, ALIGN, WAIT) + tile
    q0, d0, s0, m0, q1, d1, s1, m1, q2, d2, s2, m2 = _step_wloads(down_ptr, wo, lane, 0, STEP, K)
    pdl.start(WAIT)
    part = tl.zeros((32, 1), tl.float32)  # this expert's shares (t = 4s + 2e + p): idot's tile, permuted
    acc = tl.zeros((4,), tl.float32)
    for i in range((last - first) * S):
        s = i % S
        a = first + i // S
        # the next step's words first (past the range's last step: its last expert's first groups, unused)
        n = _step_wloads(down_ptr, tl.where(s == S - 1, nwo, wo), lane, ((s + 1) % S) * STEP, STEP, K)
        xw, xd, xs = hw_ptr + a * (F // 4), hd_ptr + a * (F // XBLOCK), hs_ptr + a * (F // 32)
        part += _xmath((q0, d0, s0, m0), xw, xd, xs, lane, s * STEP, EMU)
        if STEP > 1:
            part += _xmath((q1, d1, s1, m1), xw, xd, xs, lane, s * STEP + 1, EMU)
        if STEP > 2:
            part += _xmath((q2, d2, s2, m2), xw, xd, xs, lane, s * STEP + 2, EMU)
        if s == S - 1:  # the expert's end: its row sums times its weight, as the grid loop's, then the next expert
            acc += row_sums(_as_tile(part), A1, A2, A3) * tl.load(rw_ptr + a)
            part = tl.zeros((32, 1), tl.float32)
            wo = nwo
            nwo = OFF(down_off, ids_ptr, tl.minimum(a + 2, end), IDS, ALIGN) + tile
        q0, d0, s0, m0, q1, d1, s1, m1, q2, d2, s2, m2 = n
    return acc



@triton.jit
def dequant_words(w_ptr, K, first, g, M, ROWS: tl.constexpr):
    """family.words: group g of rows [first, first + ROWS) (whole 4-row tiles; rows from M none), a qs word a lane:
    word (c, p, r, k) = 8c + 4p + 2r + k of a tile holds row 2p + r's elements 16c + 8k .. + 7 (pack_blocks).
    dequant's expression on the same bytes, so its values: values [ROWS * 32, 1, 8], their row [.., 1, 1] and
    column [.., 1, 1]."""
    i = tl.arange(0, ROWS * 32)
    w = i % 128
    c, row, k = w // 8, 2 * ((w // 4) % 2) + (w // 2) % 2, w % 2
    s = c // 2
    t = first // 4 + i // 128
    live = t < M // 4
    tile = (w_ptr + t.to(tl.int64) * (K // 256 * 576)).to(tl.pointer_type(tl.int32))
    q = tl.load(tile + g * 128 + w, mask=live, other=0)
    hb = tile + K // 256 * 128 + g * 16
    hd = tl.load(hb + row, mask=live, other=0)  # d | dmin << 16
    sh = 8 * row
    scw = tl.load(hb + 4 + s, mask=live, other=0) >> sh
    mn = ((tl.load(hb + 12 + s // 2, mask=live, other=0) >> (sh + 4 * (s % 2))) & 15) | ((scw >> 2) & 48)
    ds = _f16(hd & 0xFFFF) * (scw & 63).to(tl.float32)
    dm = _f16(hd >> 16) * mn.to(tl.float32)
    lo, hi = q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F  # elements 16c + 8k + b, + 4 + b in byte b
    v = word_values(_nibble(lo, 0, ds, dm), _nibble(lo, 1, ds, dm), _nibble(lo, 2, ds, dm), _nibble(lo, 3, ds, dm),
                    _nibble(hi, 0, ds, dm), _nibble(hi, 1, ds, dm), _nibble(hi, 2, ds, dm), _nibble(hi, 3, ds, dm))
    rows = 4 * t + row
    return tl.reshape(v, (ROWS * 32, 1, 8)), rows[:, None, None], (g * 256 + 16 * c + 8 * k)[:, None, None]


@triton.jit
def _nibble(v, b: tl.constexpr, ds, dm):
    """Byte b of words v (a nibble each) dequantized: dequant's ds * q - dm."""
    return ds * ((v >> (8 * b)) & 0xFF).to(tl.float32) - dm
