"""stop: a clean stop through the supervisor (SIGTERM, stop_timeout, then kill), like systemd's
OOMPolicy=stop; never restarted (Restart=no)."""

from .base import Action


class StopService(Action):
    name = "stop"

    async def apply(self, service, rule, reason, dry_run):
        if service is None:
            return "no running service to stop"
        if dry_run:
            return f"would have stopped {service}"
        return await self.ctx.stop_service(service)
