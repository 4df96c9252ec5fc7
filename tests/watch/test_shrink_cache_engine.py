"""The watchers' shrink_cache action against a real `sparkd-engine serve` (streaming a tiny MoE
model): the HTTP contract between sparkd and the engine, which were built separately, with and
without the API key from the policy's api_key_file."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine" / "server"))
from engine_server import EngineProcess, make_tiny_model  # noqa: E402

from sparkd.policy import parse_policy  # noqa: E402
from sparkd.sizes import format_size  # noqa: E402
from sparkd.specs import engine_argv  # noqa: E402
from sparkd.watch import EventLog, Holds, SupervisorControl, WatchManager  # noqa: E402
from sparkd.watch.actions.shrink_cache import CacheClient  # noqa: E402
from sparkd.watch.psi import PsiSample  # noqa: E402


def _cache_bytes(engine: EngineProcess) -> float:
    for line in engine.metrics().splitlines():
        if line.startswith("sparkd_engine_cache_bytes "):
            return float(line.split()[1])
    raise AssertionError("sparkd_engine_cache_bytes missing from the engine's /metrics")


def _budget(engine: EngineProcess, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(engine.base + "/admin/cache", headers=headers, timeout=10).json()["budget"]


def test_shrink_and_grow_back_a_real_engine_cache(tmp_path):
    engine = EngineProcess(make_tiny_model(tmp_path / "tiny.gguf"), "--budget", "2G",
                           log=tmp_path / "engine.log").start()
    try:
        client = CacheClient(f"127.0.0.1:{engine.port}")
        before = _budget(engine)
        assert before > 0 and _cache_bytes(engine) == before
        # one request: the answer carries the budget before, what the grow-back restores
        assert asyncio.run(client.set_budget(before // 2)) == before
        shrunk = _budget(engine)
        assert shrunk <= before // 2 and _cache_bytes(engine) == shrunk
        assert asyncio.run(client.set_budget(before)) == shrunk
        assert _budget(engine) == before
        # a budget the engine refuses is an error the action reports, not a silent no-op
        try:
            asyncio.run(client.set_budget(1))
            raise AssertionError("a 1-byte cache was accepted")
        except RuntimeError as exc:
            assert "400" in str(exc) and "/admin/cache" in str(exc)
        assert httpx.get(engine.base + "/health", timeout=10).json()["status"] == "ready"
    finally:
        engine.stop()


def _psi_rising_then_clear(manager, service: str) -> None:
    """full stall 600 ms per second for 6 s (the shrink rule's 5 s duration), then none for 4 s."""
    series = [(float(t), 600_000 * t, 600_000 * t) for t in range(0, 7)]
    series += [(float(t), 600_000 * 6, 600_000 * 6) for t in range(7, 11)]
    for t, some, full in series:
        manager._on_psi(service, PsiSample(t, "/x/memory.pressure", {"some": some, "full": full},
                                           {"some": 0.0, "full": 0.0}))


def _run_shrink_rule(tmp_path: Path, policy) -> list[dict]:
    """The policy's shrink rule through a WatchManager wired to the policy like sparkd wires it;
    PSI samples injected (this host cannot make the kernel stall on demand)."""
    manager = WatchManager(policy, SupervisorControl(SimpleNamespace(policy=policy)), EventLog(tmp_path),
                           Holds(tmp_path), state_dir=tmp_path)

    async def scenario():
        manager.events.open()
        _psi_rising_then_clear(manager, "llm")
        while manager._tasks:
            await asyncio.gather(*list(manager._tasks))

    asyncio.run(scenario())
    return [e for e in manager.events.read() if e["type"] in ("action", "reverted")]


def test_shrink_cache_sends_the_api_key_from_api_key_file(tmp_path):
    key_file = tmp_path / "engine.key"
    key_file.write_text("s3cret-key-77\n")
    engine = EngineProcess(make_tiny_model(tmp_path / "tiny.gguf"), log=tmp_path / "engine.log")
    policy = parse_policy({
        "services": {"llm": {"memory_max": "2G", "engine": {"embedded": {
            "model": str(tmp_path / "tiny.gguf"), "listen": f"127.0.0.1:{engine.port}", "api_key_file": str(key_file)}}}},
        "pressure": {"rules": [{"name": "shrink", "detector": "psi", "kind": "full", "stall": "100ms", "duration": "5s",
                                "clear_for": "3s", "action": "shrink_cache", "budget": "192K", "cooldown": "60s"}]},
    }, source="test", total_memory_bytes=64 << 30)
    # the engine as sparkd starts it: the key file on argv, never the key (ps shows argv)
    argv = engine_argv(policy.services["llm"], "sparkd-engine")
    assert argv[argv.index("--api-key-file") + 1] == str(key_file)
    engine.argv = [sys.executable, "-m", "sparkd.engine.cli", *argv[1:], "--threads", "1"]
    engine.start()
    try:
        assert b"s3cret" not in Path(f"/proc/{engine.proc.pid}/cmdline").read_bytes()
        before = _budget(engine, key="s3cret-key-77")
        results = [(e["type"], e["result"]) for e in _run_shrink_rule(tmp_path / "right", policy)]
        assert results == [("action", f"expert cache shrunk to 192.0K (was {format_size(before)})"),
                           ("reverted", f"expert cache grown back to {format_size(before)}")]
        assert _cache_bytes(engine) == before
        # a key that is not the engine's (the file rotated, the engine not restarted): 401, said
        key_file.write_text("wrong-key\n")
        (action,) = _run_shrink_rule(tmp_path / "wrong", policy)
        assert action["result"].startswith("failed: could not POST") and "HTTP 401" in action["result"]
        assert "api_key_file" in action["result"] and _cache_bytes(engine) == before
    finally:
        engine.stop()
