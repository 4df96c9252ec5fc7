"""A throwaway, real systemd for tests: PID 1 of private pid/mount/cgroup namespaces.

The box runs over a tmpfs overlay of / so nothing it writes (tmpfiles, journals, unit files)
reaches the host, boots a minimal target (only D-Bus), and exposes its system bus through a
socket in state_dir. Everything it runs lives in one host cgroup that stop() kills and removes.
share_dir is bind-mounted at the same path inside: the overlay shows / as it was at boot, so
files a test writes later must go there.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

SYSTEMD_PATH = "/lib/systemd/systemd"
CGROUP_PREFIX = "sparkd-sdbox-"
# Boot takes about half a second here; generous because CI machines are shared and slow.
BOOT_TIMEOUT_SECONDS = 30.0
# After cgroup.kill the kernel needs a moment to empty the cgroups before they can be removed.
KILL_WAIT_SECONDS = 10.0
CHECKOUT = Path(__file__).resolve().parents[1]
_PR_SET_PDEATHSIG = 1

# What the box may write over / (tmpfs: memory, used only as written). Enough for units, journals
# and a small package; a test installing torch into the box asks for more.
OVERLAY_SIZE = "1g"

# Runs inside the new namespaces: $1 state dir, $2 share dir, $3 systemd binary, $4 checkout,
# $5 overlay size.
_INNER_SCRIPT = r"""
set -eu
S="$1"; SHARE="$2"; SYSTEMD="$3"; CHECKOUT="$4"; SIZE="$5"
mount -t tmpfs -o "size=$SIZE,mode=755" sdbox /mnt
mkdir -p /mnt/upper /mnt/work /mnt/root
mount -t overlay overlay -o lowerdir=/,upperdir=/mnt/upper,workdir=/mnt/work /mnt/root
R=/mnt/root
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t sysfs sysfs "$R/sys"
mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
# a private /tmp: the box's tmpfiles must never clean the host's
mount -t tmpfs tmpfs "$R/tmp"
mkdir -p "$R/run/dbus" && mount --bind "$S/dbus" "$R/run/dbus"
if [ -n "$SHARE" ]; then mkdir -p "$R$SHARE" && mount --bind "$SHARE" "$R$SHARE"; fi
# the checkout (and its .venv) at the same path: a clone under /tmp or /run would otherwise be
# hidden by the box's own /tmp and /run
mkdir -p "$R$CHECKOUT" && mount --bind "$CHECKOUT" "$R$CHECKOUT"
cat > "$R/etc/systemd/system/sdbox.target" <<UNIT
[Unit]
Description=sdbox minimal target
Requires=dbus.socket
Wants=dbus.service
AllowIsolate=yes
UNIT
cd "$R" && mkdir -p .oldroot && pivot_root . .oldroot && umount -l /.oldroot
export container=sdbox
exec "$SYSTEMD" --unit=sdbox.target --log-target=console --show-status=no
"""


def default_cgroup_root() -> Path:
    """Pure cgroup v2 at /sys/fs/cgroup, or the unified half of a hybrid host."""
    pure = Path("/sys/fs/cgroup")
    return pure if (pure / "cgroup.controllers").exists() else pure / "unified"


class SystemdBoxError(RuntimeError):
    """The sandbox could not boot or be torn down."""


class SystemdBox:
    def __init__(
        self,
        state_dir: str | os.PathLike,
        share_dir: str | os.PathLike | None = None,
        cgroup_root: str | os.PathLike | None = None,
        systemd_path: str = SYSTEMD_PATH,
        boot_timeout_seconds: float = BOOT_TIMEOUT_SECONDS,
        overlay_size: str = OVERLAY_SIZE,
    ):
        self.state_dir = Path(state_dir).resolve()
        self.share_dir = Path(share_dir).resolve() if share_dir else None
        self.cgroup_root = Path(cgroup_root) if cgroup_root else default_cgroup_root()
        self.systemd_path = systemd_path
        self.boot_timeout_seconds = boot_timeout_seconds
        self.overlay_size = overlay_size
        self.cgroup: Path | None = None  # host path of the box's root cgroup
        self.boot_seconds: float | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def bus_address(self) -> str:
        return f"unix:path={self.state_dir / 'dbus' / 'system_bus_socket'}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "log"

    def start(self) -> None:
        """Boot and wait until systemd answers on the system bus; on failure tear down."""
        remove_stale_boxes(self.cgroup_root)
        (self.state_dir / "dbus").mkdir(parents=True, exist_ok=True)
        self.cgroup = self.cgroup_root / f"{CGROUP_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
        self.cgroup.mkdir()
        began = time.monotonic()
        try:
            self._spawn()
            self._wait_for_bus()
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - began

    def _spawn(self) -> None:
        procs_file = self.cgroup / "cgroup.procs"

        def enter_box_cgroup() -> None:
            # The box's cgroup namespace is rooted where unshare starts, so move there first;
            # and die with the test process so a crashed run cannot leave a systemd behind.
            procs_file.write_text("0")
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

        argv = [
            "unshare", "--pid", "--mount", "--cgroup", "--fork", "--kill-child=SIGKILL",
            "--propagation", "private",
            "bash", "-c", _INNER_SCRIPT, "sdbox",
            str(self.state_dir), str(self.share_dir or ""), self.systemd_path, str(CHECKOUT),
            self.overlay_size,
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=enter_box_cgroup,
            )  # fmt: skip

    def _wait_for_bus(self) -> None:
        deadline = time.monotonic() + self.boot_timeout_seconds
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise SystemdBoxError(f"could not boot systemd box: exited {self._proc.returncode}; {self._log_tail()}")
            try:
                asyncio.run(_systemd_version(self.bus_address))
                return
            except Exception as exc:  # not up yet: socket missing, name not owned
                last_error = exc
            time.sleep(0.05)
        raise SystemdBoxError(
            f"could not boot systemd box: bus {self.bus_address} did not answer within "
            f"{self.boot_timeout_seconds} s ({last_error}); {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return "log: " + self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "no log"

    def init_pid(self) -> int:
        """Host pid of the box's systemd (it moves itself into init.scope)."""
        pids = (self.cgroup / "init.scope" / "cgroup.procs").read_text().split()
        if not pids:
            raise SystemdBoxError(f"could not find systemd in {self.cgroup}/init.scope")
        return int(pids[0])

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run a command inside the box's namespaces (sees its /, /run and cgroup tree)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        nsenter = ["nsenter", "-t", str(self.init_pid()), "-m", "-p", "-C", "--"]
        return subprocess.run(nsenter + list(argv), **kwargs)

    def host_cgroup_path(self, cgroup_in_box: str) -> Path:
        """Host path of a cgroup the box names (e.g. ControlGroup of a unit)."""
        return self.cgroup / cgroup_in_box.lstrip("/")

    def stop(self) -> None:
        """Kill everything in the box and remove its cgroups. Safe to call twice."""
        if self.cgroup is not None and self.cgroup.exists():
            kill_cgroup_tree(self.cgroup)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=KILL_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self.cgroup is not None and self.cgroup.exists():
            raise SystemdBoxError(f"could not remove box cgroup {self.cgroup}: still busy")
        self.cgroup = None


