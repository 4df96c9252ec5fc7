"""StreamingExperts: the ExpertStore that keeps routed experts on disk and a bounded cache of them
in arena slots, quantized; an expert is dequantized only while the MoE block computes it.

Per get(layer, ids): cached experts are pinned and put first in the compute order, reads for
the others are issued at once (as many as there are evictable slots), and each expert is waited
for only when the MoE block reaches it, so cached experts compute while the reads land. An expert
is unpinned when the block moves past it, which also lets a batch touching more experts than the
cache holds (a long prompt) stream through it.
"""

from __future__ import annotations

import mmap
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

import torch

from sparkd.engine.errors import EngineError
from sparkd.engine.gguf_file import GGUFModel, TensorInfo
from sparkd.engine.layers.act_round import vec_dot_format
from sparkd.engine.layers.experts import DOWN, GATE, UP, ExpertWeights
from sparkd.engine.quants import dequantize
from sparkd.engine.streaming.arena import Arena
from sparkd.engine.streaming.plan import MemoryPlan, bracket_bytes
from sparkd.engine.streaming.policies import DEFAULT_POLICY, make_policy
from sparkd.engine.streaming.reader import DEMAND, PREFETCH, ExpertRead, ExpertReader, Part
from sparkd.engine.tensors import load_tensor

Key = tuple[int, int]  # (layer, expert)


@dataclass
class CacheStats:
    requests: int = 0
    hits: int = 0
    misses: int = 0  # includes experts a prefetch had already read: their bytes were read too
    evictions: int = 0
    bytes_read: int = 0
    payload_bytes: int = 0  # the experts' own bytes among bytes_read; the rest is 4 KiB bracketing
    read_seconds: float = 0.0  # wall time with demand reads outstanding
    wait_seconds: float = 0.0  # time compute blocked on reads
    tokens: int = 0
    # the GPU path's host side per layer (zero_copy.py): waiting for the routing ids (the one
    # device-to-host sync of a layer), offering experts to the VRAM cache, building the kernel table
    host_sync_seconds: float = 0.0
    admission_seconds: float = 0.0
    table_seconds: float = 0.0
    prefetch_predicted: int = 0
    prefetch_useful: int = 0
    prefetch_wasted: int = 0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["retention"] = 1.0 - self.evictions / self.requests if self.requests else 1.0
        d["hit_rate"] = self.hits / self.requests if self.requests else 0.0
        d["bandwidth_bytes_per_second"] = self.bytes_read / self.read_seconds if self.read_seconds else 0.0
        d["bytes_per_token"] = self.bytes_read / self.tokens if self.tokens else 0.0
        return d


@dataclass
class _Layer:
    infos: tuple[TensorInfo, TensorInfo, TensorInfo]  # gate, up, down stacked tensors
    biases: tuple[torch.Tensor | None, ...] = (None, None, None)


