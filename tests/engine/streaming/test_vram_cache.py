"""The VRAM expert cache of a discrete GPU (streaming/vram.py) and the plan's host/device split
(streaming/device.py, plan.py): the admission policy on plain objects; the cache's bookkeeping
and the mixed VRAM/arena kernel table with the CPU standing in for the device (the kernels under
TRITON_INTERPRET=1); on the GPU box the same on CUDA (marker gpu)."""

import json
import os

import pytest
import torch
from gguf import GGMLQuantizationType as Q

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

from sparkd.engine.errors import EngineError  # noqa: E402
from sparkd.engine.gguf_file import GGUFModel  # noqa: E402
from sparkd.engine.layers.embedding import KernelEmbedding  # noqa: E402
from sparkd.engine.make_model import plan as model_plan, write_model  # noqa: E402
from sparkd.engine.models import config_of, load_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.streaming.device import DeviceInfo, split_vram, wants_vram_cache  # noqa: E402
from sparkd.engine.streaming.plan import Budget, PlanError, make_plan  # noqa: E402
from sparkd.engine.streaming.vram import Admission, Heat, VramExperts  # noqa: E402
from engine_cli import run_engine  # noqa: E402

GIB = 1 << 30
H200 = DeviceInfo("cuda:0", "discrete", total_bytes=140 * GIB, free_bytes=139 * GIB)
GB10 = DeviceInfo("cuda:0", "integrated", total_bytes=120 * GIB, free_bytes=100 * GIB)


# --- admission ------------------------------------------------------------------------------------
def test_heat_halves_every_half_life_and_keeps_order_through_rescaling():
    h = Heat(half_life_steps=2)
    h.use("a")
    for _ in range(4):
        h.step()
    assert h.decayed("a") == pytest.approx(0.25)
    h.use("b")
    assert h["b"] > h["a"]  # one use now outweighs one use four steps ago
    tiny = Heat(half_life_steps=1e-3)  # the gain overflows the rescaling threshold every step
    tiny.use("old")
    tiny.use("old")
    tiny.step()
    tiny.use("new")
    assert tiny["new"] > tiny["old"] > 0


def test_admits_into_free_slots_then_only_hotter_than_the_coldest():
    adm = Admission(2, half_life_steps=1e9)  # no decay: plain counts
    for key, uses in (("a", 3), ("b", 1), ("c", 1)):
        for _ in range(uses):
            adm.use(key)
    assert adm.offer("a") == (0, None) and adm.offer("b") == (1, None)
    assert adm.offer("c") is None  # as hot as the coldest resident (b): not hotter
    adm.use("c")
    assert adm.offer("c") == (1, "b")  # now hotter: takes b's slot
    assert "b" not in adm and adm.slot_of == {"a": 0, "c": 1}
    assert adm.offer("a") is None  # resident keys are not offered again


def test_busy_residents_are_never_victims():
    adm = Admission(1, half_life_steps=1e9)
    adm.use("a")
    adm.offer("a")
    for _ in range(5):
        adm.use("b")
    assert adm.offer("b", busy={"a"}) is None
    assert adm.offer("b") == (0, "a")


def test_decay_lets_a_new_hot_expert_replace_a_formerly_hot_one():
    adm = Admission(1, half_life_steps=1)
    for _ in range(4):
        adm.use("old")
    adm.offer("old")
    for _ in range(6):
        adm.step()  # 4 uses six half-lives ago weigh 1/16
    adm.use("new")
    assert adm.offer("new") == (0, "old")


def test_vram_cache_copies_gate_up_down_together_and_serves_hits():
    slot_bytes = 3 * 4096
    vram = VramExperts(2, slot_bytes, "cpu", half_life_steps=1e9)
    src = torch.arange(slot_bytes, dtype=torch.int32).to(torch.uint8)  # gate, up, down of one expert
    assert vram.use([(0, 7)]) == {}  # first use: not resident yet
    assert vram.offer((0, 7), src)
    assert vram.use([(0, 7), (0, 8)]) == {(0, 7): 0}
    assert torch.equal(vram.buffer[:slot_bytes], src)
    s = vram.stats
    assert (s.requests, s.hits, s.admissions, s.bytes_copied) == (3, 1, 1, slot_bytes)
    with pytest.raises(EngineError, match="exceed the slot"):
        vram.offer((0, 9), torch.zeros(slot_bytes + 1, dtype=torch.uint8))


