"""Replay a routing trace through every cache policy and Belady's optimum at a given capacity.

The replay follows the store exactly: each request's experts are pinned while the layer runs
(never evicted by that layer's own misses), so for the same policy and capacity a live run
without prefetch and its replay count the same hits, misses and evictions.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sparkd.engine.streaming.policies import POLICIES, Policy
from sparkd.engine.streaming.trace import Trace


@dataclass
class SimResult:
    policy: str
    requests: int
    hits: int
    misses: int
    evictions: int

    @property
    def retention(self) -> float:
        return 1.0 - self.evictions / self.requests if self.requests else 1.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0


def simulate(trace: Trace, policy: Policy, capacity: int, warm: list[tuple[int, int]] = ()) -> SimResult:
    res = SimResult(policy.name, 0, 0, 0, 0)
    for key in list(warm)[:capacity]:
        policy.insert(key)
    for _, layer, ids in trace.calls:
        keys = [(layer, e) for e in ids]
        pinned = {k for k in keys if k in policy}
        for k in keys:
            res.requests += 1
            if k in pinned:
                res.hits += 1
                policy.hit(k)
                continue
            res.misses += 1
            if len(policy) >= capacity:
                policy.evict(pinned if len(pinned) < len(policy) else ())
                res.evictions += 1
            policy.insert(k)
            pinned.add(k)
    return res


def belady(trace: Trace, capacity: int, warm: list[tuple[int, int]] = ()) -> SimResult:
    """Evict the unpinned entry used farthest in the future (the offline optimum for misses)."""
    seq = [(layer, e) for _, layer, ids in trace.calls for e in ids]
    nxt, last = [0] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], len(seq) + i)
        last[seq[i]] = i
    res = SimResult("belady", 0, 0, 0, 0)
    cached: dict[tuple[int, int], int] = {}  # key -> its next use
    heap: list[tuple[int, tuple[int, int]]] = []
    for key in list(warm)[:capacity]:
        cached[key] = last.get(key, 1 << 60)
        heapq.heappush(heap, (-cached[key], key))
    i = 0
    for _, layer, ids in trace.calls:
        pinned = {(layer, e) for e in ids if (layer, e) in cached}  # as the store pins hits first
        for e in ids:
            key = (layer, e)
            res.requests += 1
            if key in cached:
                res.hits += 1
            else:
                res.misses += 1
                if len(cached) >= capacity:
                    _evict_farthest(cached, heap, pinned)
                    res.evictions += 1
            cached[key] = nxt[i]
            heapq.heappush(heap, (-nxt[i], key))
            pinned.add(key)
            i += 1
    return res


def _evict_farthest(cached: dict, heap: list, pinned: set) -> None:
    skipped = []
    while heap:
        neg, key = heapq.heappop(heap)
        if cached.get(key) != -neg:
            continue
        if key in pinned and len(pinned) < len(cached):
            skipped.append((neg, key))
            continue
        del cached[key]
        break
    for entry in skipped:
        heapq.heappush(heap, entry)


def simulate_all(trace: Trace, capacity: int, warm: list[tuple[int, int]] = ()) -> list[SimResult]:
    out = [simulate(trace, make(capacity), capacity, warm) for make in POLICIES.values()]
    return out + [belady(trace, capacity, warm)]
