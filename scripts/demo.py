"""The README's first command: run sparkd on a built-in default and show what it does.

Two `engine: embedded` services under a demo policy (systemd placement where PID 1 is systemd,
cgroupfs otherwise): Gemma 3 270M Q4_K_M assembled from its PyPI wheels (real text), and a
generated MoE model about three times larger than its memory budget, whose routed experts are
streamed from disk through a small cache. Each gets a chat completion through the openai client;
then the memory plans, a metrics summary and `sparkctl status`. Everything it started is stopped
on success, failure and Ctrl-C. `--skip-gemma` leaves out the real model (quicker; the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sparkd.engine.bundled import DEFAULT_CACHE, assemble_gemma3  # noqa: E402

READY_TIMEOUT_SECONDS = 60
LOAD_TIMEOUT_SECONDS = 600
SLICE = "sparkd-demo.slice"
# ~1.7 GiB of Q4_K experts (8 layers x 128 experts, top-4): three times the 560M budget below
MOE_SHAPE = ["--arch", "qwen3moe", "--layers", "8", "--experts", "128", "--top-k", "4", "--hidden", "1024",
             "--ffn", "1024", "--vocab", "8192", "--heads", "8", "--ctx", "1024", "--quant", "Q4_K"]
MOE_FILE = "demo-qwen3moe-1.7g-q4_k.gguf"
# name -> (memory_max, ctx); the engine's budget is memory_max less an eighth (sparkd/specs.py)
# The budget's fixed part is mostly the interpreter and torch (~250-320 MiB of RSS, measured).
SERVICES = {"gemma": ("2G", 512), "moe": ("640M", 256)}
# This GGUF is the base (pretrained) model and carries no chat template: the demo's template passes
# the user's text through, so the answer is the model's continuation of it.
GEMMA_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*argv: str, check: bool = True) -> int:
    print("$ " + " ".join(argv).replace(sys.executable + " -m sparkd.cli.", ""), flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(argv, env=env, check=check).returncode


def sparkctl(sock: Path, *args: str, check: bool = True) -> int:
    return run(sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), *args, check=check)


def engine_executable(work: Path) -> str:
    """The venv's console script, or (checkout without an install) a wrapper running this tree."""
    script = Path(sys.executable).parent / "sparkd-engine"
    if script.exists():
        return str(script)
    wrapper = work / "sparkd-engine"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m sparkd.engine.cli "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def models(cache: Path, skip_gemma: bool) -> dict[str, Path]:
    found = {} if skip_gemma else {"gemma": assemble_gemma3(cache)}
    cache.mkdir(parents=True, exist_ok=True)
    moe = cache / MOE_FILE
    if not moe.exists():
        run(sys.executable, "-m", "sparkd.engine.cli", "make-model", str(moe), *MOE_SHAPE, "--seed", "1")
    return found | {"moe": moe}


def write_policy(work: Path, paths: dict[str, Path], ports: dict[str, int]) -> Path:
    (work / "gemma.jinja").write_text(GEMMA_TEMPLATE)
    extra = {"gemma": f", extra_args: [--chat-template-file, {work}/gemma.jinja]"}
    services = "".join(f"""\
  {name}:
    engine:
      embedded: {{model: {paths[name]}, listen: "127.0.0.1:{ports[name]}", ctx: {SERVICES[name][1]}, alias: {name}{extra.get(name, "")}}}
    memory_max: {SERVICES[name][0]}
    swap_max: 0
    oom_policy: stop
    stop_timeout: 20s
""" for name in paths)
    policy = work / "policy.yaml"
    policy.write_text(f"""\
daemon:
  placement: auto
  slice: {SLICE}
  state_dir: {work}/state
  control_socket: {work}/control.sock
  metrics_listen: 127.0.0.1:{free_port()}
  engine_executable: {engine_executable(work)}
  stop_services_on_exit: true
services:
{services}guards:
  reserve: 1G
  competitors: []
""")
    return policy


def wait_ready(sock: Path, daemon: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"sparkd exited with {daemon.returncode}:\n{log.read_text()}")
        probe = subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), "status",
                                "--json"], capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if probe.returncode == 0:
            return
        time.sleep(0.3)
    raise SystemExit(f"sparkd did not answer within {READY_TIMEOUT_SECONDS} s:\n{log.read_text()}")


def service_state(sock: Path, name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), "status", "--json"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    services = json.loads(out.stdout)["services"] if out.returncode == 0 else []
    return next((s for s in services if s["name"] == name), {})


def wait_engine(name: str, port: int, sock: Path, work: Path) -> None:
    deadline, last = time.monotonic() + LOAD_TIMEOUT_SECONDS, ""
    while time.monotonic() < deadline:
        state = service_state(sock, name)
        if state.get("state") in ("failed", "inactive"):  # the engine exited: say why, do not wait
            engine_log = work / "state" / "cgroupfs" / f"{name}.log"
            tail = engine_log.read_text()[-2000:] if engine_log.exists() else "(see the journal)"
            raise SystemExit(f"{name} ended before it was ready ({state.get('last_result')}):\n{tail}")
        try:
            body = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
            if body["status"] == "ready":
                return
            if body["status"] == "error":
                raise SystemExit(f"{name} failed to load: {body.get('error')}")
            last = f"{body['status']} {100 * body.get('progress', 0):.0f}%"
        except httpx.TransportError:
            last = "not listening yet"
        time.sleep(1)
    raise SystemExit(f"{name} was not ready within {LOAD_TIMEOUT_SECONDS} s ({last})")


