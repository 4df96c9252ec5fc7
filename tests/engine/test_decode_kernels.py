"""bench/gpu_box/decode_kernels.py: a replayed decode step's kernels cut into steps, the layer
pattern found, each kernel labelled with its part, and the sums by part (fake profiler events)."""

from __future__ import annotations

from types import SimpleNamespace

from bench_script import load_bench_script

kernels = load_bench_script("gpu_box/decode_kernels.py")

LAYER = ["_rms_norm_rows", "_q8w_gemv", "_rope_kv", "_decode_attention", "_q8w_gemv", "_rms_norm_rows",
         "_gate_topk", "_igate_up_kernel", "_idown_kernel"]
STEP = (["fill", "fill", "index_elementwise_kernel"] + LAYER * 3
        + ["_rms_norm_rows", "_q8w_gemv", "ArgMaxOps reduce_kernel", "Memcpy DtoH (Device -> Pinned)"])


def fake_steps(n: int):
    """n steps of STEP: kernel i lasts i+1 us, 1 us idle between kernels, 50 us between steps."""
    events, t = [], 0.0
    for _ in range(n):
        for i, name in enumerate(STEP):
            events.append(SimpleNamespace(name=name, time_range=SimpleNamespace(
                start=t, end=t + i + 1, elapsed_us=lambda i=i: float(i + 1))))
            t += i + 2
        t += 49
    return events


def test_layer_pattern_and_roles():
    names = STEP[2:-1]
    assert kernels.layer_period(names, 3) == (1, len(LAYER))
    assert kernels.layer_period(["a", "b"], 3) == (2, 0)  # no pattern: nothing is a layer
    roles = [r for _, r in kernels.label(names, 3)]
    assert roles[:10] == ["embedding", "norm", "qkv GEMV", "rope + KV write", "attention", "o GEMV", "norm",
                          "router (gate GEMV + top-k)", "experts gate/up", "experts down"]
    assert roles[-3:] == ["norm", "head GEMV", "argmax"]


def test_table_by_role():
    steps = kernels.steps_of(reversed(fake_steps(3)))  # any order in: sorted by start
    assert [len(s) for s in steps] == [len(STEP)] * 3
    t = kernels.kernel_table(steps, 3, {"qkv GEMV": 2e6, "head GEMV": 1e6})
    assert t["graph_kernels"] == len(STEP) - 3 and t["between_steps_us"] == 50.0
    assert t["gap_us_inside"] == len(STEP) - 4  # 1 us before each graph kernel but the first
    qkv = t["by_role"]["layer: qkv GEMV"]
    assert qkv["count"] == 3 and qkv["us"] == 5 + 14 + 23
    assert abs(qkv["gb_s"] - 3 * 2e6 / (42 * 1e3)) < 1e-9
    assert t["by_role"]["feed: fill"]["count"] == 2
