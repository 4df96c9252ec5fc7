"""A resident model's plan counts its tensors as the loader holds them (plan.resident_bytes): f32 on the CPU, the
kernels' file bytes on a GPU. Before session 39 a GPU's count was the CPU's, so a --budget (the supervisor always
passes one) refused a dense model the device holds at a fraction of that."""

import pytest
import torch

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model, warm_experts
from sparkd.engine.models.weights import kernel_rule
from sparkd.engine.runtime import Engine, MemoryPlanError, resident_plan
from sparkd.engine.streaming.device import CPU, DeviceInfo, probe_device, vram_margin_bytes
from sparkd.engine.streaming.plan import EXPERT_WEIGHT, resident_bytes, trunk_bytes


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("resident") / "q.gguf", plan(TINY["qwen3moe"], "Q8_0"), seed=4)[0]


def test_a_gpu_counts_the_files_blocks_the_cpu_floats(path):
    with GGUFModel.open(path) as g:
        cfg = config_of(g)
        cpu = resident_bytes(g, cfg.n_layer)
        gpu = resident_bytes(g, cfg.n_layer, kernel_rule())
        experts = [info for name, info in g.tensors.items() if EXPERT_WEIGHT.match(name)]
        assert cpu == (sum(4 * i.n_elements for n, i in g.tensors.items() if not EXPERT_WEIGHT.match(n)),
                       sum(4 * i.n_elements for i in experts))
        assert gpu == (trunk_bytes(g, cfg.n_layer, kernel_rule()), sum(i.nbytes for i in experts))  # Q8_0 blocks
    assert gpu[1] * 3 < cpu[1] and gpu[0] < cpu[0]  # 34 bytes a 32-value block, not 128


@pytest.mark.gpu
def test_on_the_gpu_the_load_holds_what_the_plan_counts(path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with GGUFModel.open(path) as g:
        trunk, experts = resident_bytes(g, config_of(g).n_layer, kernel_rule())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    m = load_model(path, device="cuda")
    try:
        warm_experts(m.net)  # the routed experts load a layer at a time on first use
        held = torch.cuda.memory_allocated() - before
    finally:
        m.close()
    assert 0.9 * (trunk + experts) <= held <= 1.05 * (trunk + experts) + (1 << 20), (held, trunk, experts)


MIB = 1 << 20


def test_a_discrete_gpu_holds_the_model_against_its_own_memory_not_the_budget(path):
    """On a discrete GPU the resident model lives in the device's memory: a --budget (the host's) below the model's
    bytes does not refuse it, and a device with too little free memory does, naming the device and every term. The
    DeviceInfo is made up here (this machine has no GPU); the GPU test below loads one on the real device."""
    with GGUFModel.open(path) as g:
        cfg = config_of(g)
        need = sum(resident_bytes(g, cfg.n_layer, kernel_rule()))
        roomy = DeviceInfo("cuda:0", "discrete", total_bytes=80 << 30, free_bytes=79 << 30)
        plan = resident_plan(g, cfg, 64, "f16", budget_bytes=need // 2, store_request=0, device=roomy)
        assert plan["budget"] == need // 2 and plan["trunk"] + plan["experts_resident"] == need
        with pytest.raises(MemoryPlanError, match="could not plan memory for .*q.gguf: trunk"):
            resident_plan(g, cfg, 64, "f16", budget_bytes=need // 2, store_request=0, device=CPU)
        margin = vram_margin_bytes(DeviceInfo("cuda:0", "discrete", total_bytes=8 << 30))  # 1 GiB at least
        tight = DeviceInfo("cuda:0", "discrete", total_bytes=8 << 30, free_bytes=margin + need // 2)
        with pytest.raises(MemoryPlanError) as err:
            resident_plan(g, cfg, 64, "f16", budget_bytes=None, store_request=0, device=tight)
        assert "exceeds cuda:0's" in str(err.value) and "free less a" in str(err.value)
        assert "serve without --resident" in str(err.value)
        # the auto prompt store takes only what the device leaves
        snug = DeviceInfo("cuda:0", "discrete", total_bytes=8 << 30, free_bytes=margin + need + 3 * MIB)
        plan = resident_plan(g, cfg, 64, "f16", budget_bytes=None, store_request=None, device=snug)
        assert plan["prompt_store"] == 3 * MIB - plan["kv"] - plan["rope"]


def test_a_dense_model_too_large_for_the_device_is_told_to_shrink_not_to_stream(tmp_path):
    """A dense model has no routed experts to stream: the refusal on a discrete GPU says to use a smaller
    quantization (or a shorter context), not to serve without --resident."""
    dense = write_model(tmp_path / "dense.gguf", plan(TINY["gemma3"], "Q8_0"), seed=4)[0]
    with GGUFModel.open(dense) as g:
        cfg = config_of(g)
        need = sum(resident_bytes(g, cfg.n_layer, kernel_rule()))
        margin = vram_margin_bytes(DeviceInfo("cuda:0", "discrete", total_bytes=8 << 30))
        tight = DeviceInfo("cuda:0", "discrete", total_bytes=8 << 30, free_bytes=margin + need // 2)
        with pytest.raises(MemoryPlanError, match=r"exceeds cuda:0's .* or use a smaller quantization$"):
            resident_plan(g, cfg, 64, "f16", budget_bytes=None, store_request=0, device=tight)


@pytest.mark.gpu
def test_on_the_gpu_a_budget_below_the_model_still_serves_it(path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with GGUFModel.open(path) as g:
        need = sum(resident_bytes(g, config_of(g).n_layer, kernel_rule()))
    if not probe_device("cuda").discrete:
        pytest.skip("an integrated GPU: the budget is the device's memory too")
    engine = Engine(path, ctx=64, resident=True, budget_bytes=need // 2, device="cuda")
    try:
        engine.load()
        assert engine.memory_plan()["budget"] == need // 2
    finally:
        engine.close()
