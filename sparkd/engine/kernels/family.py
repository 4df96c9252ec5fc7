"""What a quant family's Triton code tells the generic kernels: its block layout and one jitted
`dequant` that turns one 256-value group of a tile of rows into float32 values.

Every family dequantizes a group as [BN rows, NSUB sub-blocks, SUBLEN values] (the sub-block is
the unit that carries one scale), so the generic kernels load the activations in the same shape
and never need a per-family layout conversion.

dequant(w_ptr, row_off, g, smask) contract:
  w_ptr   uint8 pointer (a weight tensor, an arena, or mapped host memory)
  row_off int64 [BN, 1, 1] byte offset of each row's first block
  g       group index along the row (values g*256 ... g*256+255)
  smask   bool [BN, NSUB, 1]: which (row, sub-block) pairs exist (row past the end, or a Q8_0
          row that ends inside the group); masked values must come back as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf.constants import GGMLQuantizationType



@dataclass(frozen=True)
class Family:
    qtype: GGMLQuantizationType
    block_values: int  # values per GGUF block
    block_bytes: int  # bytes per GGUF block
    nsub: int  # sub-blocks per 256-value group
    sublen: int  # values per sub-block
    dequant: Any  # triton.JITFunction

    def row_bytes(self, cols: int) -> int:
        return cols // self.block_values * self.block_bytes
