"""The device side of the memory plan: what kind of GPU the trunk goes to, whether streamed experts
get a VRAM expert cache, and how large it is.

- cpu: everything is host memory.
- integrated (GB10; torch reports the device as integrated): device memory is the host's, so the
  trunk counts in the host budget and experts are read zero-copy from the arena (no VRAM cache).
- discrete (H200): trunk, KV cache and workspace live in VRAM and do not count in the host budget;
  the CUDA runtime's host memory does. With `--unified off` (the default `auto` here) a VRAM expert
  cache takes --vram-budget, by default the free device memory after trunk, KV cache and
  workspace minus a margin.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.engine.errors import EngineError

# Device memory no term models: the CUDA caching allocator's rounding and fragmentation, Triton's
# compiled modules, cuBLAS workspaces, prefill's transient tensors beyond the planned batch.
VRAM_MARGIN_FRACTION = 0.05
VRAM_MARGIN_MIN_BYTES = 1 << 30
UNIFIED_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # "cpu", "cuda:0"
    kind: str  # "cpu", "discrete" or "integrated"
    total_bytes: int = 0
    free_bytes: int = 0  # when probed: before the trunk is loaded

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"


CPU = DeviceInfo("cpu", "cpu")


def probe_device(device: str) -> DeviceInfo:
    """The device's kind and free memory (this sets up CUDA, whose host memory the plan then sees)."""
    if device == "cpu":
        return CPU
    import torch

    try:
        dev = torch.empty(0, device=device).device
        if dev.type != "cuda":
            return DeviceInfo(str(dev), "integrated")  # no VRAM of its own that torch reports
        _set_up(dev)
        free, total = torch.cuda.mem_get_info(dev)
        integrated = bool(getattr(torch.cuda.get_device_properties(dev), "is_integrated", False))
    except (RuntimeError, AssertionError) as exc:
        raise EngineError(f"could not use device {device!r}: {exc}") from exc
    return DeviceInfo(str(dev), "integrated" if integrated else "discrete", total, free)


def _set_up(dev) -> None:
    """Load what the engine will load anyway (context, cuBLAS, Triton), so the host memory it
    takes shows up in this process's RSS before the plan is made, not after."""
    import torch

    a = torch.ones(16, 16, device=dev)
    (a @ a).sum().item()
    try:
        import triton  # noqa: F401  (LLVM and the driver stubs: tens of MiB)
    except ImportError:
        pass


def wants_vram_cache(device: DeviceInfo, unified: str) -> bool:
    """--unified auto|on|off on this device: True where experts get a VRAM cache."""
    if unified not in UNIFIED_CHOICES:
        raise EngineError(f"could not use --unified {unified!r}: choose one of {', '.join(UNIFIED_CHOICES)}")
    if device.kind == "cpu":
        return False
    if device.kind == "integrated":
        if unified == "off":
            raise EngineError(f"could not use --unified off on {device.name}: it is an integrated GPU whose "
                              "memory is the host's, so a VRAM expert cache would be a second copy of the "
                              "arena; use --unified auto or on")
        return False
    return unified != "on"


def vram_margin_bytes(device: DeviceInfo) -> int:
    return max(VRAM_MARGIN_MIN_BYTES, int(device.total_bytes * VRAM_MARGIN_FRACTION))


@dataclass(frozen=True)
class VramSplit:
    margin_bytes: int
    available_bytes: int  # free after trunk, KV cache, workspace and margin
    budget_bytes: int  # the VRAM expert cache's size (whole slots)
    source: str
    slots: int


def split_vram(device: DeviceInfo, use_cache: bool, device_fixed_bytes: int, slot_bytes: int,
               n_experts_total: int, explicit_bytes: int | None) -> VramSplit:
    """Size the VRAM expert cache; EngineError for a --vram-budget that cannot be honoured."""
    if not device.discrete:
        if explicit_bytes is not None:
            raise EngineError(f"could not use --vram-budget on {device.name}: it is a {device.kind} device; "
                              "a VRAM expert cache exists only on a discrete GPU")
        return VramSplit(0, 0, 0, f"none ({device.kind} device)", 0)
    margin = vram_margin_bytes(device)
    available = device.free_bytes - device_fixed_bytes - margin
    if available < 0:
        raise EngineError(
            f"could not fit the trunk, KV cache and workspace ({device_fixed_bytes} bytes) in {device.name}'s "
            f"{device.free_bytes} free bytes with a {margin}-byte margin: lower --ctx or --batch-tokens")
    if not use_cache:
        if explicit_bytes is not None:
            raise EngineError("could not use --vram-budget with --unified on: zero-copy keeps no VRAM expert "
                              "cache (use --unified off or auto)")
        return VramSplit(margin, available, 0, "none (--unified on: zero-copy)", 0)
    if explicit_bytes is None:
        want, source = available, "free device memory after trunk, KV, workspace and margin"
    else:
        if explicit_bytes < slot_bytes:
            raise EngineError(f"could not use --vram-budget {explicit_bytes}: it is smaller than one expert "
                              f"slot ({slot_bytes} bytes); give at least that, or --unified on for no VRAM cache")
        if explicit_bytes > available:
            raise EngineError(
                f"could not use --vram-budget {explicit_bytes}: {device.name} has {device.free_bytes} bytes "
                f"free, {available} after trunk, KV cache and workspace ({device_fixed_bytes}) and a "
                f"{margin}-byte margin; give at most {available}")
        want, source = explicit_bytes, "--vram-budget"
    slots = min(n_experts_total, max(0, want) // slot_bytes) if slot_bytes else 0
    return VramSplit(margin, available, slots * slot_bytes, source, slots)
