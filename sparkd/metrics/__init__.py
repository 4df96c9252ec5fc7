"""sparkd's Prometheus metrics: the collector, the counters the supervisor and watchers feed,
and the HTTP endpoint the daemon serves on daemon.metrics_listen."""

from .collector import SparkdCollector
from .counters import ACTION_OUTCOMES, NVRM_BUCKETS, SparkdCounters
from .source import ServiceView, SupervisorSource

__all__ = ["ACTION_OUTCOMES", "NVRM_BUCKETS", "ServiceView", "SparkdCollector", "SparkdCounters", "SupervisorSource"]
