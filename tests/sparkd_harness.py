"""Run a real `sparkd` process and `sparkctl` commands against it, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The host's cgroup2 tree: pure v2, or the unified part of a hybrid v1/v2 host (CI).
CGROUP2 = Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else Path("/sys/fs/cgroup/unified")
# Start-up is a policy load, an adopt and a socket bind; a minute only trips on a wedged machine.
READY_TIMEOUT_SECONDS = 60.0


def python_env(**extra: str) -> dict[str, str]:
    # Keep an existing PYTHONPATH (the GPU box carries dependencies as wheels in one).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


class Sparkd:
    """One sparkd process; `prefix` runs it elsewhere (e.g. nsenter into a systemd box)."""

    def __init__(self, policy: Path, socket: Path, log: Path, prefix: list[str] | None = None):
        self.policy, self.socket, self.log = policy, socket, log
        self.prefix = prefix or []
        self.proc: subprocess.Popen | None = None
        self._offset = 0

    def start(self) -> "Sparkd":
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        argv = [*self.prefix, sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(self.policy), "run"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=python_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while "event=ready" not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"sparkd exited {self.proc.returncode} before ready:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"sparkd not ready after {READY_TIMEOUT_SECONDS} s:\n{self.log_text()}")
            time.sleep(0.05)
        return self

    def log_text(self) -> str:
        """What this run of sparkd logged (the file is shared by successive runs)."""
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")

    def pid(self) -> int:
        """sparkd's own pid: with a prefix (nsenter forks), the prefix process's child."""
        if not self.prefix:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert children, f"sparkd is not running under {self.prefix[0]} (pid {self.proc.pid})"
        return int(children[0])

    def signal(self, sig: int) -> int:
        """Signal sparkd itself and return its exit status (nsenter passes it on)."""
        os.kill(self.pid(), sig)
        return self.proc.wait(timeout=READY_TIMEOUT_SECONDS)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()


def sparkctl(socket: Path, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    argv = [*(prefix or []), sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(socket), *args]
    return subprocess.run(argv, env=python_env(COLUMNS="200"), capture_output=True, text=True, timeout=300)


def status_json(socket: Path, prefix: list[str] | None = None) -> dict:
    out = sparkctl(socket, "status", "--json", prefix=prefix)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def service(status: dict, name: str) -> dict:
    return next(s for s in status["services"] if s["name"] == name)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remove_cgroup_tree(root: Path, timeout_seconds: float = 10.0) -> None:
    """Kill everything under a test cgroup root and remove its directories, deepest first."""
    if not root.exists():
        return
    (root / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout_seconds
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [root]:
        while d.exists():
            try:
                d.rmdir()
            except OSError:
                assert time.monotonic() < deadline, f"could not remove {d}"
                time.sleep(0.05)