class StreamingExperts:
    def __init__(self, g: GGUFModel, plan: MemoryPlan, policy: str = DEFAULT_POLICY, threads: int = 8,
                 direct: bool = True, pin: bool = False, trace: TextIO | None = None,
                 warn: Callable[[str], None] | None = None):
        self.g, self.plan = g, plan
        self.stats = CacheStats()
        self.arena = Arena(plan.cache_slots + plan.prefetch_slots, plan.slot_bytes, pin=pin)
        self.reader = ExpertReader(g, self.arena, threads=threads, direct=direct, warn=warn)
        self.capacity = plan.cache_slots
        self.policy = make_policy(policy, self.capacity)
        self._slot_of: dict[Key, int] = {}
        self._free = list(range(plan.cache_slots))
        self._retired: list[int] = []
        self._pf_free = list(range(plan.cache_slots, plan.cache_slots + plan.prefetch_slots))
        self._prefetched: dict[Key, ExpertRead] = {}
        self._draining: list[ExpertRead] = []  # dropped prefetches whose reads are still landing
        self._pinned: set[Key] = set()
        self._layers: dict[int, _Layer] = {}
        self._parts: dict[Key, list[Part]] = {}  # parts(): one list per expert, made once
        self._lock = threading.RLock()
        self._trace, self._step, self._last_layer = trace, 0, -1
        self.kernel_device: str | None = None  # set: decode reads slots in place (zero_copy.py)
        self.vram = None  # a VramExperts on a discrete GPU: hot experts served from device memory
        self.on_kernel_select: Callable[[], None] | None = None  # profile.py: the expert kernels start
        self.table_mode = "cached"  # zero_copy.py: kernel tables from a checked template, or "checked"
        self.tables: dict = {}  # zero_copy.py's checked templates (they hold the arena / VRAM buffer)
        self.table_parts: dict = {}  # zero_copy.py: per (layer, expert, template) its parts' in-slot offsets, checked
        self.selections: dict = {}  # zero_copy.py: selections over a caller's fixed offsets buffer
        self._scratch: list[torch.Tensor] = [torch.empty(0)] * 3  # f32 gate, up, down of one expert

    def scratch(self, part: int, n_values: int) -> torch.Tensor:
        """The reused f32 buffer an expert's gate, up or down is dequantized into: one per part,
        so no allocation (and no fresh zeroed pages) per expert; the plan's workspace counts it."""
        if self._scratch[part].numel() < n_values:
            self._scratch[part] = torch.empty(n_values, dtype=torch.float32)
        return self._scratch[part]

    # --- layout ----------------------------------------------------------------------------------
    def _layer(self, il: int) -> _Layer:
        if il not in self._layers:
            names = [f"blk.{il}.{n}" for n in (GATE, UP, DOWN)]
            biases = tuple(load_tensor(self.g, f"{n}.bias") if f"{n}.bias" in self.g.tensors else None
                           for n in names)
            self._layers[il] = _Layer(tuple(self.g.tensor(f"{n}.weight") for n in names), biases)
        return self._layers[il]

    def parts(self, il: int, expert: int) -> list[Part]:
        """The expert's gate, up and down as they lie in the file and in a slot; made once per
        expert (they never change; every read and kernel table asks)."""
        key = (il, expert)
        if key not in self._parts:
            self._parts[key] = self._make_parts(il, expert)
        return self._parts[key]

    def _make_parts(self, il: int, expert: int) -> list[Part]:
        out, at = [], 0
        for info in self._layer(il).infos:
            offset, nbytes = info.leading_slice(expert)
            start, length = bracket_bytes(offset, nbytes)
            out.append(Part(info.path, offset, nbytes, start, length, at))
            at += length
        return out

    def expert_bytes(self, il: int) -> int:
        return sum(info.leading_slice(0)[1] for info in self._layer(il).infos)

    # --- the ExpertStore interface -----------------------------------------------------------------
    def get(self, layer: int, expert_ids: Sequence[int]) -> ExpertWeights:
        ids = [int(e) for e in expert_ids]
        with self._lock:
            self.start_layer()
            self._record(layer, ids)
            batch = _Batch(self, layer, ids)
        lay = self._layer(layer)
        idx = torch.as_tensor(ids, dtype=torch.long, device="cpu")  # the biases live with the arena, on the host
        gb, ub, db = (None if b is None else b.index_select(0, idx) for b in lay.biases)
        # activations rounded as llama.cpp's matmul against each weight type does (see act_round)
        act_gate, act_up, act_down = (vec_dot_format(info.ggml_type) for info in lay.infos)
        return ExpertWeights(_Lazy(batch, 0), _Lazy(batch, 1), _Lazy(batch, 2), gb, ub, db,
                             act_gate, act_up, act_down, order=batch.order)

    def x_format(self, il: int) -> str | None:
        """The int8 block format the MoE kernels quantize layer il's x to, for the norm before it
        (cuda_graphs.link_norm_quant); None without a kernel device or an integer gate/up."""
        if self.kernel_device is None:
            return None
        from sparkd.engine.streaming.zero_copy import x_format

        return x_format(self, il, self.kernel_device)

    def kernel_select(self, layer: int, expert_ids, offsets_out=None):
        """Kernel table of one token's experts, from VRAM slots and arena slots (see zero_copy.py),
        or None: no kernel device set, or a layer the kernels cannot run. offsets_out: int64 [3 x
        count] on the device the table's offsets are copied into (cached table mode; a graph reads
        them there)."""
        if self.kernel_device is None:
            return None
        from sparkd.engine.streaming.zero_copy import kernel_select

        t0 = time.perf_counter()
        ids = expert_ids.tolist() if hasattr(expert_ids, "tolist") else expert_ids  # waits for the router
        self.stats.host_sync_seconds += time.perf_counter() - t0
        sel = kernel_select(self, layer, ids, self.kernel_device, offsets_out)
        if self.on_kernel_select is not None:
            self.on_kernel_select()
        return sel

    def start_layer(self) -> None:
        """Unpin the previous layer's experts, which it is done with, but not the arena slots that
        copies to the VRAM cache still read."""
        self._pinned.clear()
        if self.vram is not None:
            self._pinned.update(self.vram.pending_keys())

    def _record(self, layer: int, ids: list[int]) -> None:
        if layer <= self._last_layer:
            self._step += 1
        self._last_layer = layer
        self._drop_stale_prefetches(layer)
        if self._trace is not None:
            self._trace.write(f"{self._step} {layer} {' '.join(map(str, ids))}\n")

    def warm_start(self, keys: Sequence[Key]) -> int:
        """Load the given experts (hottest first) until the cache is full; returns how many."""
        reads = []
        with self._lock:
            for layer, e in keys:
                if len(self._slot_of) >= self.capacity:
                    break
                if f"blk.{layer}.{GATE}.weight" not in self.g.tensors or (layer, e) in self._slot_of:
                    continue
                slot = self.claim((layer, e))
                reads.append(((layer, e), self.reader.submit(layer, e, slot, self.parts(layer, e), DEMAND)))
        for key, read in reads:
            try:
                read.wait()
            except BaseException:
                self.forget(key)
                raise
        self._pinned.clear()
        return len(reads)

    def note_tokens(self, n: int) -> None:
        self.stats.tokens += n

    # --- slots ------------------------------------------------------------------------------------
    def claim(self, key: Key) -> int | None:
        """A cache slot for key (evicting if needed), or None while every entry is pinned."""
        if self._free:
            slot = self._free.pop()
        elif len(self.policy) > len(self._pinned & self._slot_of.keys()):
            victim = self.policy.evict(self._pinned)
            slot = self._slot_of.pop(victim)
            self.stats.evictions += 1
        else:
            return None
        self.policy.insert(key)
        self._slot_of[key] = slot
        self._pinned.add(key)
        return slot

    def forget(self, key: Key) -> None:
        """Drop key after a failed read so no one treats its slot as valid."""
        with self._lock:
            slot = self._slot_of.pop(key, None)
            if slot is not None:
                self._pinned.discard(key)
                self.policy.remove(key)
                self._free.append(slot)

    def release(self, key: Key) -> None:
        with self._lock:
            self._pinned.discard(key)

    # --- prefetch ----------------------------------------------------------------------------------
    def prefetch(self, layer: int, expert_ids: Sequence[int]) -> None:
        """Low-priority reads of experts a later layer will probably ask for; bounded by the
        prefetch slots, never evicting cached experts, dropped if that layer does not use them.
        Experts the VRAM cache holds are skipped: the kernels read them there, not from a slot."""
        vram = self.vram.admission if self.vram is not None else ()
        with self._lock:
            self._reap_draining()
            for e in expert_ids:
                key = (layer, int(e))
                if key in self._slot_of or key in self._prefetched or key in vram or not self._pf_free:
                    continue
                slot = self._pf_free.pop()
                self.stats.payload_bytes += sum(p.nbytes for p in self.parts(layer, int(e)))
                self._prefetched[key] = self.reader.submit(layer, int(e), slot, self.parts(layer, int(e)),
                                                           PREFETCH)
                self.stats.prefetch_predicted += 1

    def adopt_prefetched(self, key: Key) -> ExpertRead | None:
        """Move a prefetched expert into the cache by swapping its slot for a cache slot."""
        read = self._prefetched.pop(key, None)
        if read is None:
            return None
        cache_slot = self.claim(key)
        if cache_slot is None:  # cannot happen with top-k slots, but keep the prefetch usable
            self._prefetched[key] = read
            return None
        self._slot_of[key] = read.slot
        self._pf_free.append(cache_slot)
        self.stats.prefetch_useful += 1
        return read

    def begin_step(self) -> None:
        """A forward pass starts: prefetches left from the previous one are stale."""
        with self._lock:
            self._drop_stale_prefetches(1 << 30)

    def _drop_stale_prefetches(self, layer: int) -> None:
        for key in [k for k in self._prefetched if k[0] < layer]:  # that layer has run
            self._draining.append(self._prefetched.pop(key))
            self.stats.prefetch_wasted += 1
        self._reap_draining()

    def _reap_draining(self) -> None:
        for read in [r for r in self._draining if r.done]:
            self._draining.remove(read)
            self._pf_free.append(read.slot)

    # --- resize --------------------------------------------------------------------------------------
    def resize(self, cache_bytes: int) -> int:
        """Shrink or grow the expert cache (up to what the plan allocated); returns the new size in
        bytes. Shrinking evicts entries and returns their pages to the kernel."""
        slots = cache_bytes // self.plan.slot_bytes
        if slots < self.plan.min_slots:
            raise EngineError(f"could not resize the expert cache to {cache_bytes} bytes: it must hold "
                              f"at least top-{self.plan.min_slots} experts "
                              f"({self.plan.min_slots * self.plan.slot_bytes} bytes)")
        if slots > self.plan.cache_slots:
            raise EngineError(f"could not grow the expert cache to {cache_bytes} bytes: the plan allocated "
                              f"{self.plan.expert_cache_bytes} bytes; restart with a larger --budget")
        with self._lock:
            while self.capacity > slots:
                if not self._free:
                    if len(self.policy) <= len(self._pinned & self._slot_of.keys()):
                        break  # pinned entries go at the next shrink request
                    victim = self.policy.evict(self._pinned)
                    self._free.append(self._slot_of.pop(victim))
                    self.stats.evictions += 1
                slot = self._free.pop()
                self._retired.append(slot)
                self._discard_pages(slot)
                self.capacity -= 1
            while self.capacity < slots:
                self._free.append(self._retired.pop())
                self.capacity += 1
            self.policy.resize(self.capacity)
            return self.capacity * self.plan.slot_bytes

    def _discard_pages(self, slot: int) -> None:
        m = getattr(self.arena, "_map", None)
        if m is not None and hasattr(mmap, "MADV_DONTNEED"):
            m.madvise(mmap.MADV_DONTNEED, slot * self.plan.slot_bytes, self.plan.slot_bytes)

    def snapshot(self) -> dict:
        d = self.stats.as_dict()
        d["bytes_read"] = self.reader.bytes_read
        d["bandwidth_bytes_per_second"] = (self.reader.bytes_read / self.stats.read_seconds
                                           if self.stats.read_seconds else 0.0)
        d["bytes_per_token"] = self.reader.bytes_read / self.stats.tokens if self.stats.tokens else 0.0
        d.update(policy=self.policy.name, capacity_slots=self.capacity, cached=len(self._slot_of),
                 direct_io=self.reader.direct, pinned_memory=self.arena.pinned)
        if self.vram is not None:
            d.update(self.vram.stats.as_dict(), vram_slots=self.vram.n_slots, vram_cached=len(self.vram.admission))
        return d

    def close(self) -> None:
        for read in list(self._prefetched.values()) + self._draining:
            read._done.wait()
        self.tables.clear()  # they hold the VRAM buffer and the arena
        self.selections.clear()
        if self.vram is not None:
            self.vram.close()  # its copies read the arena: done before the arena goes
        self.reader.close()
        self.arena.release()