def chat(name: str, port: int, prompt: str, max_tokens: int) -> None:
    # no retries: a retry restarts the generation from zero, and a slow (loaded) machine is not a
    # failure; half an hour is the limit for a streamed model on a busy CI box
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=1800)
    t0 = time.monotonic()
    reply = client.chat.completions.create(model=name, max_tokens=max_tokens, temperature=0,
                                           messages=[{"role": "user", "content": prompt}])
    print(f"user: {prompt}\n{name}: {reply.choices[0].message.content!r}\n"
          f"({reply.usage.completion_tokens} tokens in {time.monotonic() - t0:.1f} s)")


def metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + "".join(f"[{v}]" for v in s.labels.values())] = s.value
    return out


def summarise(name: str, m: dict[str, float]) -> None:
    mib = lambda key: f"{m.get(key, 0) / 2**20:.0f} MiB"  # noqa: E731
    print(f"{name}: plan trunk {mib('sparkd_engine_memory_plan_bytes[trunk]')}, KV {mib('sparkd_engine_memory_plan_bytes[kv]')}, "
          f"expert cache {mib('sparkd_engine_memory_plan_bytes[expert_cache]')} of budget {mib('sparkd_engine_memory_plan_bytes[budget]')}")
    print(f"  tokens: {m.get('sparkd_engine_prompt_tokens_total', 0):.0f} prompt, "
          f"{m.get('sparkd_engine_generated_tokens_total', 0):.0f} generated, "
          f"decode {m.get('sparkd_engine_decode_tokens_per_second', 0):.2f} tok/s")
    if "sparkd_engine_cache_requests_total" in m:
        req, hits = m["sparkd_engine_cache_requests_total"], m["sparkd_engine_cache_hits_total"]
        print(f"  expert cache: {hits:.0f}/{req:.0f} hits ({hits / max(req, 1):.1%}), retention "
              f"{m['sparkd_engine_cache_retention_ratio']:.1%}, {mib('sparkd_engine_read_bytes_total')} "
              f"read from disk at {m['sparkd_engine_read_bandwidth_bytes_per_second'] / 1e6:.0f} MB/s")


def demo(work: Path, paths: dict[str, Path], max_tokens: int) -> None:
    ports = {name: free_port() for name in paths}
    policy = write_policy(work, paths, ports)
    sock, log = work / "control.sock", work / "sparkd.log"
    step(f"policy {policy}")
    run(sys.executable, "-m", "sparkd.cli.daemon", "check-policy", str(policy))
    step(f"starting sparkd (log: {log})")
    with open(log, "ab") as out:  # own session: a Ctrl-C reaches the demo, which stops sparkd in order
        daemon = subprocess.Popen([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(policy), "run"],
                                  stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_ready(sock, daemon, log)
        print("".join(line for line in log.read_text().splitlines(True) if "placement" in line or "enforce" in line))
        prompts = {"gemma": "A GPU server shared by several services needs memory limits because", "moe": "Hello!"}
        for name in paths:
            step(f"start {name} (guards, then its own cgroup) and send it a chat completion")
            sparkctl(sock, "start", name)
            wait_engine(name, ports[name], sock, work)
            if name == "moe":
                print("(random weights: the text is noise; what matters is the expert cache below)")
            chat(name, ports[name], prompts[name], max_tokens)
        step("memory plans (the streamed engine's own, from its log; the resident ones are in the metrics)")
        engine_log = work / "state" / "cgroupfs" / "moe.log"  # under systemd the plan is in the journal
        if engine_log.exists():
            print("".join(engine_log.read_text().partition("memory plan:")[1:]).split("sparkd-engine:")[0])
        else:
            run(str(engine_executable(work)), "plan", str(paths["moe"]), "--budget", "560M", "--ctx", "256")
        step("metrics (each engine's /metrics)")
        for name in paths:
            summarise(name, metrics(ports[name]))
        step("status")
        sparkctl(sock, "status")
    finally:
        step("stopping everything the demo started")
        for name in paths:
            sparkctl(sock, "stop", name, check=False)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        slice_dir = Path("/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup") / SLICE
        if slice_dir.is_dir():
            slice_dir.rmdir()  # empty once the services stopped; an error here means something is left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-gemma", action="store_true", help="only the generated MoE model")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where models are kept")
    parser.add_argument("--max-tokens", type=int, default=24)
    a = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the demo places services in cgroups and needs root: run it with sudo")
    # a kill runs the same cleanup as Ctrl-C (sparkd is in its own session, so Ctrl-C reaches only us)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="sparkd-demo-"))
    step(f"models (cached in {a.cache})")
    paths = models(a.cache, a.skip_gemma)
    demo(work, paths, a.max_tokens)
    step("next steps")
    print(f"""  - your own GGUF: copy {work}/policy.yaml, set services.*.engine.embedded.model (and memory_max:
    experts that do not fit the budget are streamed from disk); any other engine: engine.command
  - production policies: {ROOT}/policies/dgx-spark.yaml, {ROOT}/policies/generic.yaml; check one with
    sparkd check-policy FILE
  - as a service: install the .deb (docs/packaging.md) or run sparkd --policy /etc/sparkd/policy.yaml,
    then sparkctl status | start NAME | stop NAME | events | top""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
