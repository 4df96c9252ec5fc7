"""The VRAM expert cache of a discrete GPU (`--unified off`, what `auto` picks on one): N slots in
device memory, each holding one expert's gate, up and down raw blocks together, laid out as in an
arena slot so the same in-slot offsets serve both.

Admission: every use of an expert adds to its heat, a use count that halves every
`half_life_steps` forward passes. An expert read into the host arena is copied to VRAM only if a
slot is free or it is hotter than the coldest resident expert (which it then replaces). Hits are
served from VRAM; misses, and experts whose copy is still in flight, are served zero-copy from the
pinned arena, so decode never waits for a staging copy.

Copies run on a side CUDA stream. Before a copy overwrites a slot, the side stream waits for the
work queued on the compute stream so far (a kernel of an earlier layer may still read the victim);
an event per copy says when the slot may be read. The arena slot a copy reads stays pinned in the
host cache until that event has fired.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Container, Hashable, Iterable

import torch

from sparkd.engine.errors import EngineError

Key = Hashable  # (layer, expert)
DEFAULT_HALF_LIFE_STEPS = 32.0
# Copies in flight at once: each pins its source arena slot, so keep it to about one layer's top-k.
DEFAULT_MAX_PENDING = 16
_RENORMALIZE_AT = 1e100


class Heat:
    """Decayed use counts. Rather than decaying every count each step, a use is worth more every
    step (gain grows by 2**(1/half_life)): ratios, and so the order of any two keys, are the same."""

    def __init__(self, half_life_steps: float = DEFAULT_HALF_LIFE_STEPS):
        if half_life_steps <= 0:
            raise EngineError(f"could not use a heat half-life of {half_life_steps} steps: it must be positive")
        self._growth = 2.0 ** (1.0 / half_life_steps)
        self._gain = 1.0
        self._value: dict[Key, float] = {}

    def use(self, key: Key) -> float:
        v = self._value.get(key, 0.0) + self._gain
        self._value[key] = v
        return v

    def __getitem__(self, key: Key) -> float:
        return self._value.get(key, 0.0)

    def decayed(self, key: Key) -> float:
        """The key's heat in uses-now units (a use this step counts 1)."""
        return self._value.get(key, 0.0) / self._gain

    def step(self) -> bool:
        """A forward pass ended; True if every stored value was rescaled (stored values changed)."""
        self._gain *= self._growth
        if self._gain < _RENORMALIZE_AT:
            return False
        self._value = {k: v / self._gain for k, v in self._value.items()}
        self._gain = 1.0
        return True


class Admission:
    """Which experts hold the VRAM slots. offer() decides; the caller copies."""

    def __init__(self, n_slots: int, half_life_steps: float = DEFAULT_HALF_LIFE_STEPS):
        self.n_slots = n_slots
        self.heat = Heat(half_life_steps)
        self.slot_of: dict[Key, int] = {}
        self._free = list(range(n_slots - 1, -1, -1))
        self._heap: list[tuple[float, int, Key]] = []  # (heat, tie, key); stale entries skipped
        self._tie = 0

    def __contains__(self, key: Key) -> bool:
        return key in self.slot_of

    def __len__(self) -> int:
        return len(self.slot_of)

    def use(self, key: Key) -> None:
        v = self.heat.use(key)
        if key in self.slot_of:
            self._push(key, v)

    def step(self) -> None:
        if self.heat.step():
            self._rebuild()

    def coldest(self, busy: Container[Key] = ()) -> Key | None:
        """The resident key with the least heat that is not busy, or None."""
        skipped, found = [], None
        while self._heap:
            v, tie, key = self._heap[0]
            if key not in self.slot_of or self.heat[key] != v:
                heapq.heappop(self._heap)  # stale: evicted, or used again since
                continue
            if key in busy:
                skipped.append(heapq.heappop(self._heap))
                continue
            found = key
            break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return found

    def offer(self, key: Key, busy: Container[Key] = ()) -> tuple[int, Key | None] | None:
        """(slot, evicted key or None) if key is admitted: a slot is free, or key is hotter than
        the coldest resident that is not busy; else None. Resident keys are not offered again."""
        if key in self.slot_of or self.n_slots == 0:
            return None
        victim = None
        if self._free:
            slot = self._free.pop()
        else:
            victim = self.coldest(busy)
            if victim is None or self.heat[key] <= self.heat[victim]:
                return None
            slot = self.slot_of.pop(victim)
        self.slot_of[key] = slot
        self._push(key, self.heat[key])
        return slot, victim

    def drop(self, key: Key) -> None:
        slot = self.slot_of.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def _push(self, key: Key, v: float) -> None:
        self._tie += 1
        heapq.heappush(self._heap, (v, self._tie, key))
        if len(self._heap) > 4 * self.n_slots + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = []
        for key in self.slot_of:
            self._tie += 1
            self._heap.append((self.heat[key], self._tie, key))
        heapq.heapify(self._heap)


