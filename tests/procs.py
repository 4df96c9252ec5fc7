"""Real processes with chosen names for the guard tests: a copy of /bin/sleep under a new name.

The named process runs under a small sh that records how it ended (128 + signal), because the
guard reaps what it signals when the process is its child, and then Popen could not tell
SIGTERM from SIGKILL. Names carry a random suffix so parallel test runs (and other helpers on
this machine) never match each other's processes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

# Generous bound for a fork + exec on a loaded 2-core CI machine; only a readiness wait.
START_WAIT_SECONDS = 10


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@dataclass
class Named:
    pid: int  # the named process
    shell: subprocess.Popen
    status_file: Path

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def ended_by(self) -> int | None:
        """The signal that ended the named process (waits for it), or None for a normal exit."""
        self.shell.wait(timeout=START_WAIT_SECONDS)
        code = int(self.status_file.read_text())
        return code - 128 if code > 128 else None


def spawn_named(tmp_path: Path, name: str, *, ignore_sigterm: bool = False) -> Named:
    """Start `name 600` where name is a copy of sleep; an ignored SIGTERM survives fork and exec."""
    exe, status = tmp_path / name, tmp_path / f"{name}.status"
    shutil.copy(shutil.which("sleep"), exe)

    def ignore_term():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    shell = subprocess.Popen(["sh", "-c", f'"{exe}" 600; echo $? > "{status}"'],
                             preexec_fn=ignore_term if ignore_sigterm else None,
                             stderr=subprocess.DEVNULL)  # sh would print "Terminated" for each eviction
    return Named(_wait_for_exec(shell, str(exe)), shell, status)


def _wait_for_exec(shell: subprocess.Popen, exe: str) -> int:
    deadline = time.monotonic() + START_WAIT_SECONDS
    while time.monotonic() < deadline:
        for child in psutil.Process(shell.pid).children():
            try:
                if child.cmdline()[:1] == [exe]:
                    return child.pid
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.01)
    shell.kill()
    shell.wait()
    raise RuntimeError(f"could not start {exe}: it did not exec within {START_WAIT_SECONDS} s")


def reap(proc: Named) -> None:
    """Tests never leave processes behind, whatever they asserted."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.shell.wait(timeout=START_WAIT_SECONDS)
