"""Headroom guard: the service's memory_max plus the system reserve must fit in MemAvailable.

On unified memory (GB10) the GPU driver allocates from the same pool outside the service's cgroup
(CUDA allocations may not be charged to it), so guards.reserve is kept free for the driver and
the rest of the system. A service being restarted gives back what it holds now, so that counts
as available.
"""

from __future__ import annotations

from ..policy import GuardsPolicy, ServicePolicy
from ..sizes import format_size
from ..system.meminfo import MemInfo
from .report import Check


def check_headroom(service_name: str, service: ServicePolicy, guards: GuardsPolicy, mem: MemInfo,
                   freed_by_restart_bytes: int = 0) -> Check:
    need = service.memory_max + guards.reserve
    have = mem.available_bytes + freed_by_restart_bytes
    freed = f" + {format_size(freed_by_restart_bytes)} freed by the restart" if freed_by_restart_bytes else ""
    sums = (f"services.{service_name}.memory_max {format_size(service.memory_max)} ({service.memory_max} B)"
            f" + guards.reserve {format_size(guards.reserve)} ({guards.reserve} B) = {format_size(need)}"
            f" vs MemAvailable {format_size(mem.available_bytes)} ({mem.available_bytes} B){freed}")
    name = f"headroom[{service_name}]"
    if need > have:
        short = need - have
        msg = (f"{sums}: {format_size(short)} short; lower services.{service_name}.memory_max or "
               f"guards.reserve, or free memory")
        return Check(name, "refused", msg, (), f"services.{service_name}.memory_max, guards.reserve")
    return Check(name, "ok", f"{sums}: fits, {format_size(have - need)} to spare")


def check_swap(service_name: str, service: ServicePolicy, mem: MemInfo) -> Check:
    """Swap is reported, not judged: services run with MemorySwapMax (swap_max, default 0)."""
    if mem.swap_total_bytes == 0:
        state = "no swap configured"
    else:
        state = (f"swap {format_size(mem.swap_total_bytes)} total, "
                 f"{format_size(mem.swap_used_bytes)} used")
    return Check(f"swap[{service_name}]", "ok",
                 f"{state}; services.{service_name}.swap_max = {format_size(service.swap_max)}")