def _cgroup_pids(cgroup: Path) -> list[str]:
    pids = []
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            pids += procs.read_text().split()
        except OSError:  # removed while walking
            pass
    return pids


def kill_cgroup_tree(cgroup: Path) -> None:
    """cgroup.kill the whole subtree, wait until empty, remove directories bottom-up. A cgroup
    whose last task just died can stay busy a moment after cgroup.procs reads empty (seen with
    sparkd.service killed mid-test), so removal is retried until the deadline."""
    (cgroup / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while _cgroup_pids(cgroup) and time.monotonic() < deadline:
        time.sleep(0.05)
    while True:
        for directory in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_quiet(directory)
        _rmdir_quiet(cgroup)
        if not cgroup.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _rmdir_quiet(directory: Path) -> None:
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError:  # busy: the caller reports the root if it survives
        pass


def remove_stale_boxes(cgroup_root: Path) -> None:
    """Remove boxes whose creating test process is gone (a run killed with SIGKILL)."""
    for cgroup in cgroup_root.glob(f"{CGROUP_PREFIX}*"):
        creator = cgroup.name[len(CGROUP_PREFIX) :].split("-")[0]
        if creator.isdigit() and not Path(f"/proc/{creator}").exists():
            kill_cgroup_tree(cgroup)


async def _systemd_version(bus_address: str) -> str:
    from dbus_fast import BusType, Message
    from dbus_fast.aio import MessageBus

    bus = await asyncio.wait_for(MessageBus(bus_address=bus_address, bus_type=BusType.SYSTEM).connect(), 2)
    try:
        reply = await asyncio.wait_for(
            bus.call(
                Message(
                    destination="org.freedesktop.systemd1",
                    path="/org/freedesktop/systemd1",
                    interface="org.freedesktop.DBus.Properties",
                    member="Get",
                    signature="ss",
                    body=["org.freedesktop.systemd1.Manager", "Version"],
                )
            ),
            2,
        )
        if reply.message_type.name != "METHOD_RETURN":
            raise SystemdBoxError(f"systemd not on the bus yet: {reply.body}")
        return reply.body[0].value
    finally:
        bus.disconnect()
