"""daemon.metrics_listen: parsing and binding errors name the key, the value and what to do."""

from __future__ import annotations

import socket

import pytest
from sparkd.metrics.server import MetricsError, bind_listen, parse_listen


def test_parse_listen():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)


@pytest.mark.parametrize("bad, why", [
    ("9464", "expected HOST:PORT"), ("127.0.0.1:", "expected HOST:PORT"), ("127.0.0.1:70000", "expected HOST:PORT"),
    ("localhost:9464", "'localhost' is not an IP address"),
])
def test_bad_listen_values(bad, why):
    with pytest.raises(MetricsError) as err:
        parse_listen(bad)
    assert f"could not parse daemon.metrics_listen {bad!r}" in str(err.value) and why in str(err.value)


def test_busy_port_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MetricsError) as err:
            bind_listen(f"127.0.0.1:{port}")
    assert f"could not listen for metrics on 127.0.0.1:{port} (daemon.metrics_listen): Address already in use" in str(err.value)
