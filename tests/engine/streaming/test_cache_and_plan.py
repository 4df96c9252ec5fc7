"""Cache policies on literal sequences, the simulator against a live run, and the memory plan's
budget sources (real files standing in for /proc/self/cgroup and a cgroup tree)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from sparkd.engine.streaming.plan import Budget, PlanError, make_plan, resolve_budget
from sparkd.engine.streaming.policies import LFUAging, LRU, S3FIFO
from sparkd.engine.streaming.simulate import simulate, simulate_all
from sparkd.engine.streaming.trace import Trace, census, read_trace

from conftest import REPO, open_stream


def test_lru_evicts_least_recent_and_skips_pinned():
    p = LRU(3)
    for k in "abc":
        p.insert(k)
    p.hit("a")
    assert p.evict() == "b"
    assert p.evict(pinned={"c"}) == "a"


def test_lfu_keeps_the_frequent_and_ages_old_counts():
    p = LFUAging(capacity=100)
    for k in "abc":
        p.insert(k)
    for _ in range(5):
        p.hit("a")
    p.hit("c")
    assert p.evict() == "b"
    aged = LFUAging(capacity=4)  # counts halve every 4 accesses: a's early popularity fades
    aged.insert("a")
    for _ in range(7):
        aged.hit("a")
    for _ in range(3):
        aged.insert("x") if "x" not in aged else aged.hit("x")
    aged.insert("y")
    for _ in range(4):
        aged.hit("y")
    assert aged._count["a"] < 8


def test_s3fifo_lets_one_hit_wonders_pass_through_the_small_queue():
    p = S3FIFO(10)
    p.insert("hot")
    p.hit("hot")
    for i in range(20):  # a scan of keys used once
        if len(p) >= 10:
            p.evict()
        p.insert(f"scan{i}")
    assert "hot" in p  # promoted to main, survived the scan


def test_s3fifo_ghost_hit_admits_to_main():
    p = S3FIFO(10)
    p.insert("a")
    assert p.evict() == "a"
    p.insert("a")
    assert p._where["a"] == "main"


def _trace(seq):
    return Trace([(i, 0, ids) for i, ids in enumerate(seq)], slot_bytes=4096, expert_bytes=4000)


def test_s3fifo_finds_a_victim_in_main_behind_a_pinned_small_queue():
    """A prefill pins many new experts (small queue) while warm ones in main carry frequency 3:
    each aging step in main is followed by a lap over the pinned small keys. Found by README's
    demo: the second request to a warm 86-slot cache failed with "every entry is pinned"."""
    p = S3FIFO(86)
    warm = [(0, i) for i in range(30)]
    for key in warm:
        p._ghost[key] = None  # re-admitted keys go straight to main
        p.insert(key)
        for _ in range(3):
            p.hit(key)
    fresh = [(1, i) for i in range(56)]
    for key in fresh:
        p.insert(key)
    assert p.evict(pinned=set(fresh)) in warm
    with pytest.raises(RuntimeError, match="every entry is pinned"):
        p.evict(pinned=set(fresh) | set(warm))


def test_belady_is_never_worse_than_any_policy():
    import random
    rng = random.Random(1)
    calls = [[rng.choice(range(12)) if rng.random() < 0.5 else rng.choice(range(3)) for _ in range(2)]
             for _ in range(400)]
    trace = _trace([sorted(set(c)) for c in calls])
    for cap in (2, 4, 8):
        rows = {r.policy: r for r in simulate_all(trace, cap)}
        assert all(rows["belady"].misses <= r.misses for r in rows.values()), rows
        assert all(r.hits + r.misses == r.requests for r in rows.values())


def test_census_warm_start_turns_first_misses_into_hits():
    trace = _trace([[1, 2], [1, 2], [3, 1]])
    cold = simulate(trace, LRU(4), 4)
    warm = simulate(trace, LRU(4), 4, warm=[(layer, e) for layer, e, _ in census(trace)])
    assert (cold.misses, warm.misses) == (3, 0)


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo"])
def test_replay_of_a_live_trace_counts_what_the_store_counted(tiny_models, tmp_path, policy):
    path = tmp_path / "t.txt"
    with open(path, "w") as f:
        m, store = open_stream(tiny_models["qwen3moe", "Q8_0"], 3, policy=policy, trace=f)
        try:
            cache = m.net.new_cache(64)
            logits = m.net(torch.tensor([1, 2, 3, 4, 5]), cache)
            for _ in range(10):
                logits = m.net(logits[-1:].argmax(-1), cache)
            live = store.stats
        finally:
            m.close()
            store.close()
    trace = read_trace(path)
    assert trace.steps == 11
    from sparkd.engine.streaming.policies import make_policy
    sim = simulate(trace, make_policy(policy, 3), 3)
    assert (sim.requests, sim.hits, sim.misses, sim.evictions) == (live.requests, live.hits, live.misses,
                                                                   live.evictions)


def test_simulate_cache_cli_prints_every_policy_and_belady(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# sparkd-trace v1 slot_bytes=8192 expert_bytes=6528\n0 0 1 2\n1 0 2 3\n2 0 1 3\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "simulate-cache", "--trace", str(path),
                        "--budget", "16K", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["capacity_slots"] == 2
    assert [p["policy"] for p in out["policies"]] == ["lru", "lfu", "s3fifo", "belady"]
    bad = tmp_path / "bad.txt"
    bad.write_text("0 zero 1\n")
    r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "simulate-cache", "--trace", str(bad),
                        "--budget", "16K"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and f"could not parse trace {bad} line 1" in r.stderr


# --- the budget --------------------------------------------------------------------------------
def _cgroup_tree(tmp_path, own: str, parent: str):
    root = tmp_path / "cg"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "memory.max").write_text(parent + "\n")
    (root / "a" / "b" / "memory.max").write_text(own + "\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n0::/a/b\n")
    return proc, root


def test_budget_is_the_tightest_cgroup_limit_minus_headroom(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "max", str(8 << 30))
    b = resolve_budget(None, proc, root, "/proc/meminfo")
    assert b.bytes == (8 << 30) - int((8 << 30) * 0.05)
    assert str(root / "a" / "memory.max") in b.source and not b.warning
    proc, root = _cgroup_tree(tmp_path / "2", str(1 << 30), str(8 << 30))
    assert resolve_budget(None, proc, root).bytes == (1 << 30) - (256 << 20)  # the minimum headroom


def test_budget_falls_back_to_memavailable_with_a_warning(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "max", "max")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    b = resolve_budget(None, proc, root, meminfo)
    assert (b.bytes, b.source) == (2 << 20, "MemAvailable") and "pass --budget" in b.warning
    assert resolve_budget(123, proc, root, meminfo) == Budget(123, "--budget")


def test_plan_refusal_lists_every_term(tiny_models):
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models import config_of
    with GGUFModel.open(tiny_models["qwen3moe", "Q8_0"]) as g:
        cfg = config_of(g)
        ok = make_plan(g, cfg, Budget(1 << 30, "t"), 64, prefetch_slots=2, runtime_bytes=0)
        assert ok.cache_slots == ok.n_experts_total == 16 and ok.total_bytes <= 1 << 30
        with pytest.raises(PlanError) as err:
            make_plan(g, cfg, Budget(1 << 20, "t"), 64, prefetch_slots=2, runtime_bytes=0)
    msg = str(err.value)
    for term in ("runtime", "slack", "trunk", "kv", "workspace", "prefetch", "experts"):
        assert term in msg
    assert "top-2" in msg and "raise --budget" in msg


def test_plan_cli_json(tiny_models):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "plan", str(tiny_models["llama", "Q8_0"]),
                        "--budget", "2G", "--ctx", "128", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["budget_bytes"] == 2 << 30 and p["budget_source"] == "--budget" and p["ctx"] == 128
    assert p["total_bytes"] <= p["budget_bytes"] and p["slot_bytes"] % 4096 == 0
    assert p["prompt_store_bytes"] == (2 << 30) // 16  # serve's auto store: 1/16 of the budget
    r = subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "plan", str(tiny_models["llama", "Q8_0"]),
                        "--budget", "2G", "--prompt-cache-mib", "lots"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "could not use --prompt-cache-mib lots" in r.stderr


def test_plan_cli_takes_the_context_as_serve_does(tiny_models):
    """Without --ctx the plan is for 4096 positions at most the trained context (serve's default); a context past
    the trained one is refused with serve's message (it was planned at the trained context, silently, before
    session 38), so is one under 1; nothing is printed on stdout then."""
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models import config_of

    path = str(tiny_models["llama", "Q8_0"])
    with GGUFModel.open(path) as g:
        trained = config_of(g).n_ctx_train
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def plan(*args):
        return subprocess.run([sys.executable, "-m", "sparkd.engine.cli", "plan", path, "--budget", "2G", "--json",
                               *args], capture_output=True, text=True, env=env)
    r = plan()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ctx"] == min(4096, trained)
    past = f"the model was trained for {trained} positions; give --ctx {trained} or less"
    for ctx, why in ((trained + 1, past), (0, "it must be at least 1")):
        r = plan("--ctx", str(ctx))
        assert r.returncode != 0 and f"could not use --ctx {ctx}: {why}" in r.stderr and not r.stdout


def test_staging_term_is_the_buffer_the_loader_allocates(tiny_models):
    """On a GPU the plan's staging term is the trunk loader's two-half buffer (not a multiple of the
    trunk): each half min(16 MiB, the largest trunk tensor), in whole pages; none on the CPU."""
    from sparkd.engine.gguf_file import GGUFModel
    from sparkd.engine.models import config_of
    from sparkd.engine.models.staging import DeviceStager, staging_buffer_bytes
    from sparkd.engine.streaming.device import CPU, DeviceInfo
    from sparkd.engine.streaming.plan import largest_trunk_tensor_bytes, staging_term_bytes

    assert staging_buffer_bytes(1) == 2 * 4096 and staging_buffer_bytes(4097) == 4 * 4096
    assert staging_buffer_bytes(100 << 20) == staging_buffer_bytes(16 << 20) == 32 << 20
    gpu = DeviceInfo("cuda:0", "discrete", 1 << 40, 1 << 40)
    with GGUFModel.open(tiny_models["qwen3moe", "Q8_0"]) as g:
        largest = largest_trunk_tensor_bytes(g)
        assert largest == max(t.nbytes for n, t in g.tensors.items() if "_exps.weight" not in n)
        stager = DeviceStager(g, "meta", largest)
        allocated = stager.buffer_bytes
        stager.close()
        assert stager.buffer_bytes == 0
        assert staging_term_bytes(g, gpu) == allocated == staging_buffer_bytes(largest)
        assert staging_term_bytes(g, CPU) == 0
        plan = make_plan(g, config_of(g), Budget(1 << 30, "t"), 64, runtime_bytes=0, device=gpu)
        assert plan.staging_bytes == allocated and "trunk loads through" in plan.describe()
