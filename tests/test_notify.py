import asyncio
import os
import socket

from sparkd.notify import Notifier


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_ready_status_stopping_on_a_path_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    with _receiver(path) as rx:
        n = Notifier.from_environ({"NOTIFY_SOCKET": path})
        assert n.ready("2 services running")
        assert _fields(rx.recv(4096)) == {"READY": "1", "STATUS": "2 services running"}
        assert n.status("starting llm")
        assert _fields(rx.recv(4096)) == {"STATUS": "starting llm"}
        assert n.stopping()
        assert _fields(rx.recv(4096))["STOPPING"] == "1"


def test_abstract_socket(tmp_path):
    name = f"sparkd-test-{os.getpid()}"
    with _receiver("\0" + name) as rx:
        assert Notifier.from_environ({"NOTIFY_SOCKET": "@" + name}).ready("ok")
        assert _fields(rx.recv(4096))["READY"] == "1"


def test_without_notify_socket_nothing_is_sent():
    n = Notifier.from_environ({})
    assert not n.enabled
    assert n.ready("x") is False


def test_unreachable_socket_is_logged_not_raised(tmp_path, caplog):
    n = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.ready("x") is False
    assert "event=notify_failed" in caplog.text


async def test_watchdog_pings_at_half_the_interval(tmp_path):
    path = str(tmp_path / "wd.sock")
    with _receiver(path) as rx:
        n = Notifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
        assert n.watchdog_usec == 200000
        task = asyncio.create_task(n.watchdog_loop())
        rx.setblocking(False)
        pings = []
        while len(pings) < 2:
            await asyncio.sleep(0.02)
            try:
                pings.append(_fields(rx.recv(4096)))
            except BlockingIOError:
                pass
        task.cancel()
        assert pings == [{"WATCHDOG": "1"}, {"WATCHDOG": "1"}]


def test_watchdog_for_another_pid_is_ignored(tmp_path):
    n = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "x"), "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert n.watchdog_usec is None
