"""Run a real `sparkd-engine serve` process on a tiny generated model, for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
# Loading a tiny model takes ~2 s (mostly importing torch); a minute only trips on a wedged machine.
READY_TIMEOUT_SECONDS = 60.0
API_KEY = "test-key-1"
# The default template with the generation prompt opening a reasoning block (like DeepSeek-R1's).
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def make_tiny_model(path: Path, arch: str = "qwen3moe", seed: int = 0) -> Path:
    from sparkd.engine import make_model as mm
    from sparkd.engine.modelgen.specs import TINY

    mm.write_model(path, mm.plan(TINY[arch], "Q8_0"), seed=seed)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


class EngineProcess:
    def __init__(self, model: Path, *args: str, log: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "sparkd.engine.cli", "serve", str(model),
                     "--listen", f"127.0.0.1:{self.port}", "--threads", "1", *args]
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "EngineProcess":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=python_env(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).json()["status"] == "ready":
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not ready after {READY_TIMEOUT_SECONDS} s:\n{self.log.read_text()}")
            time.sleep(0.1)

    def health(self) -> dict:
        return httpx.get(self.base + "/health", timeout=10).json()

    def metrics(self) -> str:
        return httpx.get(self.base + "/metrics", timeout=10).text

    def client(self, api_key: str = API_KEY):
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def stop(self) -> int:
        """SIGTERM; returns 0 for a clean exit. uvicorn re-raises the signal after its graceful
        shutdown, so a clean exit shows as -SIGTERM (systemd counts it as success too)."""
        code = self._stop()
        return 0 if code == -signal.SIGTERM else code

    def _stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def metric_value(text: str, name: str, labels: str = "") -> float:
    """A sample's value from Prometheus text, 0 when absent."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.split(" ")[0] == want:
            return float(line.split(" ")[1])
    return 0.0
