"""refuse_starts: later starts of the service (every start, for a system-wide rule) are refused
until an operator runs `sparkctl clear`."""

from .base import Action


class RefuseStarts(Action):
    name = "refuse_starts"

    async def apply(self, service, rule, reason, dry_run):
        scope = f"starts of {service}" if service else "every start"
        if dry_run:
            return f"would have refused {scope} until `sparkctl clear`"
        self.ctx.hold_starts(service, rule.name, reason)
        return f"refusing {scope} until `sparkctl clear`"