class _Batch:
    """One get(): the experts of a layer, their slots, reads, and the compute order."""

    def __init__(self, store: StreamingExperts, layer: int, ids: list[int]):
        self.store, self.layer, self.ids = store, layer, ids
        self.reads: dict[int, ExpertRead] = {}
        self.slots: dict[int, int] = {}
        self.current: int | None = None
        self.cached: tuple[int, list[torch.Tensor | None]] | None = None
        self.t_issue = time.perf_counter()
        hits, pending = [], []
        st = store.stats
        for j, e in enumerate(ids):
            key = (layer, e)
            st.requests += 1
            if key in store._slot_of:
                st.hits += 1
                store.policy.hit(key)
                store._pinned.add(key)
                self.slots[j] = store._slot_of[key]
                hits.append(j)
                continue
            st.misses += 1
            read = store.adopt_prefetched(key)
            if read is not None:
                self.reads[j], self.slots[j] = read, read.slot
                store._pinned.add(key)
                hits.append(j)  # already landing: compute it before fresh misses
            else:
                pending.append(j)
        self.first_miss = pending[0] if pending else None
        self.deferred = [j for j in pending if not self._issue(j)]
        self.order = hits + pending

    def _issue(self, j: int) -> bool:
        key = (self.layer, self.ids[j])
        parts = self.store.parts(*key)
        if j == self.first_miss:  # one stat() per layer with misses: was the file replaced?
            for p in {p.path: p for p in parts}.values():
                self.store.reader.check_unchanged(p.path, self.layer, self.ids[j], p.offset)
        slot = self.store.claim(key)
        if slot is None:
            return False
        self.slots[j] = slot
        self.store.stats.payload_bytes += sum(p.nbytes for p in parts)
        self.reads[j] = self.store.reader.submit(self.layer, self.ids[j], slot, parts, DEMAND)
        return True

    def weights(self, j: int) -> list[torch.Tensor | None]:
        """Dequantized [gate, up, down] of position j, waiting for its read if needed."""
        if self.cached is not None and self.cached[0] == j:
            return self.cached[1]
        store = self.store
        if self.current is not None:
            store.release((self.layer, self.ids[self.current]))
        self.current = j
        if j in self.deferred:
            with store._lock:
                if not self._issue(j):
                    raise EngineError(f"could not find a free expert slot for layer {self.layer}: "
                                      "every slot is pinned (the cache is smaller than the plan's minimum)")
            self.deferred.remove(j)
        read = self.reads.get(j)
        if read is not None:
            self._wait(j, read)
        self.cached = (j, [None, None, None])
        return self.cached[1]

    def _wait(self, j: int, read: ExpertRead) -> None:
        t0 = time.perf_counter()
        try:
            read.wait()
        except BaseException:
            self.store.forget((self.layer, self.ids[j]))
            raise
        st = self.store.stats
        st.wait_seconds += time.perf_counter() - t0
        if read.priority == DEMAND:
            # wall time this batch had demand reads outstanding; batches run one after another
            start = max(read.started, getattr(self, "_read_until", 0.0))
            st.read_seconds += max(0.0, read.finished - start)
            self._read_until = max(read.finished, getattr(self, "_read_until", 0.0))
        del self.reads[j]

    def tensor(self, j: int, part: int) -> torch.Tensor:
        """Expert j's weight, valid until another expert's same part is asked for (one buffer)."""
        ws = self.weights(j)
        if ws[part] is None:
            info = self.store._layer(self.layer).infos[part]
            p = self.store.parts(self.layer, self.ids[j])[part]
            raw = self.store.arena.view(self.slots[j], p.data_offset, p.nbytes)
            shape = info.shape[1:]
            ws[part] = dequantize(raw, info.ggml_type, shape, out=self.store.scratch(part, shape[0] * shape[1]))
        return ws[part]


class _Lazy:
    """Stands in for a stacked [A, ...] weight tensor: indexing by position dequantizes one expert."""

    def __init__(self, batch: _Batch, part: int):
        self.batch, self.part = batch, part

    def __getitem__(self, j: int) -> torch.Tensor:
        return self.batch.tensor(int(j), self.part)

    def __len__(self) -> int:
        return len(self.batch.ids)
