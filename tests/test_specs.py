from sparkd.policy import parse_policy
from sparkd.specs import build_spec, engine_budget_bytes


def _policy(services):
    return parse_policy({"services": services}, source="test", total_memory_bytes=64 << 30)


def test_embedded_engine_argv_with_budget_below_memory_max():
    p = _policy({"llm": {"engine": {"embedded": {"model": "/m/k3.gguf", "listen": "127.0.0.1:8000", "ctx": 4096,
                                                  "extra_args": ["--threads", "8"]}},
                         "memory_max": "92G"}})
    spec = build_spec("llm", p.services["llm"])
    assert spec.argv == ["sparkd-engine", "serve", "/m/k3.gguf", "--listen", "127.0.0.1:8000", "--budget", "92160M",
                         "--ctx", "4096", "--threads", "8"]
    assert (spec.memory_max_bytes, spec.memory_high_bytes) == (92 << 30, None)
    assert (spec.swap_max_bytes, spec.oom_policy, spec.restart) == (0, "stop", "no")


def test_budget_leaves_room_for_the_process():
    assert engine_budget_bytes(92 << 30) == 90 << 30
    assert engine_budget_bytes(512 << 20) == 448 << 20


def test_command_engine_and_options_pass_through():
    p = _policy({"ext": {"engine": {"command": ["/usr/bin/llama-server", "-m", "x.gguf"]}, "memory_max": "50%",
                         "memory_high": "30G",
                         "environment": {"A": "1"}, "working_directory": "/srv", "stop_timeout": "5s", "cpu_weight": 50}})
    spec = build_spec("ext", p.services["ext"])
    assert spec.argv == ["/usr/bin/llama-server", "-m", "x.gguf"]
    assert (spec.memory_max_bytes, spec.memory_high_bytes) == (32 << 30, 30 << 30)
    assert (spec.environment, spec.working_directory, spec.stop_timeout_seconds, spec.cpu_weight) == ({"A": "1"}, "/srv", 5.0, 50)
