"""Every architecture keeps its tensors on the network's device, checked without a GPU: with
torch's default device set to "meta", a tensor created without device= lands on meta and mixing
it with the CPU network fails; a network moved to meta must make a cache whose every tensor is
on meta. (The real run on CUDA is bench/gpu_box/archs_on_cuda.py.)"""

import pytest
import torch

from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

PROMPT = torch.tensor([1, 7, 42, 3, 99, 5, 17, 8], device="cpu")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {a: write_model(d / f"{a}.gguf", plan(TINY[a], "F32"), seed=3)[0] for a in TINY}


def cache_tensors(cache) -> list[torch.Tensor]:
    states = [t for ts in cache.state.values() for t in ts]
    compressors = [t for s in getattr(cache, "states", {}).values() for t in (s.kv, s.score, s.entries)]
    return [t for t in cache.k + cache.v + list(cache.side.values()) + states + compressors if t is not None]


@pytest.mark.parametrize("arch", sorted(TINY))
def test_forward_creates_no_tensor_on_the_default_device(models, arch):
    m = load_model(models[arch])
    try:
        want = m.net(PROMPT, m.net.new_cache(32))
        cache = m.net.new_cache(32)
        with torch.device("meta"):
            got = torch.cat([m.net(PROMPT[:5], cache)] + [m.net(PROMPT[i:i + 1], cache) for i in range(5, 8)])
    finally:
        m.close()
    assert got.device.type == "cpu"  # logits come back to the host, where sampling runs
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


@pytest.mark.parametrize("arch", sorted(TINY))
def test_cache_is_made_on_the_network_device(models, arch):
    m = load_model(models[arch])
    try:
        tensors = cache_tensors(m.net.to("meta").new_cache(8))
    finally:
        m.close()
    assert tensors and {t.device.type for t in tensors} == {"meta"}
