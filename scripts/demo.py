"""The README's first command: run sparkd on a built-in default and show what it does.

Starts a real sparkd (systemd placement where PID 1 is systemd, cgroupfs otherwise) with a demo
policy, runs the guards, starts a service confined to its own cgroup, talks to it, shows
`sparkctl status`, then stops everything it started. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_SECONDS = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def sparkctl(sock: Path, *args: str) -> int:
    print(f"$ sparkctl {' '.join(args)}", flush=True)
    return subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), *args]).returncode


def write_policy(work: Path, port: int) -> Path:
    policy = work / "policy.yaml"
    policy.write_text(f"""\
daemon:
  placement: auto
  state_dir: {work}/state
  control_socket: {work}/control.sock
  metrics_listen: 127.0.0.1:{free_port()}
services:
  demo-web:
    # Any external engine runs the same way (llama-server, vLLM); this one is a tiny web server.
    engine:
      command: [{sys.executable}, -m, http.server, --bind, 127.0.0.1, "{port}"]
    memory_max: 256M
    swap_max: 0
    oom_policy: stop
    restart: "no"
    stop_timeout: 10s
guards:
  reserve: 1G
  competitors: []
""")
    return policy


def wait_ready(sock: Path, daemon: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            sys.exit(f"sparkd exited with {daemon.returncode}:\n{log.read_text()}")
        if sock.exists():
            probe = subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), "status", "--json"],
                                   capture_output=True)
            if probe.returncode == 0:
                return
        time.sleep(0.2)
    sys.exit(f"sparkd did not answer within {READY_TIMEOUT_SECONDS} s:\n{log.read_text()}")


def main() -> int:
    if os.geteuid() != 0:
        sys.exit("the demo places services in cgroups and needs root: run it with sudo")
    work = Path(tempfile.mkdtemp(prefix="sparkd-demo-"))
    port = free_port()
    policy = write_policy(work, port)
    sock, log = work / "control.sock", work / "sparkd.log"

    step(f"policy {policy}")
    subprocess.run([sys.executable, "-m", "sparkd.cli.daemon", "check-policy", str(policy)], check=True)

    step("starting sparkd (logs: %s)" % log)
    with open(log, "ab") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(policy), "run"],
                                  stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        wait_ready(sock, daemon, log)
        step("guards before a start")
        sparkctl(sock, "preflight", "demo-web")
        step("start the service in its own cgroup")
        if sparkctl(sock, "start", "demo-web") != 0:
            return 1
        step("talk to it")
        for _ in range(50):
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                print(f"GET http://127.0.0.1:{port}/ -> {reply.status_code}, {len(reply.content)} bytes")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        step("status")
        sparkctl(sock, "status")
        step("stop it")
        sparkctl(sock, "stop", "demo-web")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    step("next steps")
    print(f"""  - your own engine: copy {policy} and point services.*.engine.command at it
  - production policies: {ROOT}/policies/dgx-spark.yaml, {ROOT}/policies/generic.yaml
  - run sparkd as a service: sparkd --policy /etc/sparkd/policy.yaml, then sparkctl status""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