# --- the plan's host/device split --------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("vram") / "m.gguf", model_plan(TINY["qwen3moe"], "Q8_0"), seed=5)[0]
    g = GGUFModel.open(path)
    yield path, g, config_of(g)
    g.close()


def _plan(g, cfg, device, budget=1 << 30, **kw):
    return make_plan(g, cfg, Budget(budget, "test"), 64, batch_tokens=16, runtime_bytes=100 << 20,
                     device=device, cuda_runtime_bytes=50 << 20, **kw)


def test_a_discrete_gpus_trunk_leaves_the_host_budget(model):
    _, g, cfg = model
    cpu, gpu = _plan(g, cfg, DeviceInfo("cpu", "cpu")), _plan(g, cfg, H200)
    moved = gpu.trunk_bytes + gpu.kv_bytes + gpu.rope_bytes + gpu.workspace_bytes
    assert gpu.trunk_on_device and not cpu.trunk_on_device
    assert gpu.device_total_bytes == moved + gpu.vram_cache_bytes
    # the host keeps the CUDA runtime and the buffer the trunk loads through instead: both halves
    # of it, each the largest trunk tensor in whole pages (this tiny model's are under 16 MiB)
    largest = max(t.nbytes for n, t in g.tensors.items() if "_exps." not in n)
    assert gpu.staging_bytes == 2 * -(-largest // 4096) * 4096 and cpu.staging_bytes == 0
    assert gpu.staging_bytes < gpu.trunk_bytes and gpu.cuda_runtime_bytes == 50 << 20
    assert gpu.total_bytes <= gpu.budget_bytes
    # everything fits in 139 GiB: every expert gets a VRAM slot
    assert gpu.vram_slots == gpu.n_experts_total and "free device memory" in gpu.vram_budget_source
    text = gpu.describe()
    assert "device (cuda:0, discrete)" in text and "vram experts" in text and "cuda runtime" in text
    # the prompt store sits beside the KV cache: a device term on a discrete GPU, a host one on the CPU
    store = 64 << 20
    cpu_s, gpu_s = (_plan(g, cfg, d, prompt_store_bytes=store) for d in (DeviceInfo("cpu", "cpu"), H200))
    assert cpu_s.host_model_bytes == cpu.host_model_bytes + store and cpu_s.total_bytes == cpu.total_bytes + store
    assert gpu_s.device_total_bytes == moved + store + gpu_s.vram_cache_bytes and gpu_s.total_bytes == gpu.total_bytes
    assert "prompt store" in gpu_s.describe() and "prompt store" not in text
    assert _plan(g, cfg, H200, prompt_store_bytes=None).prompt_store_bytes == (1 << 30) // 16  # auto: 1/16 of 1 GiB
    # auto takes only what the rest leaves: a budget the plan just fitted without the store still fits
    tight = cpu.total_bytes - cpu.expert_cache_bytes + cpu.min_slots * cpu.slot_bytes + 1000
    assert _plan(g, cfg, DeviceInfo("cpu", "cpu"), budget=tight, prompt_store_bytes=None).prompt_store_bytes == 1000
    with pytest.raises(PlanError, match="could not fit the model"):
        _plan(g, cfg, DeviceInfo("cpu", "cpu"), budget=tight, prompt_store_bytes=2000)


def test_a_gpus_trunk_term_is_what_the_device_load_holds(model):
    """On a GPU the trunk is kernel-type projections and the token embedding (since session 35; f32 before) as raw
    blocks and the rest f32; the network built on the meta device holds exactly that many bytes."""
    path, g, cfg = model
    m = load_model(path, device=torch.device("meta"))
    try:
        held = sum(t.numel() * t.element_size() for t in [*m.net.parameters(), *m.net.buffers()])
        assert isinstance(m.net.tok_embd, KernelEmbedding)
        assert m.net.tok_embd.raw.numel() == g.tensor("token_embd.weight").nbytes
    finally:
        m.close()
    gpu, cpu = _plan(g, cfg, H200), _plan(g, cfg, DeviceInfo("cpu", "cpu"))
    assert gpu.trunk_bytes == held and cpu.trunk_bytes != held


@pytest.mark.parametrize("qk_nope, k_b_blocks", [(32, True), (24, False)])
def test_a_gpus_trunk_term_counts_mlas_head_matrices_as_their_blocks(tmp_path, qk_nope, k_b_blocks):
    """MLA's 3-D per-head matrices (attn_k_b, attn_v_b) stay blocks on a GPU (Weights.stacked) where a kernel multiplies
    their rows, and f32 where not: attn_k_b F16 here, whose kernels (session 36) take rows of whole 32-value runs, so
    its rows of 24 (qk_nope) stay f32. The plan's trunk term is what the meta-device load holds."""
    shape = TINY["deepseek2"].replace(qk_nope=qk_nope)
    path = write_model(tmp_path / "m.gguf", model_plan(shape, "Q8_0", [("attn_k_b", "F16")]), seed=5)[0]
    g = GGUFModel.open(path)
    m = load_model(path, device=torch.device("meta"))
    try:
        held = sum(t.numel() * t.element_size() for t in [*m.net.parameters(), *m.net.buffers()])
        v_b, k_b = m.net.blocks[0].attn.wv_b, m.net.blocks[0].attn.wk_b
        assert v_b.raw.numel() == g.tensor("blk.0.attn_v_b.weight").nbytes  # Q8_0 blocks, not the packed layout
        assert g.tensor("blk.0.attn_k_b.weight").ggml_type == Q.F16
        if k_b_blocks:
            assert k_b.qtype == Q.F16 and k_b.raw.numel() == g.tensor("blk.0.attn_k_b.weight").nbytes
        else:
            assert k_b.weight.dtype == torch.float32
        assert _plan(g, config_of(g), H200).trunk_bytes == held
    finally:
        m.close()
        g.close()


def test_integrated_gpu_keeps_the_trunk_in_host_memory_and_no_vram_cache(model):
    _, g, cfg = model
    p = _plan(g, cfg, GB10)
    assert not p.trunk_on_device and p.vram_slots == 0 and p.device_total_bytes == 0
    assert p.total_bytes >= p.trunk_bytes + p.kv_bytes + p.staging_bytes and p.staging_bytes > 0
    with pytest.raises(EngineError, match="integrated GPU"):
        _plan(g, cfg, GB10, unified="off")


def test_unified_on_is_zero_copy_only(model):
    _, g, cfg = model
    p = _plan(g, cfg, H200, unified="on")
    assert p.trunk_on_device and p.vram_slots == 0 and "zero-copy" in p.vram_budget_source
    assert wants_vram_cache(H200, "auto") and not wants_vram_cache(H200, "on")


def test_explicit_vram_budget_in_whole_slots(model):
    _, g, cfg = model
    slot = _plan(g, cfg, H200).slot_bytes
    p = _plan(g, cfg, H200, vram_budget_bytes=3 * slot + 1)
    assert p.vram_slots == 3 and p.vram_cache_bytes == 3 * slot and p.vram_budget_source == "--vram-budget"


@pytest.mark.parametrize("device, unified, size, message", [
    (H200, "auto", 100, "smaller than one expert slot"),
    (H200, "auto", 200 * GIB, "has .* bytes free"),
    (H200, "on", GIB, "with --unified on"),
    (DeviceInfo("cpu", "cpu"), "auto", GIB, "exists only on a discrete GPU"),
    (GB10, "auto", GIB, "exists only on a discrete GPU"),
])
def test_bad_vram_budgets_are_clear_errors(model, device, unified, size, message):
    _, g, cfg = model
    with pytest.raises(EngineError, match=f"could not .*{message}"):
        _plan(g, cfg, device, unified=unified, vram_budget_bytes=size)


def test_a_trunk_larger_than_the_device_is_refused():
    small = DeviceInfo("cuda:0", "discrete", total_bytes=2 * GIB, free_bytes=GIB)
    with pytest.raises(EngineError, match="could not fit the trunk, KV cache and workspace"):
        split_vram(small, True, 10 << 20, 4096, 10, None)  # 1 GiB margin leaves nothing


def _cli(*args):
    return run_engine(*args, timeout=120)


def test_cli_rejects_an_unparsable_vram_budget_and_plan_json_has_both_sides(model):
    path, _, _ = model
    r = _cli("generate", str(path), "--tokens", "1", "--vram-budget", "lots")
    assert r.returncode == 2 and "could not parse size 'lots'" in r.stderr
    r = _cli("plan", str(path), "--budget", "1G", "--ctx", "64", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["device_kind"] == "cpu" and d["vram_slots"] == 0 and d["device_total_bytes"] == 0
    r = _cli("plan", str(path), "--budget", "1G", "--ctx", "64", "--vram-budget", "1G")
    assert r.returncode == 2 and "could not use --vram-budget on cpu" in r.stderr


# --- streamed through the kernels with the VRAM cache ---------------------------------------------
BACKENDS = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        ON_GPU, reason="this process compiles the kernels for the GPU; the interpreter variant runs where "
                       "there is no GPU")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def _greedy(net, prompt, n):
    cache = net.new_cache(len(prompt) + n)
    rows = [net(torch.tensor(prompt), cache)]
    out = []
    for _ in range(n):
        out.append(int(rows[-1][-1].argmax()))
        rows.append(net(torch.tensor(out[-1:]), cache))
    return torch.cat(rows), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_streamed_with_vram_cache_equals_resident(model, backend):
    """A 3-slot VRAM cache (smaller than the 8 experts a layer uses, so both kinds of slots meet in
    one kernel table) and a host cache of top-k: hits come from VRAM, the rest from the arena."""
    pytest.importorskip("triton", reason="triton is not installed")
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    path, g, cfg = model
    n = 6 if backend == "cuda" else 2
    slot = _plan(g, cfg, H200).slot_bytes
    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False, device=backend)
    ref, sm = load_model(path, device=backend, kernels=backend == "cuda"), open_streaming(path, opts)
    try:
        store = sm.store
        if backend == "cpu":  # the interpreter: experts through the kernels, a CPU tensor as "VRAM"
            store.kernel_device = "cpu"
            store.vram = VramExperts(3, slot, "cpu")
        assert store.vram is not None and store.vram.n_slots >= 3
        want_logits, want = _greedy(ref.net, [1, 5, 9, 33, 2], n)
        got_logits, got = _greedy(sm.model.net, [1, 5, 9, 33, 2], n)
        stats = store.snapshot()
    finally:
        ref.close()
        sm.close()
    err = float((got_logits - want_logits).norm() / want_logits.norm())
    print(f"vram {backend}: logits relative error {err:.2e}, bit-equal {torch.equal(got_logits, want_logits)}, "
          f"{json.dumps({k: v for k, v in stats.items() if k.startswith('vram')})}")
    assert stats["vram_hits"] > 0 and stats["vram_admissions"] > 0 and stats["misses"] > 0
    assert got == want
    # cuda: the resident kernel path on the same blocks (tiles may split the sums differently);
    # the interpreter: against the CPU reference (the bound of test_kernel_engine.py)
    assert err < (1e-5 if backend == "cuda" else 1e-3), err


