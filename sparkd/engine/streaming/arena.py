"""One allocation for every expert slot, made once from the plan: page-aligned (O_DIRECT reads land
in it directly) and pinned when CUDA is used, so a GPU kernel can read a slot without a copy.
Nothing else in the streaming store allocates memory that grows with the model.

Pinned: an anonymous mapping of exactly the planned size, registered with CUDA (cudaHostRegister;
mapped into the device's address space under UVA). torch's pinned allocator would round the size
up to a power of two (a 2.8 GiB arena took 4 GiB), memory the plan never counted; it is the
fallback where registering fails."""

from __future__ import annotations

import mmap

import numpy as np
import torch

from sparkd.engine.errors import EngineError
from sparkd.engine.streaming.plan import ALIGN_BYTES


class Arena:
    def __init__(self, n_slots: int, slot_bytes: int, pin: bool = False):
        if slot_bytes % ALIGN_BYTES:
            raise EngineError(f"could not allocate the expert arena: slot size {slot_bytes} is not a "
                              f"multiple of {ALIGN_BYTES}")
        self.n_slots, self.slot_bytes, self.pinned = n_slots, slot_bytes, pin
        size = max(1, n_slots * slot_bytes)
        self._registered = False
        try:
            # an anonymous mapping: page-aligned, and untouched pages cost nothing yet
            mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.tensor = torch.frombuffer(mapping, dtype=torch.uint8)
            if not pin:
                self._map = mapping  # resize may give a slot's pages back (never pinned pages)
            elif self._register(size):
                self._registered_map = mapping
            else:
                self.tensor = None
                mapping.close()
                # torch's pinned host allocator does not promise page alignment: align inside
                self._pinned = torch.empty(size + ALIGN_BYTES, dtype=torch.uint8, pin_memory=True)
                offset = -self._pinned.data_ptr() % ALIGN_BYTES
                self.tensor = self._pinned[offset:offset + size]
        except (RuntimeError, OSError) as exc:
            raise EngineError(f"could not allocate the expert arena of {size} bytes "
                              f"({n_slots} slots, pinned={pin}): {exc}") from exc
        self._array = self.tensor.numpy()
        if self._array.ctypes.data % ALIGN_BYTES:
            raise EngineError("could not allocate the expert arena: memory is not page-aligned")

    def _register(self, size: int) -> bool:
        """Pin the mapping for CUDA in place; False (nothing pinned) where that does not work."""
        try:
            cudart = torch.cuda.cudart()
            if int(cudart.cudaHostRegister(self.tensor.data_ptr(), size, 0)) != 0:
                return False
        except (AttributeError, RuntimeError, AssertionError):  # torch without CUDA
            return False
        if not self.tensor.is_pinned():  # the kernels' device check would refuse it
            cudart.cudaHostUnregister(self.tensor.data_ptr())
            return False
        self._registered = True
        return True

    @property
    def nbytes(self) -> int:
        return self.n_slots * self.slot_bytes

    def buffer(self, slot: int, start: int, nbytes: int) -> memoryview:
        """Writable bytes [start, start+nbytes) of a slot, for a read to land in."""
        base = slot * self.slot_bytes + start
        return memoryview(self._array[base:base + nbytes])

    def view(self, slot: int, start: int, nbytes: int) -> torch.Tensor:
        """The same bytes as a uint8 tensor (no copy)."""
        base = slot * self.slot_bytes + start
        return self.tensor[base:base + nbytes]

    def release(self) -> None:
        """Drop the memory (the store was closed); views taken before must not be used after."""
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self._registered = False
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self._pinned = None
        self._array = np.empty(0, dtype=np.uint8)
