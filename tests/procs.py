"""Real processes with chosen names for the guard tests: a copy of /bin/sleep under a new name.

Names carry a random suffix so parallel test runs (and other helpers on this machine) never match
each other's processes.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def spawn_named(tmp_path: Path, name: str, *, ignore_sigterm: bool = False) -> subprocess.Popen:
    """Start `name 600` where name is a copy of sleep; an ignored SIGTERM survives exec."""
    exe = tmp_path / name
    shutil.copy(shutil.which("sleep"), exe)

    def ignore_term():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    proc = subprocess.Popen([str(exe), "600"], preexec_fn=ignore_term if ignore_sigterm else None)
    _wait_for_exec(proc, str(exe))
    return proc


def _wait_for_exec(proc: subprocess.Popen, exe: str) -> None:
    # Popen can return before the child has exec'd (its comm is still "python" then).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] == exe.encode():
                return
        except OSError:
            pass
        time.sleep(0.01)
    reap(proc)
    raise RuntimeError(f"could not start {exe}: it did not exec within 10 s")


def reap(proc: subprocess.Popen) -> None:
    """Tests never leave processes behind, whatever they asserted."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