def test_stage_profile_splits_the_kernel_paths_moe_host_time(model):
    """The streamed kernel path (the interpreter standing in for the GPU) reports its MoE layer's
    host parts: the routing ids' sync, VRAM admission and the kernel table, each counted."""
    pytest.importorskip("triton", reason="triton is not installed")
    if ON_GPU:
        pytest.skip("the interpreter variant runs where there is no GPU")
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.profile import StageProfile
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    path, g, cfg = model
    opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False)
    sm = open_streaming(path, opts)
    try:
        sm.store.kernel_device = "cpu"
        sm.store.vram = VramExperts(3, _plan(g, cfg, H200).slot_bytes, "cpu")
        net = sm.model.net
        cache = net.new_cache(4)
        net(torch.tensor([1, 5]), cache)
        prof = StageProfile(net)
        net(torch.tensor([9]), cache)
        rep = prof.report(0.0)
        prof.remove()
        assert sm.store.on_kernel_select is None  # removed with the hooks
    finally:
        sm.close()
    assert rep["host_sync_seconds"] > 0 and rep["table_seconds"] > 0 and rep["admission_seconds"] > 0
    assert rep["expert_compute_seconds"] >= rep["host_sync_seconds"] + rep["table_seconds"] - 1e-3
    assert "expert_kernels_gpu_seconds" not in rep and "attention_gpu_seconds" not in rep  # no CUDA events


