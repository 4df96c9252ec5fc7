"""The README's first command, main flow: scripts/demo.py --skip-gemma (the generated MoE model
streamed under a real sparkd, chat through openai, plans, metrics, status, cleanup)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.root
def test_demo_streams_the_moe_model_and_leaves_nothing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--skip-gemma", "--max-tokens", "4",
                           "--cache", str(tmp_path)], capture_output=True, text=True, timeout=500,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "expert cache:" in out and "read from disk" in out, out[-3000:]
    assert "memory plan" in out and "moe stopped" in out
    assert not any(Path(root, "sparkd-demo.slice").exists() for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"))
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert not left.strip(), f"engine processes left: {left}"
