"""evict_competitors: run the start guard's competitor eviction again (guards.competitors), for
a competitor that came back while the service runs."""

from .base import Action


class EvictCompetitors(Action):
    name = "evict_competitors"

    async def apply(self, service, rule, reason, dry_run):
        if dry_run:
            return "would have evicted the competitors in guards.competitors"
        checks = await self.ctx.evict_competitors()
        if not checks:
            return "no competitors in the policy"
        return "; ".join(f"{c.name}: {c.status}: {c.message}" for c in checks)