def _streamed_logits(path, g, cfg, mode, n=2):
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    sm = open_streaming(path, StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False))
    try:
        sm.store.kernel_device, sm.store.table_mode = "cpu", mode
        sm.store.vram = VramExperts(3, _plan(g, cfg, H200).slot_bytes, "cpu")
        logits, _ = _greedy(sm.model.net, [1, 5, 9, 33, 2], n)
        return logits, len(sm.store.tables), sm.store.snapshot()
    finally:
        sm.close()


def test_cached_kernel_tables_give_the_checked_tables_bits(model):
    """SPARKD_STREAM_TABLE=cached (one prepare() per layer shape, offsets checked in Python) and
    =checked (prepare() per call) run the same kernels on the same offsets: equal logits, bit for bit,
    over mixed VRAM / arena tables."""
    pytest.importorskip("triton", reason="triton is not installed")
    if ON_GPU:
        pytest.skip("the interpreter variant runs where there is no GPU")
    path, g, cfg = model
    cached, n_tables, stats = _streamed_logits(path, g, cfg, "cached")
    checked, n_checked, _ = _streamed_logits(path, g, cfg, "checked")
    assert stats["vram_hits"] > 0 and stats["misses"] > 0  # both kinds of slot in the tables
    assert n_tables == 1 and n_checked == 0  # every layer has one shape: one checked template
    assert torch.equal(cached, checked)


