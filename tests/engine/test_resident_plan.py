"""A resident model's plan counts its tensors as the loader holds them (plan.resident_bytes): f32 on the CPU, the
kernels' file bytes on a GPU. Before session 39 a GPU's count was the CPU's, so a --budget (the supervisor always
passes one) refused a dense model the device holds at a fraction of that."""

import pytest
import torch

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, load_model, warm_experts
from sparkd.engine.streaming.plan import EXPERT_WEIGHT, kernel_rule, resident_bytes, trunk_bytes


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
