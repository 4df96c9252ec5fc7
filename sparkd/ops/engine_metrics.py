"""Read a running engine's Prometheus /metrics (the `sparkd_engine_` families of the API issue).

Decode speed is the engine's lifetime average: generated tokens over the seconds spent decoding
them, so it does not depend on when it is sampled. The names below are the contract with
`sparkd-engine serve`; a missing family is an error that names it.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..errors import SparkdError

GENERATED_TOKENS = "sparkd_engine_generated_tokens_total"
DECODE_SECONDS = "sparkd_engine_decode_seconds_total"
# An engine answers /metrics at once; longer means it is wedged or not an engine.
TIMEOUT_SECONDS = 5.0


class EngineMetricsError(SparkdError):
    """An engine's /metrics could not be read or lacks what was asked for."""


def metrics_url(target: str) -> str:
    """'127.0.0.1:7777' or 'http://host:7777' or a full '.../metrics' URL -> the metrics URL."""
    url = target if "://" in target else f"http://{target}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def fetch_samples(url: str, *, timeout_seconds: float = TIMEOUT_SECONDS) -> dict[str, float]:
    """Sample name -> value summed over labels, from the exposition at url."""
    try:
        response = httpx.get(url, timeout=timeout_seconds)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise EngineMetricsError(f"could not read engine metrics from {url}: HTTP {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise EngineMetricsError(
            f"could not read engine metrics from {url}: {exc or type(exc).__name__}; is the engine running and listening there?"
        ) from exc
    try:
        families = list(text_string_to_metric_families(response.text))
    except ValueError as exc:
        raise EngineMetricsError(f"could not parse engine metrics from {url}: {exc}") from exc
    totals: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def decode_tokens_per_second(samples: dict[str, float], *, source: str) -> float:
    """Lifetime decode speed from generated tokens and decode seconds."""
    missing = [n for n in (GENERATED_TOKENS, DECODE_SECONDS) if n not in samples]
    if missing:
        raise EngineMetricsError(f"could not find {', '.join(missing)} in {source}: is this a sparkd engine's /metrics?")
    if samples[GENERATED_TOKENS] <= 0 or samples[DECODE_SECONDS] <= 0:
        raise EngineMetricsError(
            f"could not measure decode speed from {source}: the engine has not generated any tokens yet; "
            "send it a request (or run sparkctl bench) first"
        )
    return samples[GENERATED_TOKENS] / samples[DECODE_SECONDS]