def test_a_kernel_table_offset_outside_its_buffer_is_a_clear_error(model):
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.session import StreamOptions, open_streaming
    from sparkd.engine.streaming.zero_copy import _table_cached

    path, _, _ = model
    sm = open_streaming(path, StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False))
    try:
        past_the_end = sm.store.arena.n_slots  # one slot beyond the arena
        with pytest.raises(EngineError, match="could not build the kernel table of layer 0: expert 3's part 0"):
            _table_cached(sm.store, 0, [3], {}, {3: past_the_end}, "cpu")
    finally:
        sm.close()


def test_an_unknown_table_mode_is_a_clear_error():
    from sparkd.engine.streaming.zero_copy import table_mode

    assert table_mode({}) == "cached" and table_mode({"SPARKD_STREAM_TABLE": "checked"}) == "checked"
    with pytest.raises(EngineError, match="could not use SPARKD_STREAM_TABLE='fast': choose one of cached, checked"):
        table_mode({"SPARKD_STREAM_TABLE": "fast"})


@pytest.mark.gpu
def test_stage_profile_on_cuda_has_gpu_spans_and_equal_tables(model):
    """On the GPU: the profile's CUDA event spans (attention, expert kernels) and the VRAM copies'
    GPU time are there, and both kernel-table modes give the same logits bit for bit."""
    from sparkd.engine.streaming.plan import runtime_rss_bytes
    from sparkd.engine.streaming.profile import StageProfile
    from sparkd.engine.streaming.session import StreamOptions, open_streaming

    path, _, _ = model
    runs = {}
    for mode in ("cached", "checked"):
        opts = StreamOptions(budget_bytes=runtime_rss_bytes() + (1 << 30), ctx=64, direct=False, device="cuda",
                             vram_budget_bytes=3 * _plan(*model[1:], H200).slot_bytes)
        sm = open_streaming(path, opts)
        try:
            sm.store.table_mode = mode
            net = sm.model.net
            cache = net.new_cache(8)
            net(torch.tensor([1, 5, 9]), cache)
            prof = StageProfile(net)
            logits = torch.cat([net(torch.tensor([t]), cache) for t in (33, 2, 7)])
            runs[mode] = (logits.cpu(), prof.report(0.0))
            prof.remove()
        finally:
            sm.close()
    rep = runs["cached"][1]
    assert rep["expert_kernels_gpu_seconds"] > 0 and rep["attention_gpu_seconds"] > 0
    assert rep["host_sync_seconds"] > 0 and rep["table_seconds"] > 0 and "vram_copy_gpu_seconds" in rep
    assert torch.equal(runs["cached"][0], runs["checked"][0])
