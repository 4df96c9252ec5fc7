"""What sparkctl status shows about an embedded engine: its /health and decode speed from its
/metrics, over HTTP only (the supervisor never imports the engine)."""

from __future__ import annotations

from typing import Any

import httpx

# status must stay quick even when an engine hangs: one short try per endpoint.
PROBE_TIMEOUT_SECONDS = 1.0
_DECODE_RATE = "sparkd_engine_decode_tokens_per_second"
_GENERATED = "sparkd_engine_generated_tokens_total"


def _base_url(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # a wildcard bind is reachable on loopback
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


async def probe_engine(listen: str, timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> dict[str, Any]:
    """{"url", "health": loading|ready|error|unreachable, "progress", "error", "decode_tok_s",
    "generated_tokens"}; never raises."""
    url = _base_url(listen)
    out: dict[str, Any] = {"url": url, "health": "unreachable", "progress": None, "error": None,
                           "decode_tok_s": None, "generated_tokens": None}
    async with httpx.AsyncClient(timeout=timeout_seconds) as client:
        try:
            body = (await client.get(url + "/health")).json()
            out.update(health=str(body.get("status", "unknown")), progress=body.get("progress"),
                       error=body.get("error"))
        except (httpx.HTTPError, ValueError) as exc:
            out["error"] = f"could not read {url}/health: {exc or type(exc).__name__}"
            return out
        try:
            text = (await client.get(url + "/metrics")).text
            out.update(decode_tok_s=_sample(text, _DECODE_RATE), generated_tokens=_sample(text, _GENERATED))
        except httpx.HTTPError as exc:
            out["error"] = f"could not read {url}/metrics: {exc or type(exc).__name__}"
    return out
