import os

from procs import reap, spawn_named, unique_name
from sparkd.system.procinfo import cgroup_unit, process_name, rss_bytes, unit_from_cgroup_text


def test_long_name_is_completed_from_argv0(tmp_path):
    name = unique_name("ollama-runner-test")  # longer than the kernel's 15-byte comm
    proc = spawn_named(tmp_path, name)
    try:
        assert process_name(proc.pid) == name
        assert rss_bytes(proc.pid) > 0
    finally:
        reap(proc)
    assert process_name(proc.pid) is None  # gone: None, not an error
    assert rss_bytes(proc.pid) is None


def test_unit_from_cgroup_texts():
    assert unit_from_cgroup_text("0::/system.slice/ollama.service\n") == "ollama.service"
    assert unit_from_cgroup_text("0::/sparkd.slice/sparkd-big.service\n") == "sparkd-big.service"
    hybrid = "12:memory:/user.slice\n1:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/\n"
    assert unit_from_cgroup_text(hybrid) == "session-3.scope"
    assert unit_from_cgroup_text("0::/process_api/bba9f641\n") is None  # container without systemd
    assert unit_from_cgroup_text("") is None


def test_own_cgroup_reads_without_error():
    text = open(f"/proc/{os.getpid()}/cgroup").read()
    assert cgroup_unit(os.getpid()) == unit_from_cgroup_text(text)
