"""Q8_0 rows with each 256-value group's 68 words reordered so that a lane's 8 words are one 32-byte run (session 18,
moe41; session 21, pipe48: moe_pipe's PERM), the words step's weight loads 128 bits wide instead of 32.

In GGUF bytes a group is 4 pairs of 34-byte blocks, 17 words a pair on 4-byte rows (q8_0_words): lane l of the even
block reads pair word l + 1 (word 0, its head: scale and quants 0-1), lane l of the odd block pair word 9 + l (its
scale is in the even block's lane-7 word). A lane's words start on 16 bytes in only one pair of four. Here a group is
the 64 lane words in (block, lane) order, then the 4 even heads: the same 272 bytes, rows and offsets unchanged; the
step computes on the very same words, so the same sums and bits.
"""

from __future__ import annotations

import dataclasses

import torch

from sparkd.engine.kernels.family import KernelArgumentError

GROUP_WORDS = 68
# permuted word i of a group holds GGUF word ORDER[i]: block s lane l (s even: pair word l + 1, odd: 9 + l), heads
ORDER = [17 * (s // 2) + (1 + lane if s % 2 == 0 else 9 + lane) for s in range(8) for lane in range(8)] + \
    [17 * p for p in range(4)]


def pack_raw(raw: torch.Tensor, shape: tuple[int, int], inverse: bool = False) -> torch.Tensor:
    """GGUF Q8_0 blocks of W [rows, cols] (uint8 1-D, any device) -> the permuted bytes (inverse: back), a new
    tensor on the same device."""
    rows, cols = shape
    if cols % 256 or raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != rows * cols // 32 * 34:
        raise KernelArgumentError(f"could not permute Q8_0 words: need {rows * cols // 32 * 34} bytes (1-D uint8) of "
                                  f"[{rows}, {cols}] with whole 256-value groups, got {raw.dtype} {list(raw.shape)}")
    order = torch.tensor(ORDER, device=raw.device)
    if inverse:
        order = torch.argsort(order)
    return raw.view(torch.int32).view(-1, GROUP_WORDS)[:, order].reshape(-1).view(torch.uint8)



def gate_up_permuted(table, align_bytes: int = 256):
    """An ExpertTable (moe.ExpertTable, Q8_0 gate/up) whose gate and up matrices are permuted (pack_raw) into a new
    buffer, each at a multiple of align_bytes (moe_pipe's PERM reads them on 16 bytes), the down where it was:
    moe_pipe's rows under Kernels.pipe_perm (a bench's and a test's; the engine's loader does not make them)."""
    if table.gate_up_type.name != "Q8_0":
        raise KernelArgumentError(f"could not permute the MoE gate/up words: {table.gate_up_type.name} is not Q8_0")
    span = table.width * table.dim // 32 * 34
    slot = -(-span // align_bytes) * align_bytes
    entries = [(buf, int(o)) for buf, offsets in ((table.gate, table.gate_offsets), (table.up, table.up_offsets))
               for o in offsets]
    at = {}  # (buffer, offset) -> new offset: a matrix two entries share is permuted once
    for buf, o in entries:
        at.setdefault((buf.data_ptr(), o), len(at) * slot)
    out = torch.empty(len(at) * slot, dtype=torch.uint8, device=table.gate.device)
    for buf, o in entries:
        new = at[(buf.data_ptr(), o)]
        out[new:new + span] = pack_raw(buf[o:o + span], (table.width, table.dim))
    return dataclasses.replace(table, gate=out, up=out,
                               gate_offsets=[at[(table.gate.data_ptr(), int(o))] for o in table.gate_offsets],
                               up_offsets=[at[(table.up.data_ptr(), int(o))] for o in table.up_offsets])
