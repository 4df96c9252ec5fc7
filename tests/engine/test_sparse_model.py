"""`make-model --sparse`: the real Kimi K3 shape and a UD-IQ1_S-like type mix (634.6 GB) as a
file of holes; `inspect` and `plan` work from its header alone, and the plan fits in 92 GiB."""

import json

import pytest

from sparkd.engine.gguf_file import GGUFModel
from engine_cli import run_engine

# unsloth's Kimi-K3 UD-IQ1_S is 634.6 GB; this mix lands there with the kimi-k3 preset's shapes:
# gate/up experts IQ1_S, down experts IQ2_XXS (IQ2_XS in MoE layers 1-11), all else Q8_0 / F32
UD_IQ1_S = ["--quant", "Q8_0", "--tensor-type", r"blk\.([1-9]|1[01])\.ffn_down_exps=IQ2_XS",
            "--tensor-type", "ffn_down_exps=IQ2_XXS", "--tensor-type", "_exps=IQ1_S"]
MAX_ALLOCATED_BYTES = 64 << 20  # header + tokenizer + per-tensor padding blocks


run = run_engine


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = tmp_path_factory.mktemp("sparse") / "kimi-k3-ud-iq1_s.gguf"
    r = run("make-model", str(path), "--preset", "kimi-k3", *UD_IQ1_S, "--sparse", "--quiet")
    assert r.returncode == 0, r.stderr
    return path


def test_sparse_file_has_the_real_size_and_almost_no_blocks(k3):
    st = k3.stat()
    assert 634.0e9 < st.st_size < 635.0e9
    assert st.st_blocks * 512 < MAX_ALLOCATED_BYTES
    with GGUFModel.open(k3) as g:
        assert g.tensors["blk.1.ffn_gate_exps.weight"].ggml_type.name == "IQ1_S"
        assert g.tensors["blk.1.ffn_down_exps.weight"].ggml_type.name == "IQ2_XS"
        assert g.tensors["blk.50.ffn_down_exps.weight"].ggml_type.name == "IQ2_XXS"
        assert g.tensors["blk.0.ssm_f_b.weight"].ggml_type.name == "Q8_0"  # as in unsloth's files


def test_inspect_reports_896_experts_top16_and_the_byte_split(k3):
    r = run("inspect", str(k3), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["arch"], info["layers"], info["experts"], info["top_k"]) == ("kimi-k3", 93, 896, 16)
    assert info["routed_expert_bytes"] > 10 * info["trunk_bytes"] > 0
    assert info["routed_expert_bytes"] + info["trunk_bytes"] == pytest.approx(k3.stat().st_size, rel=1e-3)


def test_plan_for_the_real_k3_fits_in_92g_from_the_header_alone(k3):
    r = run("plan", str(k3), "--budget", "92G", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["n_experts_total"] == 92 * 896 and p["min_slots"] == 16
    assert p["cache_slots"] >= 16 and p["total_bytes"] <= p["budget_bytes"]
    assert p["kv_bytes"] > 0  # MLA latent for ctx plus the KDA state


def test_a_too_small_budget_is_refused_with_every_term(k3):
    r = run("plan", str(k3), "--budget", "20G")
    assert r.returncode == 2
    assert "could not fit the model in a budget of" in r.stderr and "trunk" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--tensor-type", "ffn_down_exps"], "could not read --tensor-type 'ffn_down_exps': expected REGEX=TYPE"),
    (["--tensor-type", "_exps=TQ1_0"], "could not make a model with --tensor-type _exps=TQ1_0: supported types"),
    (["--tensor-type", "_exps=NOPE", "--sparse"], "could not make a model with --tensor-type _exps=NOPE"),
])
def test_bad_tensor_types_are_clear_errors_and_write_nothing(tmp_path, args, message):
    out = tmp_path / "bad.gguf"
    r = run("make-model", str(out), "--arch", "kimi-k3", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not out.exists()
