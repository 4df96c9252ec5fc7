"""Capacity planning for a farm of boxes, as in the seed study (section 7.1, Tables 8–9).

The model, with every premise explicit (all from the study):
- a request occupies one inference slot for its whole response: latency = tokens / tok/s;
- the day's work is users × requests × latency slot-seconds, all within the working hours;
- a box offers hours × 3600 × utilization × slots slot-seconds a day (utilization below 100 %:
  at 100 % the queue grows without bound; the slack absorbs bursts of arrivals);
- boxes = ceil(work / capacity); power, investment and storage scale with the box count (every
  box holds its own copy of the checkpoint).
Arithmetic is exact (Fractions); only the display rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

SECONDS_PER_HOUR = 3600
TIB = 1 << 40


@dataclass(frozen=True)
class Profile:
    name: str
    requests_per_user_per_day: int
    tokens_per_response: int


@dataclass(frozen=True)
class Serving:
    """How one box serves a model: decode speed of one slot and how many slots run at once."""

    tokens_per_second: Fraction
    slots_per_box: int = 1
    checkpoint_bytes: int | None = None


@dataclass(frozen=True)
class PlanInputs:
    users: int
    profiles: tuple[Profile, ...]
    serving: Serving
    working_hours: Fraction = Fraction(8)
    utilization: Fraction = Fraction(7, 10)
    watts_per_box: Fraction | None = None
    price_per_box: Fraction | None = None
    currency: str = "USD"
    box_memory_bytes: int | None = None
    fits_in_one_box: Serving | None = None  # the alternative: a model that fits in one box's memory


@dataclass(frozen=True)
class ProfilePlan:
    profile: Profile
    latency_seconds: Fraction
    slot_seconds_per_day: Fraction
    boxes: int
    power_watts: Fraction | None
    investment: Fraction | None
    storage_bytes: int | None

    def to_dict(self, currency: str) -> dict:
        return {
            "profile": self.profile.name,
            "requests_per_user_per_day": self.profile.requests_per_user_per_day,
            "tokens_per_response": self.profile.tokens_per_response,
            "latency_seconds": float(self.latency_seconds),
            "latency_minutes": round(float(self.latency_seconds) / 60, 1),
            "slot_seconds_per_day": float(self.slot_seconds_per_day),
            "boxes": self.boxes,
            "power_watts": None if self.power_watts is None else float(self.power_watts),
            "power_kilowatts": None if self.power_watts is None else round(float(self.power_watts) / 1000, 1),
            "investment": None if self.investment is None else float(self.investment),
            "currency": currency,
            "storage_bytes": self.storage_bytes,
            "storage_tebibytes": None if self.storage_bytes is None else round(self.storage_bytes / TIB, 1),
        }


def box_capacity_slot_seconds(inputs: PlanInputs, serving: Serving) -> Fraction:
    """Slot-seconds one box can give a day at the target utilization."""
    return inputs.working_hours * SECONDS_PER_HOUR * inputs.utilization * serving.slots_per_box


def plan_profile(inputs: PlanInputs, profile: Profile, serving: Serving) -> ProfilePlan:
    latency_seconds = Fraction(profile.tokens_per_response) / serving.tokens_per_second
    work = inputs.users * profile.requests_per_user_per_day * latency_seconds
    boxes = math.ceil(work / box_capacity_slot_seconds(inputs, serving))
    return ProfilePlan(
        profile=profile,
        latency_seconds=latency_seconds,
        slot_seconds_per_day=work,
        boxes=boxes,
        power_watts=None if inputs.watts_per_box is None else boxes * inputs.watts_per_box,
        investment=None if inputs.price_per_box is None else boxes * inputs.price_per_box,
        storage_bytes=None if serving.checkpoint_bytes is None else boxes * serving.checkpoint_bytes,
    )


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    profiles: tuple[ProfilePlan, ...]
    alternative: tuple[ProfilePlan, ...] | None  # set only when a one-box model is the better buy
    notes: tuple[str, ...]


def _oversubscription_notes(inputs: PlanInputs) -> list[str]:
    checkpoint, memory = inputs.serving.checkpoint_bytes, inputs.box_memory_bytes
    if checkpoint is None or memory is None or checkpoint <= memory:
        return []
    factor = checkpoint / memory
    return [
        f"the checkpoint is {factor:.1f}× one box's memory: every box streams experts from disk, and adding boxes "
        f"replicates that bottleneck rather than removing it; holding it in memory would take "
        f"{math.ceil(factor)} boxes' memory pooled, which needs an interconnect that joins that many boxes "
        "(check with the vendor before buying)",
    ]


def _alternative(inputs: PlanInputs, plans: list[ProfilePlan]) -> tuple[tuple[ProfilePlan, ...] | None, list[str]]:
    fit = inputs.fits_in_one_box
    if fit is None:
        if inputs.serving.checkpoint_bytes and inputs.box_memory_bytes and inputs.serving.checkpoint_bytes > inputs.box_memory_bytes:
            return None, ["to compare a model that fits in one box, give its speed with --fit-tok-s (and --fit-slots)"]
        return None, []
    alt = [plan_profile(inputs, p.profile, fit) for p in plans]
    if all(a.boxes >= p.boxes for a, p in zip(alt, plans)):
        return None, ["a model that fits in one box (--fit-tok-s/--fit-slots) would not need fewer boxes here"]
    saved = [f"{p.profile.name} {p.boxes} → {a.boxes}" for a, p in zip(alt, plans)]
    return tuple(alt), [f"a model that fits in one box is the better buy: boxes {', '.join(saved)}"]


def make_plan(inputs: PlanInputs) -> Plan:
    plans = [plan_profile(inputs, p, inputs.serving) for p in inputs.profiles]
    latencies = ", ".join(f"{p.profile.name} {format_duration(p.latency_seconds)}" for p in plans)
    notes = [
        "more boxes raise throughput (requests served per day), not the latency of one request: "
        f"each response still takes {latencies} on one box",
    ]
    notes += _oversubscription_notes(inputs)
    alternative, alt_notes = _alternative(inputs, plans)
    return Plan(inputs, tuple(plans), alternative, tuple(notes + alt_notes))


def format_duration(seconds: Fraction) -> str:
    value = float(seconds)
    if value >= SECONDS_PER_HOUR:
        return f"{value / SECONDS_PER_HOUR:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def _serving_dict(serving: Serving) -> dict:
    return {"tokens_per_second": float(serving.tokens_per_second), "slots_per_box": serving.slots_per_box,
            "checkpoint_bytes": serving.checkpoint_bytes}


def plan_dict(plan: Plan) -> dict:
    i = plan.inputs
    return {
        "inputs": {
            "users": i.users,
            "serving": _serving_dict(i.serving),
            "working_hours": float(i.working_hours),
            "utilization": float(i.utilization),
            "watts_per_box": None if i.watts_per_box is None else float(i.watts_per_box),
            "price_per_box": None if i.price_per_box is None else float(i.price_per_box),
            "currency": i.currency,
            "box_memory_bytes": i.box_memory_bytes,
            "fits_in_one_box": None if i.fits_in_one_box is None else _serving_dict(i.fits_in_one_box),
        },
        "box_capacity_slot_seconds_per_day": float(box_capacity_slot_seconds(i, i.serving)),
        "profiles": [p.to_dict(i.currency) for p in plan.profiles],
        "alternative": None if plan.alternative is None else [p.to_dict(i.currency) for p in plan.alternative],
        "notes": list(plan.notes),
    }
