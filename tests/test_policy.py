from pathlib import Path

import pytest

from sparkd.errors import PolicyError
from sparkd.policy import load_policy

GiB = 1 << 30


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


def test_defaults_from_empty_file(tmp_path):
    pol = load_policy(write(tmp_path, ""), total_memory_bytes=64 * GiB)
    assert pol.daemon.placement == "auto"
    assert pol.guards.reserve == 16 * GiB
    assert [(c.unit, c.action) for c in pol.guards.competitors] == [("ollama.service", "stop_and_disable")]


def test_sizes_and_percentages(tmp_path):
    pol = load_policy(
        write(tmp_path, "services:\n  a:\n    engine: {command: [sleep, '1']}\n    memory_max: 50%\n    swap_max: 512M\n"
                        "    memory_high: 30G\n  b:\n    engine: {command: [x]}\n    memory_max: 1G\n    memory_high: 1G\n"),
        total_memory_bytes=64 * GiB,
    )
    assert pol.services["a"].memory_max == 32 * GiB
    assert pol.services["a"].swap_max == 512 << 20
    assert (pol.services["a"].memory_high, pol.services["b"].memory_high) == (30 * GiB, GiB)  # equal is allowed


def test_unknown_keys_get_did_you_mean_and_name_file(tmp_path):
    p = write(tmp_path, "daemon:\n  placment: systemd\nservices:\n  a:\n    engine: {command: [x]}\n    memory_max: 1G\n    stop_timout: 3\n")
    with pytest.raises(PolicyError) as ei:
        load_policy(p, total_memory_bytes=64 * GiB)
    msg = str(ei.value)
    assert str(p) in msg
    assert "daemon.placment: unknown key (did you mean 'placement'?)" in msg
    assert "services.a.stop_timout: unknown key (did you mean 'stop_timeout'?)" in msg


@pytest.mark.parametrize(
    "text, expected",
    [
        ("services:\n  a:\n    engine: {command: [x]}\n    memory_max: 12Q\n", "services.a.memory_max: expected a size"),
        ("services:\n  a:\n    engine: {}\n    memory_max: 1G\n", "exactly one of 'embedded' or 'command'"),
        ("services:\n  llm:\n    engine: {command: [x]}\n    memory_max: 2G\n    memory_high: 50%\n",
         "services.llm.memory_high: memory_high 32.0G (34359738368 B) is above memory_max 2.0G (2147483648 B): "
         "the kernel throttles at memory_high before memory_max kills, so it must not be larger; lower "
         "memory_high or raise memory_max; found '50%'"),
        ("services:\n  a:\n    engine: {command: [x]}\n    memory_max: 1G\n    memory_high: 0\n",
         "services.a.memory_high: memory_high must be larger than 0"),
        ("services:\n  a:\n    engine: {command: [x]}\n    memory_max: 1G\n    memory_high: lots\n",
         "services.a.memory_high: expected a size"),
        ("daemon:\n  placement: docker\n", "daemon.placement"),
        ("services:\n  'bad name':\n    engine: {command: [x]}\n    memory_max: 1G\n", "must be letters"),
        ("services: [1, 2]\n", "services"),
        ("- just\n- a list\n", "expected a mapping at the top level"),
        ("daemon: {placement: [unclosed\n", "could not parse policy"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, text, expected):
    with pytest.raises(PolicyError, match="could not") as ei:
        load_policy(write(tmp_path, text), total_memory_bytes=64 * GiB)
    assert expected in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(PolicyError, match="could not read policy .*No such file"):
        load_policy(tmp_path / "nope.yaml", total_memory_bytes=GiB)


@pytest.mark.parametrize("name", ["dgx-spark.yaml", "generic.yaml"])
def test_shipped_policies_validate(name):
    path = Path(__file__).resolve().parent.parent / "policies" / name
    pol = load_policy(path, total_memory_bytes=121 * GiB)
    for svc in pol.services.values():
        assert (svc.swap_max, svc.oom_policy, svc.restart) == (0, "stop", "no")


def test_dgx_spark_is_the_field_setup():
    path = Path(__file__).resolve().parent.parent / "policies" / "dgx-spark.yaml"
    pol = load_policy(path, total_memory_bytes=121 * GiB)
    assert pol.services["kimi"].memory_max == 92 * GiB
    assert pol.guards.competitors[0].unit == "ollama.service"
