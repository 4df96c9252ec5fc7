"""The watchers' shrink_cache action against a real `sparkd-engine serve` (streaming a tiny MoE
model): the HTTP contract between sparkd and the engine, which were built separately."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine" / "server"))
from engine_server import EngineProcess, make_tiny_model  # noqa: E402

from sparkd.watch.actions.shrink_cache import CacheClient  # noqa: E402


def _cache_bytes(engine: EngineProcess) -> float:
    for line in engine.metrics().splitlines():
        if line.startswith("sparkd_engine_cache_bytes "):
            return float(line.split()[1])
    raise AssertionError("sparkd_engine_cache_bytes missing from the engine's /metrics")


def test_shrink_and_grow_back_a_real_engine_cache(tmp_path):
    engine = EngineProcess(make_tiny_model(tmp_path / "tiny.gguf"), "--budget", "2G",
                           log=tmp_path / "engine.log").start()
    try:
        client = CacheClient(f"127.0.0.1:{engine.port}")
        before = asyncio.run(client.budget())
        assert before is not None and before > 0 and _cache_bytes(engine) == before
        asyncio.run(client.set_budget(before // 2))
        assert asyncio.run(client.budget()) <= before // 2 and _cache_bytes(engine) <= before // 2
        asyncio.run(client.set_budget(before))
        assert asyncio.run(client.budget()) == before
        # a budget the engine refuses is an error the action reports, not a silent no-op
        try:
            asyncio.run(client.set_budget(1))
            raise AssertionError("a 1-byte cache was accepted")
        except RuntimeError as exc:
            assert "400" in str(exc) and "/admin/cache" in str(exc)
        assert httpx.get(engine.base + "/health", timeout=10).json()["status"] == "ready"
    finally:
        engine.stop()
