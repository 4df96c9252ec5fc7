"""What an action is and what it may touch (the supervisor, through a narrow protocol)."""

from __future__ import annotations

from typing import Any, Protocol


class ActionContext(Protocol):
    async def stop_service(self, name: str) -> str: ...

    def hold_starts(self, name: str | None, rule: str, reason: str) -> None: ...

    def engine_listen(self, name: str) -> str | None:
        """host:port of the service's embedded engine; None for a `command` engine."""

    def engine_api_key(self, name: str) -> str | None:
        """The embedded engine's API key (read from its api_key_file now, so a rotated key is
        used); None when it has none. RuntimeError when the file cannot be read."""

    async def evict_competitors(self) -> list[Any]: ...


class Action:
    name = ""

    def __init__(self, ctx: ActionContext):
        self.ctx = ctx

    async def apply(self, service: str | None, rule: Any, reason: str, dry_run: bool) -> str:
        """Do it (or say what would be done); the result text goes into the event."""
        raise NotImplementedError

    async def revert(self, service: str | None, rule: Any, dry_run: bool) -> str | None:
        """Undo when the condition clears; None when there is nothing to undo."""
        return None
