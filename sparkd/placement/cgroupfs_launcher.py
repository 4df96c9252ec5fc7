"""The first process of every cgroupfs service: moves itself into the service's cgroup, then runs
the service there and records how it ended.

Why a launcher rather than a preexec hook in sparkd: the service must never run outside its
cgroup, and writing cgroup.procs between fork and exec of a multi-threaded asyncio daemon is not
safe in Python. Here the launcher writes its own pid into cgroup.procs before it forks, so the
service is born inside. It stays as the service's parent (like systemd's main-process tracking)
to record the exit status into the state dir: that survives a sparkd restart, when sparkd is no
longer the parent and waitpid cannot tell it anything.

Runs as `python -I -S cgroupfs_launcher.py UNIT` with the standard library only (no sparkd
import, no site, no PYTHONPATH), so the service's environment never leaks into it.

Protocol: one JSON spec on stdin {argv, env, cwd, user, cgroup, exit_record, log}; one JSON line
on stdout, {"started": MAIN_PID} or {"error": MESSAGE}; stderr goes to the service log. The exit
record is {"main_pid", "exit_code"} or {"main_pid", "signal", "core_dumped"}.
"""

import json
import os
import pwd
import signal
import sys

# Signals the service gets from `stop` (sent to every process of the cgroup): the launcher must
# outlive the main process to record its exit, so it ignores them with a handler (not SIG_IGN,
# which the service would inherit across exec).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Python ignores these at start-up; a service expects the default disposition.
_PYTHON_IGNORED = (signal.SIGPIPE, signal.SIGXFSZ)


class LaunchError(Exception):
    pass


def _ignore(_signum, _frame):
    pass


def _write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _join_cgroup(cgroup):
    procs = os.path.join(cgroup, "cgroup.procs")
    try:
        _write_file(procs, str(os.getpid()))
    except OSError as exc:
        raise LaunchError(f"could not move the launcher into {procs}: {exc.strerror}") from exc


def _resolve_user(spec):
    """(uid, gid, name, env additions) for spec['user'], None when running as sparkd's user."""
    user = spec.get("user")
    if not user:
        return None
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError) as exc:
        raise LaunchError(f"could not find user {user!r}: no such user in the passwd database") from exc
    env = {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name, "SHELL": entry.pw_shell}
    return entry.pw_uid, entry.pw_gid, entry.pw_name, env


def _execvpe(file, argv, env):
    """os.execvpe without its lazy `import warnings`, which fails once the child switched to a
    user that cannot read this Python's standard library. Like execvp(3), a permission error
    beats "not found" in the report."""
    if "/" in file:
        os.execve(file, argv, env)
    error = None
    for directory in env.get("PATH", os.defpath).split(":"):
        try:
            os.execve(os.path.join(directory or ".", file), argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            error = error or exc
        except OSError as exc:
            if error is None or isinstance(error, (FileNotFoundError, NotADirectoryError)):
                error = exc
    raise error or FileNotFoundError(2, "No such file or directory", file)


def _exec_child(spec, user, log_fd, err_w):
    """In the forked child: never returns."""
    step = "prepare the service"
    try:
        for sig in _STOP_SIGNALS + _PYTHON_IGNORED:
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        env = dict(spec["env"])
        cwd = spec.get("cwd") or "/"
        step = f"change directory to {cwd}"
        os.chdir(cwd)
        if user is not None:
            uid, gid, name, user_env = user
            env = {**user_env, **env}
            step = f"switch to user {name}"
            os.initgroups(name, gid)
            os.setgid(gid)
            os.setuid(uid)
        step = f"execute {spec['argv'][0]}"
        _execvpe(spec["argv"][0], spec["argv"], env)
    except OSError as exc:
        os.write(err_w, f"could not {step}: {exc.strerror}".encode())
    except BaseException as exc:  # anything else still must not run sparkd code in the child
        os.write(err_w, f"could not {step}: {exc}".encode())
    os._exit(127)


def _spawn(spec, user):
    """Fork and exec the service; the main pid, or LaunchError with the child's own reason."""
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    err_r, err_w = os.pipe()  # close-on-exec: EOF on the read side means exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        _exec_child(spec, user, log_fd, err_w)
    os.close(err_w)
    os.close(log_fd)
    chunks = []
    while chunk := os.read(err_r, 4096):
        chunks.append(chunk)
    os.close(err_r)
    if chunks:
        os.waitpid(pid, 0)
        raise LaunchError(b"".join(chunks).decode(errors="replace"))
    return pid


def _record_exit(path, main_pid, wait_status):
    if os.WIFSIGNALED(wait_status):
        record = {
            "main_pid": main_pid,
            "signal": os.WTERMSIG(wait_status),
            "core_dumped": os.WCOREDUMP(wait_status),
        }
    else:
        record = {"main_pid": main_pid, "exit_code": os.waitstatus_to_exitcode(wait_status)}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _kill_leftovers(cgroup):
    # The main process is gone, so the service is over: whatever it left behind goes with it
    # (systemd's KillMode=control-group). cgroup.kill kills this launcher too, which is fine:
    # the exit record is already on disk. Without cgroup.kill, sparkd cleans up.
    kill_file = os.path.join(cgroup, "cgroup.kill")
    if os.path.exists(kill_file):
        _write_file(kill_file, "1")


def _report(message):
    os.write(1, (json.dumps(message) + "\n").encode())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # sparkd may go away; the launcher never writes to it again


def main():
    spec = json.loads(sys.stdin.buffer.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _ignore)
    try:
        _join_cgroup(spec["cgroup"])
        main_pid = _spawn(spec, _resolve_user(spec))
    except LaunchError as exc:
        _report({"error": str(exc)})
        return 1
    except OSError as exc:
        _report({"error": f"could not start the service: {exc}"})
        return 1
    _report({"started": main_pid})
    _, wait_status = os.waitpid(main_pid, 0)
    _record_exit(spec["exit_record"], main_pid, wait_status)
    _kill_leftovers(spec["cgroup"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
