"""schemathesis against the served OpenAPI schema: no generated input gets a 5xx, and status
codes and content types are the ones the schema declares. Bounded (-n, a small context) so it
runs in well under a minute."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine_server import API_KEY, EngineProcess, make_tiny_model

pytest.importorskip("schemathesis", reason="pip install schemathesis into the venv")
EXAMPLES_PER_OPERATION = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    model = make_tiny_model(d / "tiny.gguf")
    # A 48-position context bounds every generated request to a few dozen tokens.
    proc = EngineProcess(model, "--ctx", "48", "--api-key", API_KEY, log=d / "engine.log").start()
    yield proc
    assert proc.stop() == 0, (d / "engine.log").read_text()


def test_no_server_errors_on_generated_inputs(server, tmp_path):
    st = Path(sys.executable).with_name("st")
    argv = [str(st), "run", server.base + "/openapi.json", "--no-color", "--seed", "1",
            "-c", "not_a_server_error,status_code_conformance,content_type_conformance",
            "-n", str(EXAMPLES_PER_OPERATION), "-H", f"Authorization: Bearer {API_KEY}",
            "--generation-database", "none"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "7 selected / 7 total" in out.stdout and " passed" in out.stdout
