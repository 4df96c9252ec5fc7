"""NVML Xid events (nvmlEventTypeXidCriticalError), where NVML exists.

The blocking nvmlEventSetWait runs in a thread with a short timeout so the detector can stop.
Without a driver or GPU the detector does not run and says why ("skipped: ..."); that is normal
on most machines. The binding is a parameter (pynvml by default) like sparkd.system.gpu's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .nvrm import NvrmFinding, xid_class

# nvmlEventSetWait's timeout: bounds how long stopping the detector takes.
WAIT_MS = 500


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"NVML unavailable: the nvidia-ml-py package is not installed ({exc})") from exc
    return pynvml


class NvmlUnavailable(Exception):
    """NVML or its event API is missing here (no driver, no GPU, or not supported)."""


class NvmlXidDetector:
    name = "nvml_xid"

    def __init__(self, on_finding: Callable[[NvrmFinding], None], *, nvml: Any = None):
        self._on_finding = on_finding
        self._nvml = nvml
        self.mode = "starting"

    def _open(self, nvml: Any) -> Any:
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        try:
            event_set = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), nvml.nvmlEventTypeXidCriticalError,
                                              event_set)
            return event_set
        except Exception as exc:
            nvml.nvmlShutdown()
            raise NvmlUnavailable(f"could not register NVML Xid events: {exc}") from exc

    def _loop(self, nvml: Any, event_set: Any, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        # Freed here, by the thread that waits on it, never while a wait is in progress.
        try:
            while not stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(event_set, WAIT_MS)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                        continue
                    raise
                xid = int(data.eventData)
                finding = NvrmFinding("xid", f"NVML Xid {xid}", xid, xid_class(xid))
                loop.call_soon_threadsafe(self._on_finding, finding)
        finally:
            nvml.nvmlEventSetFree(event_set)
            nvml.nvmlShutdown()

    async def run(self) -> None:
        nvml = self._nvml if self._nvml is not None else await asyncio.to_thread(_load_pynvml)
        event_set = await asyncio.to_thread(self._open, nvml)
        self.mode = "events"
        stop = threading.Event()
        try:
            await asyncio.to_thread(self._loop, nvml, event_set, stop, asyncio.get_running_loop())
        finally:
            stop.set()
