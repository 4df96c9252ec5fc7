"""warn: the event itself is the action (logged at warning level for the journal)."""

from .base import Action


class Warn(Action):
    name = "warn"

    async def apply(self, service, rule, reason, dry_run):
        return f"would have warned: {reason}" if dry_run else f"warned: {reason}"
