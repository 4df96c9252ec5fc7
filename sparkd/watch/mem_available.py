"""System-wide available-memory floor: MemAvailable from /proc/meminfo, sampled every interval.

Needed beside the cgroup detectors because CUDA memory on GB10 may not be charged to any cgroup:
the service can look fine while the machine runs out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..system.meminfo import DEFAULT_MEMINFO_PATH, read_meminfo


@dataclass(frozen=True)
class AvailableSample:
    time: float  # monotonic
    available_bytes: int
    total_bytes: int


class MemAvailableDetector:
    name = "mem_available"
    mode = "poll"

    def __init__(self, on_sample: Callable[[AvailableSample], None], *, meminfo_path: Path = DEFAULT_MEMINFO_PATH,
                 interval_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._on_sample = on_sample
        self._meminfo_path = Path(meminfo_path)
        self._interval_seconds = interval_seconds
        self._clock = clock

    def read(self) -> AvailableSample:
        mem = read_meminfo(self._meminfo_path)
        return AvailableSample(self._clock(), mem.available_bytes, mem.total_bytes)

    async def run(self) -> None:
        while True:
            self._on_sample(self.read())
            await asyncio.sleep(self._interval_seconds)
