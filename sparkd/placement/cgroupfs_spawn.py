"""Starting a cgroupfs service: checks before anything exists, then the launcher handshake.

The launcher (cgroupfs_launcher.py) joins the cgroup, forks and execs the service, and answers
with one JSON line: {"started": MAIN_PID} or {"error": MESSAGE}. Errors it reports (exec format,
permission denied as the service user) become PlacementError here; the caller removes the cgroup.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess

from sparkd.errors import PlacementError
from sparkd.placement import cgroupfs_launcher
from sparkd.placement.base import ServiceSpec, unit_name
from sparkd.system import cgroups

# What a systemd service gets when the unit sets no PATH.
DEFAULT_SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def service_environment(spec: ServiceSpec) -> dict[str, str]:
    """A clean environment like systemd's: PATH plus what the policy sets, nothing of sparkd's."""
    return {"PATH": DEFAULT_SERVICE_PATH, **spec.environment}


def check_spec(spec: ServiceSpec) -> None:
    """Everything that can be refused before a cgroup or process exists."""
    if spec.restart != "no":
        raise PlacementError(
            f"could not start {spec.name}: the cgroupfs backend never restarts services "
            f"(restart: {spec.restart!r}); set services.{spec.name}.restart: no"
        )
    if not spec.argv:
        raise PlacementError(f"could not start {spec.name}: the command is empty")
    path = service_environment(spec)["PATH"]
    if shutil.which(spec.argv[0], path=path) is None:
        raise PlacementError(
            f"could not start {spec.name}: {spec.argv[0]} is not an executable file "
            f"(searched PATH={path}); install it or give its absolute path"
        )
    if spec.working_directory and not os.path.isdir(spec.working_directory):
        raise PlacementError(
            f"could not start {spec.name}: working directory {spec.working_directory} does not exist"
        )
    if spec.user:
        try:
            pwd.getpwuid(int(spec.user)) if spec.user.isdigit() else pwd.getpwnam(spec.user)
        except KeyError:
            raise PlacementError(f"could not start {spec.name}: no such user {spec.user!r}") from None


async def launch(
    spec: ServiceSpec,
    cgroup: str,
    *,
    python: str,
    exit_record: str,
    log_path: str,
    timeout_seconds: float,
) -> tuple[subprocess.Popen, int]:
    """Run the launcher for spec in cgroup: (launcher process, main pid) once the exec succeeded."""
    request = {
        "argv": list(spec.argv),
        "env": service_environment(spec),
        "cwd": spec.working_directory,
        "user": spec.user,
        "cgroup": cgroup,
        "exit_record": exit_record,
        "log": log_path,
    }
    try:
        log = open(log_path, "ab")
    except OSError as exc:
        raise PlacementError(f"could not open service log {log_path}: {exc.strerror}") from exc
    with log:
        try:
            # -I -S: the launcher imports nothing of sparkd's environment; new session: signals
            # meant for sparkd's process group never reach the service.
            launcher = subprocess.Popen(
                [python, "-I", "-S", cgroupfs_launcher.__file__, unit_name(spec.name)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env={}, cwd="/", start_new_session=True,
            )
        except OSError as exc:
            raise PlacementError(f"could not run the launcher {python}: {exc.strerror}") from exc
    try:
        reply = await _handshake(launcher, request, timeout_seconds)
        if "started" not in reply:
            raise PlacementError(f"could not start {spec.name}: {reply.get('error', reply)}")
    except BaseException:
        kill_launcher(launcher, cgroup)
        raise
    return launcher, int(reply["started"])


async def _handshake(launcher: subprocess.Popen, request: dict, timeout_seconds: float) -> dict:
    def talk() -> bytes:
        try:
            launcher.stdin.write(json.dumps(request).encode())
            launcher.stdin.close()
        except BrokenPipeError:
            pass  # the launcher died; its silence is reported below
        line = launcher.stdout.readline()
        launcher.stdout.close()
        return line

    try:
        line = await asyncio.wait_for(asyncio.to_thread(talk), timeout_seconds)
    except TimeoutError:
        raise PlacementError(
            f"could not start the service: the launcher did not answer in {timeout_seconds} s"
        ) from None
    if not line:
        raise PlacementError(
            f"could not start the service: the launcher exited without a word (see {request['log']})"
        )
    return json.loads(line)


def kill_launcher(launcher: subprocess.Popen, cgroup: str) -> None:
    """Kill and reap a launcher whose start failed, with anything it already forked."""
    launcher.kill()  # it may still be outside the cgroup when it failed early
    if os.path.isdir(cgroup):
        cgroups.kill_cgroup(cgroup)
    launcher.wait()
