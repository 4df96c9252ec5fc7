"""shrink_cache: ask the service's embedded engine to shrink its expert cache (POST /admin/cache
{"budget": BYTES}), and to grow it back to what it had when the pressure clears.

The engine answers the POST with the budget it had before (previous_bytes), so the grow-back
restores the engine's own setting, not a guess, and a shrink is one request: under pressure the
engine shares its cgroup's stalls, and every round trip may wait on them.
"""

from __future__ import annotations

import asyncio

import httpx

from ...sizes import format_size
from .base import Action

# The engine answers from its event loop; a slow answer means it is itself stalled on memory.
# Under memory.high throttling the GPU box's engine took 4.5 s (docs/watchers.md, run 3): 5 s was
# too tight for the very case the shrink is for. Each rule has its own action lock, so a slow
# shrink delays no stop; only this rule's grow-back waits behind it.
HTTP_TIMEOUT_SECONDS = 20.0


class CacheClient:
    def __init__(self, listen: str, timeout_seconds: float = HTTP_TIMEOUT_SECONDS,
                 transport: httpx.AsyncBaseTransport | None = None, api_key: str | None = None):
        self.url = f"http://{listen}/admin/cache"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_seconds = timeout_seconds
        self._transport = transport

    async def _call(self, method: str, body: dict | None = None) -> dict:
        try:
            async with httpx.AsyncClient(timeout=self._timeout_seconds, transport=self._transport) as client:
                response = await client.request(method, self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:  # a timeout's text is empty: its class names it
            raise RuntimeError(f"could not {method} {self.url}: {type(exc).__name__} {exc}".rstrip()) from exc
        if response.is_error:
            hint = " (check the service's engine.embedded.api_key_file)" if response.status_code == 401 else ""
            raise RuntimeError(f"could not {method} {self.url}: HTTP {response.status_code} "
                               f"{_error_message(response)}{hint}")
        try:
            return response.json()
        except ValueError as exc:
            raise RuntimeError(f"could not {method} {self.url}: the answer is not JSON ({exc})") from exc

    async def set_budget(self, budget_bytes: int) -> int | None:
        """Set the budget; returns the budget before, None from an engine that does not say it."""
        value = (await self._call("POST", {"budget": budget_bytes})).get("previous_bytes")
        return int(value) if isinstance(value, int) else None


def _error_message(response: httpx.Response) -> str:
    """The engine's own error text (OpenAI-style {"error": {"message": ...}}), else the reason."""
    try:
        error = response.json().get("error")
        return str(error.get("message")) if isinstance(error, dict) else response.reason_phrase
    except (ValueError, AttributeError):
        return response.reason_phrase


class ShrinkCache(Action):
    name = "shrink_cache"

    def __init__(self, ctx, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(ctx)
        self._transport = transport
        # Several rules may shrink one engine (throttling rate, full stall, MemAvailable floor):
        # the budget before the first shrink is kept, and restored once the last of them clears.
        self._before: dict[str, int | None] = {}  # service -> budget before the first shrink
        self._holders: dict[str, set[str]] = {}  # service -> rules that hold its cache shrunk
        self._dry: set[tuple[str, str]] = set()  # (service, rule) dry-run shrinks
        # one request at a time per engine, so the budget before the first shrink is the one kept
        self._locks: dict[str, asyncio.Lock] = {}

    def _client(self, service: str) -> CacheClient | None:
        """None without an embedded engine; RuntimeError when its API key file cannot be read."""
        listen = self.ctx.engine_listen(service)
        if not listen:
            return None
        return CacheClient(listen, transport=self._transport, api_key=self.ctx.engine_api_key(service))

    async def apply(self, service, rule, reason, dry_run):
        try:
            client = self._client(service) if service else None
        except RuntimeError as exc:
            return f"failed: {exc}"
        if client is None:
            return f"skipped: {service or 'system-wide rule'} has no embedded engine with /admin/cache"
        target = format_size(rule.budget)
        if dry_run:
            self._dry.add((service, rule.name))
            return f"would have asked {client.url} to shrink the expert cache to {target}"
        async with self._locks.setdefault(service, asyncio.Lock()):
            try:
                before = await client.set_budget(rule.budget)
            except RuntimeError as exc:
                return f"failed: {exc}"
            holders = self._holders.setdefault(service, set())
            if not holders:
                self._before[service] = before
            holders.add(rule.name)
        was = format_size(before) if before is not None else "unknown"
        return f"expert cache shrunk to {target} (was {was})"

    async def revert(self, service, rule, dry_run):
        if (service, rule.name) in self._dry:
            self._dry.discard((service, rule.name))
            return f"would have asked the engine of {service} to grow the expert cache back to its budget before the shrink"
        async with self._locks.setdefault(service, asyncio.Lock()):
            return await self._grow_back(service, rule)

    async def _grow_back(self, service, rule) -> str | None:
        holders = self._holders.get(service, set())
        if rule.name not in holders:
            return None
        holders.discard(rule.name)
        if holders:
            return f"not grown back yet: still shrunk for rule(s) {', '.join(sorted(holders))}"
        del self._holders[service]
        before = self._before.pop(service)
        try:
            client = self._client(service)
        except RuntimeError as exc:
            return f"failed to grow back: {exc}"
        if before is None:
            return "not grown back: the engine did not say its budget before the shrink"
        try:
            await client.set_budget(before)
        except RuntimeError as exc:
            return f"failed to grow back: {exc}"
        return f"expert cache grown back to {format_size(before)}"
