"""What a prompt's KDA delta rule holds at its peak (kda.rule_peak_bytes) against every tensor it allocates,
tracked op by op, and that count in the memory plan's workspace (prompt_rule_bytes), where the way it runs
($SPARKD_KDA_PROMPT: chunks on CUDA, the loop on the CPU) is the one counted."""

import dataclasses

import pytest
import torch

import sparkd.engine.models  # noqa: F401  first: layers.moe and models import each other
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers import kda
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import config_of, kimi_k3
from sparkd.engine.streaming.device import CPU, DeviceInfo
from sparkd.engine.streaming.plan import Budget, make_plan, workspace_bytes
from live_bytes import LiveBytes

H200 = DeviceInfo("cuda:0", "discrete", total_bytes=140 << 30, free_bytes=139 << 30)


def _tracked_peak(rule, T: int, H: int, D: int, *args) -> int:
    g = torch.Generator().manual_seed(T)
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    given = [q, k, torch.randn(T, H, D, generator=g), -torch.rand(T, H, D, generator=g) * 0.1,
             torch.rand(T, H, generator=g), torch.randn(H, D, D, generator=g)]
    live = LiveBytes(given)
    with live:
        rule(*given, *args)
    return live.peak


@pytest.mark.parametrize("T", [2, 5, 6, 16, 37, 130])
@pytest.mark.parametrize("chunk,H,D", [(16, 4, 32), (64, 4, 32), (8, 3, 16)])
def test_the_chunked_rules_peak_is_the_count(monkeypatch, T, chunk, H, D):
    """Every byte the chunked rule holds at once, tracked: the count exactly where a chunk's pairwise phase
    ([H, C, C, Dk]) is the peak (C >= 6 at these shapes), never below it where a short prompt's solve phase is."""
    monkeypatch.setattr(kda, "PROMPT_RULE", "chunks")
    monkeypatch.setattr(kda, "CHUNK", chunk)
    tracked, count = _tracked_peak(kda.delta_rule_chunks, T, H, D, chunk), kda.rule_peak_bytes(T, H, D, D, False)
    assert tracked == count if min(T, chunk) >= 6 else tracked <= count < tracked * 1.15


@pytest.mark.parametrize("T,H,D", [(2, 3, 16), (5, 4, 32), (100, 4, 32)])
def test_the_loops_peak_is_within_the_count(monkeypatch, T, H, D):
    monkeypatch.setattr(kda, "PROMPT_RULE", "loop")
    tracked, count = _tracked_peak(kda.delta_rule, T, H, D), kda.rule_peak_bytes(T, H, D, D, False)
    assert tracked <= count < tracked * 1.05


def test_the_count_follows_the_way_that_runs(monkeypatch):
    """auto: chunks of CHUNK_CUDA on CUDA (the [H, C, C, Dk] tensor: 134 MB at kimi-k3's 64 heads of 128), the
    loop on the CPU and for one token anywhere; the chunked count grows with the tokens and the heads."""
    H, D = 64, 128
    cuda = kda.rule_peak_bytes(512, H, D, D, True)
    assert cuda > H * 64 * 64 * D * 4 > kda.rule_peak_bytes(512, H, D, D, False)
    extra = kda.CUDA_ALLOCATOR_BYTES
    assert kda.rule_peak_bytes(1, H, D, D, True) == kda.rule_peak_bytes(1, H, D, D, False) + extra
    # the outputs grow with the tokens; past a chunk, the pairwise phase does not
    assert kda.rule_peak_bytes(1024, H, D, D, True) - cuda == 512 * H * D * 4
    assert kda.rule_peak_bytes(512, 2 * H, D, D, True) == 2 * cuda - 64 * 64 - extra
    monkeypatch.setattr(kda, "PROMPT_RULE", "loop")
    assert kda.rule_peak_bytes(512, H, D, D, True) == kda.rule_peak_bytes(512, H, D, D, False) + extra


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("k3mem") / "k3.gguf", plan(TINY["kimi-k3"], "Q8_0"), seed=3)[0]
    with GGUFModel.open(path) as g:
        yield g, config_of(g)


@pytest.mark.parametrize("batch", [16, 64, 200])
def test_the_plan_counts_the_rule_in_its_workspace(k3, batch):
    """The plan's prompt_rule_bytes (in plan --json) is the count at the plan's batch and the model's KDA heads,
    the chunks' on a GPU and the loop's on the CPU, and its workspace holds it on top of the other transients."""
    g, cfg = k3
    H, D = cfg.n_head, cfg.extra["kda_head_dim"]
    for device in (H200, CPU):
        p = make_plan(g, cfg, Budget(1 << 30, "test"), 256, batch_tokens=batch, runtime_bytes=100 << 20,
                      device=device)
        want = kda.rule_peak_bytes(batch, H, D, D, device is H200)
        assert p.prompt_rule_bytes == p.as_dict()["prompt_rule_bytes"] == want > 0
        generic = workspace_bytes(dataclasses.replace(cfg, arch="qwen3moe"), 256, batch, cuda=device is H200)
        assert p.workspace_bytes == generic + want
    wide = dataclasses.replace(cfg, n_head=2 * H)
    assert kimi_k3.prompt_rule_bytes(wide, batch, True) == kda.rule_peak_bytes(batch, 2 * H, D, D, True)
    no_kda = dataclasses.replace(cfg, extra=cfg.extra | {"kda_layers": (False,) * cfg.n_layer})
    assert kimi_k3.prompt_rule_bytes(no_kda, batch, True) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("T", [37, 300])
@pytest.mark.parametrize("chunk", [kda.CHUNK, kda.CHUNK_CUDA])
def test_the_chunked_rules_peak_on_cuda_is_within_the_count(T, chunk):
    """On CUDA at kimi-k3's 64 heads of 128: what the chunked rule allocates at most (the caching allocator's peak
    above what was allocated before it, after a warm-up) stays within the plan's count, the tensors' bytes plus
    CUDA_ALLOCATOR_BYTES (the H200, session 18: the tensor count alone was 256 B to 64.5 KiB short at 37 tokens
    and at chunks of 16), and close to it."""
    g = torch.Generator().manual_seed(T)
    H, D = 64, 128
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, D, generator=g), dim=-1) for _ in range(2))
    args = [x.cuda() for x in (q, k, torch.randn(T, H, D, generator=g), -torch.rand(T, H, D, generator=g) * 0.5,
                               torch.rand(T, H, generator=g), torch.randn(H, D, D, generator=g))]
    kda.delta_rule_chunks(*args, chunk=chunk)  # cuBLAS's workspace and the like, once
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kda.delta_rule_chunks(*args, chunk=chunk)
    torch.cuda.synchronize()
    peak, count = torch.cuda.max_memory_allocated() - base, kda.chunks_peak_bytes(T, H, D, D, chunk)
    print(f"T {T} chunk {chunk}: peak {peak} count {count}")
    assert 0.9 * count <= peak <= count + kda.CUDA_ALLOCATOR_BYTES