@dataclass
class VramStats:
    requests: int = 0  # expert uses seen by the VRAM cache (every selected expert)
    hits: int = 0  # served from a VRAM slot
    in_flight: int = 0  # resident but its copy not done yet: served from the arena instead
    admissions: int = 0
    rejections: int = 0  # read into the arena but colder than the coldest resident
    evictions: int = 0
    skipped_busy: int = 0  # not offered: max_pending copies already in flight
    copies_overlapped: int = 0  # copies on the side stream seen complete, none of them waited for
    bytes_copied: int = 0
    copy_seconds: float = 0.0  # GPU time of the copies seen complete (their events on the side stream)

    def as_dict(self) -> dict:
        d = {f"vram_{k}": v for k, v in self.__dict__.items()}
        d["vram_hit_rate"] = self.hits / self.requests if self.requests else 0.0
        return d


class VramExperts:
    """The slots, the admission policy and the copies. `device` may be the CPU (tests): then a
    copy is synchronous and ready at once."""

    def __init__(self, n_slots: int, slot_bytes: int, device: torch.device | str,
                 half_life_steps: float = DEFAULT_HALF_LIFE_STEPS, max_pending: int = DEFAULT_MAX_PENDING):
        self.device = torch.device(device)
        self.n_slots, self.slot_bytes, self.max_pending = n_slots, slot_bytes, max_pending
        try:
            self.buffer = torch.empty(max(1, n_slots * slot_bytes), dtype=torch.uint8, device=self.device)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            raise EngineError(f"could not allocate the VRAM expert cache of {n_slots * slot_bytes} bytes "
                              f"({n_slots} slots) on {self.device}: {exc}; lower --vram-budget") from exc
        self.admission = Admission(n_slots, half_life_steps)
        self.stats = VramStats()
        self._pending: dict[Key, tuple] = {}  # key -> CUDA (start, end) events of its copy, until seen complete
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._step = -1

    def note_step(self, step: int) -> None:
        """The store's forward-pass counter: decay the heat once per new pass."""
        if step != self._step:
            if self._step >= 0:
                self.admission.step()
            self._step = step

    def use(self, keys: Iterable[Key]) -> dict[Key, int]:
        """Count a use of each key; {key: slot} of those a kernel may read from VRAM now."""
        self._reap()
        out = {}
        for key in keys:
            self.stats.requests += 1
            self.admission.use(key)
            slot = self.admission.slot_of.get(key)
            if slot is None:
                continue
            if key in self._pending:
                self.stats.in_flight += 1
            else:
                self.stats.hits += 1
                out[key] = slot
        return out

    def pending_keys(self) -> list[Key]:
        """Keys whose copy may still read their arena slot (keep those slots pinned)."""
        self._reap()
        return list(self._pending)

    def offer(self, key: Key, source: torch.Tensor | Callable[[], torch.Tensor], busy: Container[Key] = ()) -> bool:
        """Admit key if it earns a slot and copy `source` (its arena slot's bytes, or a function
        making that view: most offers are refused, and then it is never made) there."""
        if len(self._pending) >= self.max_pending:
            self.stats.skipped_busy += 1
            return False
        got = self.admission.offer(key, _Either(busy, self._pending))
        if got is None:
            self.stats.rejections += key not in self.admission
            return False
        slot, victim = got
        self.stats.admissions += 1
        self.stats.evictions += victim is not None
        self._copy(key, slot, source() if callable(source) else source)
        return True

    def _copy(self, key: Key, slot: int, source: torch.Tensor) -> None:
        n = source.numel()
        if n > self.slot_bytes:
            raise EngineError(f"could not copy expert {key} to VRAM: {n} bytes exceed the slot of {self.slot_bytes}")
        dst = self.buffer[slot * self.slot_bytes:slot * self.slot_bytes + n]
        if self._stream is None:
            dst.copy_(source)
        else:
            # a kernel queued before now may still read the victim's bytes: copy after it
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(self._stream)
                dst.copy_(source, non_blocking=True)
                end.record(self._stream)
            self._pending[key] = (start, end)
        self.stats.bytes_copied += n

    def _reap(self) -> None:
        for key in [k for k, (_, end) in self._pending.items() if end.query()]:
            start, end = self._pending.pop(key)
            self.stats.copy_seconds += start.elapsed_time(end) / 1e3
            self.stats.copies_overlapped += 1

    def finish_copies(self) -> None:
        """Wait for the copies in flight and count them (a profile's end)."""
        if self._stream is not None:
            self._stream.synchronize()
        self._reap()

    def slot_offset(self, slot: int) -> int:
        return slot * self.slot_bytes

    def close(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._pending.clear()
        self.buffer = torch.empty(0, dtype=torch.uint8)


class _Either:
    """Membership in either of two containers (busy keys: this selection's, or mid-copy)."""

    def __init__(self, a: Container[Key], b: Container[Key]):
        self.a, self.b = a, b

    def __contains__(self, key: Key) -> bool:
        return key in self.a or key in self.b
