"""Prometheus metrics of one engine (`sparkd_engine_` prefix, base units), in a registry of
its own. Request counters are updated by the server; cache and memory-plan families are built
fresh on each scrape from the engine (client_python's custom-collector pattern).
The list with meanings is docs/metrics-engine.md; the Grafana dashboard uses these names.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

P = "sparkd_engine_"
# Latency buckets from 5 ms (a resident tiny model) to 2 min (a streamed 600 GB model cold start).
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class EngineMetrics:
    def __init__(self, cache_stats: Callable[[], dict | None], memory_plan: Callable[[], dict],
                 graph_stats: Callable[[], dict | None] = lambda: None,
                 store_stats: Callable[[], dict | None] = lambda: None,
                 decode_graph_stats: Callable[[], dict | None] = lambda: None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter(f"{P}prompt_tokens", "Prompt tokens computed (prefill)", registry=r)
        self.prompt_cached_tokens = Counter(f"{P}prompt_cached_tokens",
                                            "Prompt tokens reused from the prompt cache (not computed)", registry=r)
        self.generated_tokens = Counter(f"{P}generated_tokens", "Tokens generated", registry=r)
        self.prompt_seconds = Counter(f"{P}prompt_seconds", "Time spent on prompt processing", registry=r)
        self.decode_seconds = Counter(f"{P}decode_seconds", "Time spent decoding", registry=r)
        self.ttft = Histogram(f"{P}time_to_first_token_seconds", "Request arrival to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{P}inter_token_latency_seconds", "Time between generated tokens",
                             buckets=_ITL_BUCKETS, registry=r)
        self.requests = Counter(f"{P}requests", "Finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.running = Gauge(f"{P}requests_running", "Requests holding the decode slot", registry=r)
        self.queued = Gauge(f"{P}requests_queued", "Requests waiting for the decode slot", registry=r)
        self.rejected = Counter(f"{P}requests_rejected", "Requests refused because the queue was full",
                                registry=r)
        self.decode_rate = Gauge(f"{P}decode_tokens_per_second", "Decode speed of the last finished request",
                                 registry=r)
        self.load_progress = Gauge(f"{P}load_progress_ratio", "Model load progress, 0 to 1", registry=r)
        self.ready = Gauge(f"{P}ready", "1 when the model is loaded and serving", registry=r)
        r.register(_CacheCollector(cache_stats, memory_plan, graph_stats, store_stats, decode_graph_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CacheCollector:
    def __init__(self, cache_stats: Callable[[], dict | None], memory_plan: Callable[[], dict],
                 graph_stats: Callable[[], dict | None], store_stats: Callable[[], dict | None],
                 decode_graph_stats: Callable[[], dict | None]):
        self._stats, self._plan, self._graphs, self._store = cache_stats, memory_plan, graph_stats, store_stats
        self._decode = decode_graph_stats

    def describe(self) -> list:
        return []  # families depend on the engine's state; describing none keeps registration lazy

    def collect(self) -> Any:
        plan = GaugeMetricFamily(f"{P}memory_plan_bytes", "Memory plan terms (budget, runtime, slack, trunk, "
                                 "kv, rope, workspace, prefetch, expert_cache; experts_resident when resident)",
                                 labels=["term"])
        for term, value in sorted(self._plan().items()):
            plan.add_metric([term], value)
        yield plan
        if (graphs := self._graphs()) is not None:  # prompts replay CUDA graphs (prompt_graphs.PromptForward)
            buckets = GaugeMetricFamily(f"{P}prompt_graphs", "Prompt length buckets by capture state "
                                        "(captured: replayed; failed: given up, run eagerly)", labels=["state"])
            for state in ("captured", "failed"):
                buckets.add_metric([state], graphs[state])
            yield buckets
            yield GaugeMetricFamily(f"{P}prompt_graph_pool_bytes", "Device memory the prompt graphs' captures added",
                                    value=graphs["pool_bytes"])
        if (decode := self._decode()) is not None:  # the decode step replays CUDA graphs (cuda_graphs.StaticDecode)
            for name, what, keys in (("decode_graphs", "Decode attention buckets", ("captured", "failed")),
                                     ("draw_graphs", "Device-sampler draws (bucket, path)", ("draws", "draws_failed"))):
                family = GaugeMetricFamily(f"{P}{name}", f"{what} by capture state (captured: replayed; failed: "
                                           "given up, run eagerly)", labels=["state"])
                for state, key in zip(("captured", "failed"), keys):
                    family.add_metric([state], decode[key])
                yield family
            yield GaugeMetricFamily(f"{P}decode_graph_pool_bytes", "Device memory the decode steps' and draws' graph "
                                    "captures added", value=decode["pool_bytes"])
        if (store := self._store()) is not None:  # the prompt store (prompt_store.py, --prompt-cache-mib)
            yield GaugeMetricFamily(f"{P}prompt_store_bytes", "Bytes of conversations' KV rows the prompt store holds",
                                    value=store["bytes"])
            yield GaugeMetricFamily(f"{P}prompt_store_entries", "Conversations the prompt store holds",
                                    value=store["entries"])
            for key, help_ in (("saves", "Conversations copied into the prompt store"),
                               ("restores", "Requests that continued a conversation from the prompt store"),
                               ("evictions", "Conversations evicted from the prompt store for its byte budget")):
                yield CounterMetricFamily(f"{P}prompt_store_{key}", help_, value=store[key])
        stats = self._stats()
        if stats is None:
            return  # experts resident: there is no expert cache to report
        for key, help_ in (("requests", "Expert lookups for demand"),
                           ("hits", "Demand lookups served from the cache"),
                           ("evictions", "Experts evicted from the cache")):
            yield CounterMetricFamily(f"{P}cache_{key}", help_, value=stats[key])
        yield GaugeMetricFamily(f"{P}cache_retention_ratio", "1 - evictions/requests since start",
                                value=stats["retention"])
        yield GaugeMetricFamily(f"{P}cache_bytes", "Expert cache size now", value=stats["cache_bytes"])
        yield CounterMetricFamily(f"{P}read_bytes", "Expert bytes read from disk", value=stats["bytes_read"])
        yield CounterMetricFamily(f"{P}read_busy_seconds", "Wall time with demand expert reads in flight",
                                  value=stats["read_seconds"])
        yield GaugeMetricFamily(f"{P}read_bandwidth_bytes_per_second",
                                "Expert bytes read per second of read time since start",
                                value=stats["bandwidth_bytes_per_second"])
