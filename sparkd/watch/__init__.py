"""Watchers (oomd's model): detectors -> rules -> actions, every decision an event.

Detectors: psi.py (memory.pressure triggers), memory_events.py, kmsg.py + nvrm.py (kernel log),
nvml_xid.py, mem_available.py. Rules: rules.py (pure). Actions: actions/. Events: events.py.
manager.py ties them together; wiring.py connects them to the supervisor.
"""

from .events import EventLog
from .holds import Holds
from .manager import WatchManager
from .wiring import SupervisorControl

__all__ = ["EventLog", "Holds", "SupervisorControl", "WatchManager"]
