"""Trunk tensors onto a device through one bounded host buffer.

Building the network on the host and moving it afterwards holds the whole trunk in host memory
at once, dequantized to float32 where the GPU path keeps it so (the token embedding of a
151936 x 2048 vocabulary is 1.2 GiB of f32 from 0.33 GiB of Q8_0 blocks): on the H200 that load
peaked 1.2-1.5 GB above the steady state (docs/performance.md). Here each tensor's file bytes
go chunk by chunk through two halves of one staging buffer (pinned for CUDA, so a copy out of one
half overlaps the read into the other) into a uint8 tensor on the device, and are dequantized
there; the page cache over each chunk is dropped once it is read. The host holds the buffer and
nothing that grows with the model.
"""

from __future__ import annotations

import torch

from sparkd.engine.gguf_file import GGUFModel, TensorInfo

# One half of the staging buffer: large enough that a host-to-device copy runs at full PCIe
# speed and the per-chunk Python overhead is noise, small next to any model's trunk.
STAGING_CHUNK_BYTES = 16 << 20
_PAGE_BYTES = 4096


def staging_chunk_bytes(largest_tensor_bytes: int, chunk_bytes: int = STAGING_CHUNK_BYTES) -> int:
    """One half of the buffer: chunk_bytes, or the largest tensor if smaller, in whole pages."""
    return min(_pages(chunk_bytes), _pages(largest_tensor_bytes))


def _pages(nbytes: int) -> int:
    return max(_PAGE_BYTES, -(-nbytes // _PAGE_BYTES) * _PAGE_BYTES)


def staging_buffer_bytes(largest_tensor_bytes: int) -> int:
    """Host bytes the loader holds while the trunk goes to a device: both halves of the buffer."""
    return 2 * staging_chunk_bytes(largest_tensor_bytes)


class DeviceStager:
    """Reads tensors of `model` straight into `device` memory. Close it after the load."""

    def __init__(self, model: GGUFModel, device: str | torch.device, largest_tensor_bytes: int,
                 chunk_bytes: int = STAGING_CHUNK_BYTES):
        # here, not at the top: streaming imports models
        from sparkd.engine.streaming.arena import Arena

        self.model, self.device = model, torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.chunk_bytes = staging_chunk_bytes(largest_tensor_bytes, chunk_bytes)
        # an exact-size anonymous mapping, registered with CUDA when pinned (see Arena)
        self._buffer = Arena(2, self.chunk_bytes, pin=self._cuda)
        self._copied: list[torch.cuda.Event | None] = [None, None]  # each half's last copy out
        model.read_ahead(False)  # read-ahead pages would outlive the per-chunk drop below

    @property
    def buffer_bytes(self) -> int:
        """Host bytes the stager holds: the buffer's, 0 once closed."""
        return 0 if self._buffer is None else self._buffer.nbytes

    def raw(self, info: TensorInfo) -> torch.Tensor:
        """The tensor's file bytes as a uint8 tensor on the device."""
        out = torch.empty(info.nbytes, dtype=torch.uint8, device=self.device)
        for i, start in enumerate(range(0, info.nbytes, self.chunk_bytes)):
            half, n = i % 2, min(self.chunk_bytes, info.nbytes - start)
            if self._copied[half] is not None:
                self._copied[half].synchronize()  # its previous copy must be done before a new read
            self.model.read_into(info, start, self._buffer.buffer(half, 0, n))
            self.model.drop_cached(info, start, n)
            out[start:start + n].copy_(self._buffer.view(half, 0, n), non_blocking=self._cuda)
            if self._cuda:
                self._copied[half] = torch.cuda.Event()
                self._copied[half].record()
        return out

    def close(self) -> None:
        for event in self._copied:
            if event is not None:
                event.synchronize()
        self._copied = [None, None]
        if self._buffer is not None:
            # a read-ahead still in flight when its chunk was dropped lands after the drop
            self.model.drop_page_cache()
            self.model.read_ahead(True)
            self._buffer.release()
            self._buffer = None  # the mapping goes back to the kernel with the Arena
