"""What the start guards found: one Check per guard, combined into a PreflightReport.

A refused check names its culprits (pid, name, unit, MiB) and the policy key that decided, so an
operator knows both what is in the way and which line of the policy to change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..errors import GuardRefusal

Status = Literal["ok", "refused", "skipped", "warning"]
_MARKS = {"ok": "ok", "refused": "REFUSED", "skipped": "skipped", "warning": "WARNING"}


@dataclass(frozen=True)
class Culprit:
    pid: int | None
    name: str | None
    unit: str | None = None
    mib: int | None = None
    detail: str = ""  # what happened to it or why it counts ("SIGTERM, exited", "ignored")

    def describe(self) -> str:
        parts = [f"pid {self.pid}" if self.pid is not None else None, self.name or "?",
                 f"unit {self.unit}" if self.unit else None,
                 f"{self.mib} MiB" if self.mib is not None else None]
        text = " ".join(p for p in parts if p)
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    culprits: tuple[Culprit, ...] = ()
    policy_key: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PreflightReport:
    service: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return any(c.status == "refused" for c in self.checks)

    def to_dict(self) -> dict:
        return {"service": self.service, "refused": self.refused, "checks": [c.to_dict() for c in self.checks]}

    def render(self) -> str:
        """Human form: one line per check, one indented line per culprit."""
        who = f"service {self.service}" if self.service else "all services"
        verdict = "REFUSED" if self.refused else "ok"
        lines = [f"preflight for {who}: {verdict}"]
        for check in self.checks:
            key = f"  [{check.policy_key}]" if check.policy_key and check.status != "ok" else ""
            lines.append(f"  {_MARKS[check.status]:<8} {check.name}: {check.message}{key}")
            lines.extend(f"             - {c.describe()}" for c in check.culprits)
        return "\n".join(lines)

    def refusal(self) -> GuardRefusal | None:
        """A GuardRefusal listing every culprit of every refused check, or None."""
        refused = [c for c in self.checks if c.status == "refused"]
        if not refused:
            return None
        culprits = [{**asdict(p), "check": c.name, "policy_key": c.policy_key} for c in refused for p in c.culprits]
        target = f"service {self.service}" if self.service else "services"
        reasons = "; ".join(f"{c.name}: {c.message} [{c.policy_key}]" for c in refused)
        return GuardRefusal(f"could not start {target}: refused by guards: {reasons}\n{self.render()}", culprits)

    def raise_if_refused(self) -> None:
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
