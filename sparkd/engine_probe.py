"""What sparkctl status shows about an embedded engine: its /health and decode speed from its
/metrics, over HTTP only (the supervisor never imports the engine)."""

from __future__ import annotations

from typing import Any

import httpx

# status must stay quick even when an engine hangs: one short try per endpoint.
PROBE_TIMEOUT_SECONDS = 1.0
_DECODE_RATE = "sparkd_engine_decode_tokens_per_second"
_GENERATED = "sparkd_engine_generated_tokens_total"
# What sparkctl top shows beside decode speed; the cache families exist only with expert streaming.
_QUEUED = "sparkd_engine_requests_queued"
_RETENTION = "sparkd_engine_expert_cache_retention_ratio"
_DISK_RATE = "sparkd_engine_expert_read_bandwidth_bytes_per_second"


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
    "generated_tokens", "requests_queued", "cache_retention", "disk_read_bytes_per_second"}; a
    figure the engine does not report is None; never raises."""
    url = _base_url(listen)
    out: dict[str, Any] = {"url": url, "health": "unreachable", "progress": None, "error": None,
                           "decode_tok_s": None, "generated_tokens": None, "requests_queued": None,
                           "cache_retention": None, "disk_read_bytes_per_second": None}
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
            queued = _sample(text, _QUEUED)
            out.update(decode_tok_s=_sample(text, _DECODE_RATE), generated_tokens=_sample(text, _GENERATED),
                       requests_queued=None if queued is None else int(queued),
                       cache_retention=_sample(text, _RETENTION), disk_read_bytes_per_second=_sample(text, _DISK_RATE))
        except httpx.HTTPError as exc:
            out["error"] = f"could not read {url}/metrics: {exc or type(exc).__name__}"
    return out
