"""MLA's prompt as multi-head attention (layers/mla.py, session 32): a prompt of MHA_ROWS tokens or more on CUDA
expands the cached latent rows to the heads' keys and values and attends at 192/128 wide through attend_sdpa.
The same sums as the absorbed form in another order: the logits agree within float32 rounding, from position 0
and continuing the cache, over float32 and float16 latent rows, with and without rope (kimi-k3's nope-only MLA,
its output gate). On the CPU (the interpreter box) the test lets the CPU expand (MHA_DEVICES) at a few rows; on
the GPU box (marker gpu) the prompt runs on CUDA at the real threshold."""

import pytest
import torch

from sparkd.engine.layers import attention, mla
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

ON_GPU = torch.cuda.is_available()
BOUND = 2e-5  # float32 sums in another order (the tiny models' logits on the CPU: measured 2.7e-7 to 3.2e-6)
# the half expansion's keys and values rounded to float16 (the tiny models' logits on the CPU: measured 1.9e-4 and 4.9e-4)
HALF_LOGITS = 5e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = write_model(tmp_path_factory.mktemp(arch) / "m.gguf", plan(TINY[arch], "F32"), seed=7)[0]
        return made[arch]
    return get


def _logits(path, device: str, way: str, split: int, n: int, kv: torch.dtype, monkeypatch) -> torch.Tensor:
    """The logits of an n-token prompt run as two forwards (split tokens, then the rest continuing the cache)."""
    monkeypatch.setattr(mla, "MLA_PROMPT", way)
    m = load_model(path, device=device)
    cache = m.net.new_cache(n + 4, kv)
    tokens = torch.arange(n) * 7 % m.net.cfg.n_vocab
    first = m.net(tokens[:split], cache)
    return torch.cat([first, m.net(tokens[split:], cache)])


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("kv", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("arch", ["deepseek2", "kimi-k3"])
@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("heads", [mla.EXPAND_HEADS, 1], ids=["block", "one-head"])
def test_the_expanded_prompt_gives_the_absorbed_prompts_logits(models, arch, kv, device, heads, monkeypatch):
    """heads: EXPAND_HEADS, the heads expanded at a time (the tiny models' 4 in one block at the default; one at a
    time, four blocks). SDPA_PRECISION float32: the expansion in float32 over either row type (half's float16
    expansion: test_the_half_expansion_over_float16_rows)."""
    monkeypatch.setattr(mla, "EXPAND_HEADS", heads)
    monkeypatch.setattr(attention, "SDPA_PRECISION", "float32")
    if device == "cpu":
        monkeypatch.setattr(mla, "MHA_DEVICES", ("cpu",))
        monkeypatch.setattr(mla, "MHA_ROWS", 4)
    n, split = (2 * mla.MHA_ROWS + 8, mla.MHA_ROWS + 3) if device == "cuda" else (12, 5)
    calls = []
    expanded = mla.MLAttention._expanded
    monkeypatch.setattr(mla.MLAttention, "_expanded", lambda self, *a: calls.append(1) or expanded(self, *a))
    want = _logits(models(arch), device, "absorbed", split, n, kv, monkeypatch)
    assert not calls
    got = _logits(models(arch), device, "mha", split, n, kv, monkeypatch)
    assert calls  # both forwards (from 0, and continuing the cache) expanded
    assert got.shape == want.shape == (n, want.shape[1])
    assert _rel(got, want) < BOUND
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("arch", ["deepseek2", "kimi-k3"])
@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
def test_the_half_expansion_over_float16_rows(models, arch, device, monkeypatch):
    """Under SPARKD_SDPA_PRECISION=half (the default; MLA's expansion follows it since session 46) the keys and values
    over float16 latent rows are expanded in float16, within HALF_LOGITS of the absorbed form's logits with the same
    argmax, and not float32's bits (it did round); over float32 rows half is float32, bit for bit. On the CPU the
    queries stay float32 (attend_sdpa's half path is CUDA's)."""
    if device == "cpu":
        monkeypatch.setattr(mla, "MHA_DEVICES", ("cpu",))
        monkeypatch.setattr(mla, "MHA_ROWS", 4)
    n, split = (2 * mla.MHA_ROWS + 8, mla.MHA_ROWS + 3) if device == "cuda" else (12, 5)
    run = {}
    for way, precision in (("absorbed", "half"), ("mha", "float32"), ("mha", "half")):
        monkeypatch.setattr(attention, "SDPA_PRECISION", precision)
        for kv in (torch.float16, torch.float32):
            run[way, precision, kv] = _logits(models(arch), device, way, split, n, kv, monkeypatch)
    want, got = run["absorbed", "half", torch.float16], run["mha", "half", torch.float16]
    print(f"{arch} {device}: the half expansion over float16 rows {_rel(got, want):.2e} of the absorbed form")
    assert _rel(got, want) < HALF_LOGITS and torch.equal(got.argmax(-1), want.argmax(-1))
    assert not torch.equal(got, run["mha", "float32", torch.float16])
    assert torch.equal(run["mha", "half", torch.float32], run["mha", "float32", torch.float32])


def test_few_rows_and_the_cpu_keep_the_absorbed_form(models, monkeypatch):
    """Below MHA_ROWS tokens, and on the CPU at any length, the prompt attends over the latent rows."""
    calls = []
    monkeypatch.setattr(mla.MLAttention, "_expanded", lambda self, *a: calls.append(1))
    monkeypatch.setattr(mla, "MHA_ROWS", 4)
    _logits(models("deepseek2"), "cpu", "mha", 5, 12, torch.float32, monkeypatch)  # the CPU: not in MHA_DEVICES
    monkeypatch.setattr(mla, "MHA_DEVICES", ("cpu",))
    _logits(models("deepseek2"), "cpu", "mha", 2, 5, torch.float32, monkeypatch)  # 2 and 3 rows
    assert not calls
