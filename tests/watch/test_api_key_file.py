"""engine.embedded.api_key_file: checked when the policy loads (the file and the key named), passed
to the engine as --api-key-file (never the key on argv), and read by the watchers when they act."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest

from sparkd.errors import PolicyError
from sparkd.policy import parse_policy
from sparkd.specs import engine_argv
from sparkd.watch import SupervisorControl
from sparkd.watch.actions.shrink_cache import ShrinkCache

GIB = 1 << 30


def _policy(tmp_path, **embedded):
    data = {"services": {"llm": {"memory_max": "2G", "engine": {"embedded": {"model": str(tmp_path / "m.gguf"),
                                                                             **embedded}}}}}
    return parse_policy(data, source="policy.yaml", total_memory_bytes=64 * GIB)


def test_key_file_goes_on_argv_and_the_key_does_not(tmp_path):
    key = tmp_path / "key"
    key.write_text("k-123\n")
    argv = engine_argv(_policy(tmp_path, api_key_file=str(key)).services["llm"])
    assert argv[argv.index("--api-key-file") + 1] == str(key)
    assert not any("k-123" in a for a in argv)
    assert "--api-key-file" not in engine_argv(_policy(tmp_path).services["llm"])


@pytest.mark.parametrize("setup, extra, message", [
    (None, [], "could not read API key file {key}: No such file or directory"),
    ("", [], "could not use API key file {key}: the file is empty"),
    ("k", ["--api-key", "other"], "api_key_file and --api-key in extra_args both set the API key"),
    ("k", ["--api-key-file=/x"], "api_key_file and --api-key-file in extra_args both set the API key"),
])
def test_bad_key_file_is_named(tmp_path, setup, extra, message):
    key = tmp_path / "key"
    if setup is not None:
        key.write_text(setup)
    with pytest.raises(PolicyError) as err:
        _policy(tmp_path, api_key_file=str(key), extra_args=extra)
    text = str(err.value)
    assert "could not load policy policy.yaml" in text and "services.llm.engine.embedded" in text
    assert message.format(key=key) in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_key_file_is_named(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    key.chmod(0)
    with pytest.raises(PolicyError, match=f"api_key_file: could not read API key file {key}: Permission denied"):
        _policy(tmp_path, api_key_file=str(key))


def test_key_file_gone_when_acting_is_a_failed_action(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    policy = _policy(tmp_path, api_key_file=str(key), listen="127.0.0.1:9")
    key.unlink()
    rule = SimpleNamespace(budget=GIB)
    result = asyncio.run(ShrinkCache(SupervisorControl(SimpleNamespace(policy=policy))).apply("llm", rule, "", False))
    assert result == (f"failed: could not read API key file {key}: No such file or directory; create it (readable "
                      "by sparkd and the engine) or remove the key (services.llm.engine.embedded.api_key_file)")
