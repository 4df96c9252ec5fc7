"""sparkctl top against a real sparkd (cgroupfs placement on the real cgroup2 tree, as in
tests/test_daemon_cgroupfs.py): --once frames, the live view in a real pseudo-terminal of 80x24
(fits, refreshes in place, q quits and restores the terminal), and an unreachable sparkd."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

import pytest
import yaml
from sparkd_harness import CGROUP2, Sparkd, python_env, remove_cgroup_tree, sparkctl

pytestmark = pytest.mark.root
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
# Waiting for the terminal to show something: a wedged machine fails, a slow one does not.
SCREEN_TIMEOUT_SECONDS = 60




@pytest.fixture
def live(tmp_path):
    """A running sparkd with one started service (sleeper) and one inactive (idle)."""
    cgroup_root = CGROUP2 / f"sparkd-test-top-{os.getpid()}-{time.monotonic_ns()}"
    cgroup_root.mkdir()
    run_dir = Path(tempfile.mkdtemp(prefix="sparkd-top-", dir="/tmp"))
    sock = run_dir / "control.sock"
    policy = {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(cgroup_root), "state_dir": str(tmp_path / "state"),
                   "control_socket": str(sock)},
        "guards": {"reserve": "64M", "competitors": []},
        "services": {"sleeper": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "256M", "stop_timeout": "5s"},
                     "idle": {"engine": {"command": ["sleep", "10000"]}, "memory_max": "1G"}},
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    daemon = Sparkd(tmp_path / "policy.yaml", sock, tmp_path / "sparkd.log")
    try:
        daemon.start()
        started = sparkctl(sock, "start", "sleeper")
        assert started.returncode == 0, started.stderr
        yield sock
    finally:
        daemon.ensure_dead()
        remove_cgroup_tree(cgroup_root)
        shutil.rmtree(run_dir, ignore_errors=True)


def top_once(sock: Path, columns: int = 80, lines: int = 24):
    import subprocess

    return subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), "top", "--once"],
                          env=python_env(COLUMNS=str(columns), LINES=str(lines)), capture_output=True, text=True, timeout=60)


def test_once_prints_one_frame_of_the_live_status(live):
    out = top_once(live)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sparkd pid ") and "cgroupfs" in lines[0]
    assert re.search(r"MemAvailable \S+ of \S+ · reserve 64\.0M · above reserve", out.stdout)
    assert "memory limits NOT enforced" in out.stdout
    sleeper = next(line for line in lines if line.startswith("sleeper"))
    idle = next(line for line in lines if line.startswith("idle"))
    assert "active" in sleeper and "/256.0M" in sleeper
    assert re.search(r"\d+\.\d/\d+\.\d", sleeper)  # PSI avg10 some/full from memory.pressure
    assert "inactive" in idle and "/1.0G" in idle
    assert sleeper.split()[-4:] == ["–"] * 4  # tok/s, queue, cache, disk: not an embedded engine
    assert "last events" in lines  # from GET /v1/events (the engine columns: tests/ops/test_bench.py)
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 24


def test_once_against_no_sparkd_fails_clearly(tmp_path):
    out = top_once(tmp_path / "absent.sock")
    assert out.returncode == 1
    assert f"sparkctl top: could not connect to sparkd at {tmp_path / 'absent.sock'}" in out.stderr
    assert "is sparkd running?" in out.stderr


def test_live_view_without_a_terminal_points_to_once(live):
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(live), "top"],
                         env=python_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "needs a terminal; use --once" in out.stderr


class Terminal:
    """A real pseudo-terminal of 80x24 running one command; collects everything it draws."""

    def __init__(self, argv: list[str], env: dict):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(argv[0], argv, {**env, "TERM": "xterm-256color"})
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.output = b""

    def read_until(self, predicate) -> None:
        deadline = time.monotonic() + SCREEN_TIMEOUT_SECONDS
        while not predicate(self.output):
            assert time.monotonic() < deadline, f"terminal never showed it:\n{self.output[-2000:]!r}"
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    return

    def wait(self) -> int:
        deadline = time.monotonic() + SCREEN_TIMEOUT_SECONDS
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                self._drain()
                return os.waitstatus_to_exitcode(status)
            assert time.monotonic() < deadline, "top did not exit after q"
            self.read_until(lambda out: True)
            time.sleep(0.05)

    def _drain(self) -> None:
        """What the child wrote before it exited (its last bytes: leaving the alternate screen)."""
        while select.select([self.fd], [], [], 0.1)[0]:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def close(self) -> None:
        if self.pid is not None:  # still running: the test failed before q worked
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def frames(output: bytes) -> list[list[str]]:
    """Each full redraw (cursor home) as its visible lines."""
    screens = []
    for chunk in output.split(b"\x1b[H")[1:]:
        text = ANSI.sub(b"", chunk).decode(errors="replace")
        if text.strip():
            screens.append(text.split("\r\n"))
    return screens


def test_live_view_in_a_pty_fits_80x24_refreshes_and_q_quits(live):
    argv = [sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(live), "top", "--interval", "0.2"]
    term = Terminal(argv, python_env())
    try:
        term.read_until(lambda out: len(frames(out)) >= 3 and b"sleeper" in out)
        os.write(term.fd, b"q")
        assert term.wait() == 0
    finally:
        term.close()
    assert term.output.startswith(b"\x1b[?1049h")  # alternate screen: the shell's screen comes back
    assert b"\x1b[?1049l" in term.output  # ...and it did
    shown = frames(term.output)
    assert len(shown) >= 3  # redrawn in place, several times
    for screen in shown:
        assert len(screen) <= 24 and all(len(line) <= 80 for line in screen)
    first = shown[0]
    assert first[0].startswith("sparkd pid ")
    assert any(line.startswith("sleeper") and "active" in line for line in first)
    assert any("q quit · every 0.2 s" in line for line in first)
