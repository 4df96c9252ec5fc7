"""End to end: sparkd under a real systemd (booted in throwaway namespaces) starts an
`engine: embedded` service, i.e. `sparkd-engine serve` on a generated tiny model inside its unit
with the budget from memory_max; the openai client gets a completion through it and
`sparkctl status` shows the engine ready with its decode speed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkd_harness import ROOT, Sparkd, service, sparkctl, status_json

pytestmark = [pytest.mark.systemd, pytest.mark.root, pytest.mark.slow]
# The engine imports torch and loads the model inside the unit; a minute only trips on a wedged box.
READY_TIMEOUT_SECONDS = 60.0


def _engine_script(share: Path) -> Path:
    """The box sees / as it was at boot (the venv and the checkout were there); files written
    now must live in the share dir, so the launcher goes there."""
    script = share / "sparkd-engine"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m sparkd.engine.cli \"$@\"\n")
    script.chmod(0o755)
    return script


def test_embedded_engine_under_systemd(systemd_box):
    sys.path.insert(0, str(ROOT / "tests" / "engine" / "server"))
    from engine_server import free_port, make_tiny_model

    share = systemd_box.share_dir
    model = make_tiny_model(share / "tiny.gguf")
    port = free_port()
    policy = {
        "daemon": {"placement": "auto", "state_dir": str(share / "state"),
                   "control_socket": str(share / "run" / "control.sock"),
                   "engine_executable": str(_engine_script(share))},
        "guards": {"reserve": "64M"},
        "services": {"tiny": {
            "engine": {"embedded": {"model": str(model), "listen": f"127.0.0.1:{port}", "alias": "tiny",
                                    "ctx": 64, "extra_args": ["--threads", "1"]}},
            "memory_max": "1G", "stop_timeout": "10s"}},
    }
    (share / "policy.yaml").write_text(yaml.safe_dump(policy))
    prefix = ["nsenter", "-t", str(systemd_box.init_pid()), "-m", "-p", "-C", "--"]
    sock = share / "run" / "control.sock"
    d = Sparkd(share / "policy.yaml", sock, share / "sparkd.log", prefix=prefix).start()
    try:
        out = sparkctl(sock, "start", "tiny", prefix=prefix)
        assert out.returncode == 0, out.stdout + out.stderr
        argv = systemd_box.run(["systemctl", "show", "sparkd-tiny.service", "-p", "ExecStart"]).stdout
        assert "serve" in argv and "--budget 896M" in argv, argv  # 1G less an eighth
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while (engine := service(status_json(sock, prefix), "tiny")["engine"])["health"] != "ready":
            assert engine["health"] in ("loading", "unreachable"), engine
            assert time.monotonic() < deadline, (engine, systemd_box.run(["journalctl", "-u", "sparkd-tiny"]).stdout)
            time.sleep(0.2)

        import openai
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=5, temperature=0)
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"

        st = service(status_json(sock, prefix), "tiny")
        assert st["state"] == "active" and st["engine"]["health"] == "ready"
        assert st["engine"]["generated_tokens"] == 5 and st["engine"]["decode_tok_s"] > 0
        text = sparkctl(sock, "status", prefix=prefix).stdout
        assert "tiny: engine ready," in text and "tok/s" in text, text
        assert sparkctl(sock, "stop", "tiny", prefix=prefix).returncode == 0
        assert service(status_json(sock, prefix), "tiny")["engine"] is None
    finally:
        d.ensure_dead()
