"""Start guards: run before every start and by `sparkctl preflight`."""

from .competitors import UnitManager
from .gpu import UnitLookup
from .preflight import GuardContext, preflight
from .report import Check, Culprit, PreflightReport

__all__ = ["Check", "Culprit", "GuardContext", "PreflightReport", "UnitLookup", "UnitManager", "preflight"]
