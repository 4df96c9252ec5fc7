"""`sparkd-engine` run as a user runs it (python -m sparkd.engine.cli in a subprocess) for the
engine tests: the checkout first on PYTHONPATH, the caller's entries kept (on the GPU box gguf and
friends come from a --target dir)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_engine(*args: str, timeout: float = 300, extra_env: dict | None = None,
               **kw) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "sparkd.engine.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False, **kw)


def tiny_model(path, layers: int, seed: int):
    """A tiny qwen3moe Q8_0 GGUF at path, written by `sparkd-engine make-model` (the vocabulary: 512)."""
    r = run_engine("make-model", "--arch", "qwen3moe", "--quant", "Q8_0", "--layers", str(layers), "--seed",
                   str(seed), str(path))
    assert r.returncode == 0, r.stderr
    return path
