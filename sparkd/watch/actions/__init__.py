"""Watcher actions, registered by name. Each takes the target service (None: system-wide) and
honours dry_run by returning "would have ..." without doing anything."""

from .base import Action, ActionContext
from .evict_competitors import EvictCompetitors
from .refuse_starts import RefuseStarts
from .shrink_cache import ShrinkCache
from .stop_service import StopService
from .warn import Warn

ACTIONS: dict[str, type[Action]] = {
    "warn": Warn, "shrink_cache": ShrinkCache, "stop": StopService,
    "refuse_starts": RefuseStarts, "evict_competitors": EvictCompetitors,
}

__all__ = ["ACTIONS", "Action", "ActionContext"]
