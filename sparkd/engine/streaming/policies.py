"""Expert-cache eviction policies behind one interface, for the store and the simulator alike.

A policy tracks which keys are cached and picks victims; the store owns the slots and the
capacity (in entries). `pinned` keys (experts of the layer being computed) are never chosen.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from typing import Callable, Container, Hashable, Protocol

Key = Hashable


class Policy(Protocol):
    name: str

    def __contains__(self, key: Key) -> bool: ...
    def __len__(self) -> int: ...
    def hit(self, key: Key) -> None: ...
    def insert(self, key: Key) -> None: ...
    def evict(self, pinned: Container[Key] = ()) -> Key: ...
    def remove(self, key: Key) -> None: ...
    def resize(self, capacity: int) -> None: ...


class LRU:
    name = "lru"

    def __init__(self, capacity: int):
        self._order: OrderedDict[Key, None] = OrderedDict()

    def __contains__(self, key: Key) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def hit(self, key: Key) -> None:
        self._order.move_to_end(key)

    def insert(self, key: Key) -> None:
        self._order[key] = None

    def evict(self, pinned: Container[Key] = ()) -> Key:
        victim = next(k for k in self._order if k not in pinned)
        del self._order[victim]
        return victim

    def remove(self, key: Key) -> None:
        del self._order[key]

    def resize(self, capacity: int) -> None:
        pass


class LFUAging:
    """Least frequently used; all counts halve every `capacity` accesses so old popularity fades.
    Ties go to the least recently used. A heap with lazy invalidation keeps eviction O(log n)."""

    name = "lfu"

    def __init__(self, capacity: int):
        self._count: dict[Key, int] = {}
        self._stamp: dict[Key, int] = {}
        self._heap: list[tuple[int, int, Key]] = []
        self._tick = 0
        self._period = max(1, capacity)

    def __contains__(self, key: Key) -> bool:
        return key in self._count

    def __len__(self) -> int:
        return len(self._count)

    def _touch(self, key: Key, count: int) -> None:
        self._tick += 1
        self._count[key], self._stamp[key] = count, self._tick
        heapq.heappush(self._heap, (count, self._tick, key))
        if self._tick % self._period == 0:
            self._age()

    def _age(self) -> None:
        for k in self._count:
            self._count[k] //= 2
        self._heap = [(c, self._stamp[k], k) for k, c in self._count.items()]
        heapq.heapify(self._heap)

    def hit(self, key: Key) -> None:
        self._touch(key, self._count[key] + 1)

    def insert(self, key: Key) -> None:
        self._touch(key, 1)

    def evict(self, pinned: Container[Key] = ()) -> Key:
        skipped = []
        try:
            while True:
                count, stamp, key = heapq.heappop(self._heap)
                if self._count.get(key) != count or self._stamp[key] != stamp:
                    continue  # stale entry
                if key in pinned:
                    skipped.append((count, stamp, key))
                    continue
                del self._count[key], self._stamp[key]
                return key
        finally:
            for entry in skipped:
                heapq.heappush(self._heap, entry)

    def remove(self, key: Key) -> None:
        del self._count[key], self._stamp[key]  # its heap entries become stale

    def resize(self, capacity: int) -> None:
        self._period = max(1, capacity)


class S3FIFO:
    """S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO (10 %), a main FIFO with 2-bit
    frequency and reinsertion, and a ghost FIFO of recently evicted keys that admits straight to main."""

    name = "s3fifo"
    SMALL_FRACTION = 0.1

    def __init__(self, capacity: int):
        self._small: deque[Key] = deque()
        self._main: deque[Key] = deque()
        self._ghost: OrderedDict[Key, None] = OrderedDict()
        self._freq: dict[Key, int] = {}
        self._where: dict[Key, str] = {}
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._small_target = max(1, int(self._capacity * self.SMALL_FRACTION))

    def __contains__(self, key: Key) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def hit(self, key: Key) -> None:
        self._freq[key] = min(3, self._freq[key] + 1)

    def insert(self, key: Key) -> None:
        self._freq[key] = 0
        if key in self._ghost:
            del self._ghost[key]
            self._main.append(key)
            self._where[key] = "main"
        else:
            self._small.append(key)
            self._where[key] = "small"

    def evict(self, pinned: Container[Key] = ()) -> Key:
        # A queue whose every key is pinned (rotated a full lap in a row) gives way to the other.
        # Every step that is not a rotation promotes (a small key, once), ages (a main key, at most
        # 3 times) or evicts, so with n keys there are at most 4n + 1 of them, and at most n
        # rotations between two: the bound below ends the loop only when every key is pinned.
        # (8n + 8 steps was too few: pinned keys in small are rotated again after each aging in
        # main, which refused a prefill with "every entry is pinned" while main had victims.)
        if all(key in pinned for key in self._where):
            raise RuntimeError("could not evict from S3-FIFO: every entry is pinned")
        n = len(self._where)
        rotated = {"small": 0, "main": 0}
        for _ in range((4 * n + 1) * (n + 1)):
            use_small = len(self._small) >= self._small_target or not self._main
            if use_small and (not self._small or rotated["small"] >= len(self._small)):
                use_small = False
            elif not use_small and rotated["main"] >= len(self._main):
                use_small = True
            name, queue = ("small", self._small) if use_small else ("main", self._main)
            key = queue[0]
            if key in pinned:
                queue.rotate(-1)
                rotated[name] += 1
                continue
            rotated = {"small": 0, "main": 0}
            victim = self._evict_small() if use_small else self._evict_main()
            if victim is not None:
                return victim
        raise RuntimeError("could not evict from S3-FIFO: every entry is pinned")

    def _evict_small(self) -> Key | None:
        key = self._small.popleft()
        if self._freq[key] > 0:  # reused while on probation: promote
            self._main.append(key)
            self._where[key], self._freq[key] = "main", 0
            return None
        self._drop(key)
        self._ghost[key] = None
        while len(self._ghost) > self._capacity:
            self._ghost.popitem(last=False)
        return key

    def _evict_main(self) -> Key | None:
        key = self._main.popleft()
        if self._freq[key] > 0:
            self._freq[key] -= 1
            self._main.append(key)
            return None
        self._drop(key)
        return key

    def remove(self, key: Key) -> None:
        (self._small if self._where[key] == "small" else self._main).remove(key)
        self._drop(key)

    def _drop(self, key: Key) -> None:
        del self._where[key], self._freq[key]


POLICIES: dict[str, Callable[[int], Policy]] = {"lru": LRU, "lfu": LFUAging, "s3fifo": S3FIFO}
DEFAULT_POLICY = "s3fifo"  # docs/performance.md: LRU and LFU loop to 0 hits when the cache is small


def make_policy(name: str, capacity: int) -> Policy:
    from sparkd.engine.errors import EngineError
    try:
        return POLICIES[name](capacity)
    except KeyError:
        raise EngineError(f"could not use cache policy {name!r}: choose one of {', '.join(POLICIES)}") from None
