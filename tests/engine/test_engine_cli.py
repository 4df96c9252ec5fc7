"""sparkd-engine as a real subprocess: make-model, inspect, logits, and clear errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from engine_cli import run_engine, tiny_model


run = run_engine


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("cli") / "m.gguf", layers=3, seed=1)


def test_inspect_json(model):
    r = run("inspect", str(model), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["arch"], info["layers"], info["experts"], info["top_k"]) == ("qwen3moe", 3, 8, 2)
    assert info["quant_types"]["routed_experts"] == ["Q8_0"]
    assert info["quant_types"]["attn_norm"] == ["F32"]
    assert info["per_expert_bytes"] * 8 * 3 == info["routed_expert_bytes"]
    assert info["trunk_bytes"] > 0


def test_logits_writes_npy(model, tmp_path):
    out = tmp_path / "l.npy"
    r = run("logits", str(model), "--tokens", "1,2,3,4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    a = np.load(out)
    assert a.shape == (4, 512) and np.isfinite(a).all()


def test_generate_json(model):
    r = run("generate", str(model), "--tokens", "1 2 3", "-n", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 4


@pytest.mark.parametrize("mode", [["--resident"], ["--budget", "2G"]], ids=["resident", "streamed"])
def test_cpu_engine_runs_without_triton(model, mode):
    """The CPU engine must not need Triton (the .deb's engine venv has torch only): block its import."""
    code = ("import sys, runpy; sys.modules['triton'] = None; "
            "sys.argv = ['sparkd-engine', *sys.argv[1:]]; runpy.run_module('sparkd.engine.cli', run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    r = subprocess.run([sys.executable, "-c", code, "generate", str(model), "--tokens", "1 2 3", "-n", "3",
                        "--json", *mode], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 3


@pytest.mark.parametrize("args,msg", [
    (["make-model", "--arch", "nope", "X.gguf"], "could not make a model for --arch 'nope'"),
    (["make-model", "--arch", "qwen3moe", "--top-k", "20", "X.gguf"], "--top-k 20 exceeds --experts 8"),
    (["make-model", "--preset", "nope", "X.gguf"], "could not find preset 'nope'"),
    (["make-model", "--arch", "qwen3moe", "--quant", "TQ1_0", "X.gguf"], "--quant TQ1_0"),
    (["logits", "M", "--tokens", "a,b", "--out", "o.npy"], "could not parse --tokens"),
    (["make-model", "--arch", "qwen3moe", "no-such-dir/X.gguf"], "does not exist (create it first)"),
])
def test_bad_inputs_fail_clearly_and_write_nothing(tmp_path, args, msg):
    args = [str(tmp_path / a) if a in ("X.gguf", "M", "no-such-dir/X.gguf") else a for a in args]
    r = run(*args)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_not_overwritten(model):
    before = model.read_bytes()
    r = run("make-model", "--arch", "qwen3moe", str(model))
    assert r.returncode == 2 and "the file exists" in r.stderr
    assert model.read_bytes() == before


def test_unsupported_architecture_names_the_supported(tmp_path):
    from gguf import GGUFWriter
    path = tmp_path / "x.gguf"
    w = GGUFWriter(path, "mamba")
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_ti_data_to_file(); w.close()
    r = run("inspect", str(path))
    assert r.returncode == 2 and "'mamba' is not supported" in r.stderr and "qwen3moe" in r.stderr


def test_generate_text_with_chat_template_and_seeded_sampling(model):
    args = ("generate", str(model), "-p", "Hello", "--chat", "-n", "6", "--temp", "0.9", "--seed", "3", "--json")
    a, b = run(*args), run(*args)
    assert a.returncode == 0, a.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["tokens"] == rb["tokens"] and ra["prompt_tokens"] > 3
    assert isinstance(ra["text"], str) and ra["decode_tok_s"] > 0


def test_the_cli_parses_its_flags_without_importing_torch():
    """`sparkd-engine --help` and a bad flag answer at once: the parser's modules leave torch (seconds to
    import) to the command that runs."""
    code = "import sys, sparkd.engine.cli; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
