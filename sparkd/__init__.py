"""sparkd: keep very large MoE models running on one memory-limited GPU box without freezing it."""

__version__ = "0.1.0"
