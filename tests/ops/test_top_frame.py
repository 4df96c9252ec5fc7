"""top's frame from literal status answers: engine figures and events when sparkd reports them,
'–' when it does not, never taller than the terminal, MemAvailable below the reserve marked."""

from __future__ import annotations

from rich.console import Console

from sparkd.ops.top import render_frame

G = 1 << 30


def status(services: list[dict], **extra) -> dict:
    return {
        "daemon": {"pid": 42, "started_at": 0.0, "placement": "systemd", "memory_enforced": True,
                   "gpu_available": True, "gpu_reason": None},
        "services": services,
        "system": {"mem_total_bytes": 121 * G, "mem_available_bytes": 20 * G, "reserve_bytes": 16 * G, "reason": None},
        **extra,
    }


def svc(name: str, **extra) -> dict:
    return {"name": name, "state": "active", "memory_current_bytes": 80 * G, "memory_max_bytes": 92 * G,
            "psi_some_avg10": 53.0, "psi_full_avg10": 12.5, "gpu_mib": 2048, **extra}


def draw(body: dict | None, error: str | None = None, height: int = 24) -> list[str]:
    console = Console(width=80, height=height, record=True, file=open("/dev/null", "w"))
    console.print(render_frame(body, error, now=3600.0 * 3, height=height, interval_seconds=2))
    return console.export_text().splitlines()


def test_engine_figures_and_events_when_reported():
    engine = {"url": "http://127.0.0.1:7777", "health": "ready", "decode_tok_s": 0.37, "requests_queued": 3,
              "cache_retention": 0.914, "disk_read_bytes_per_second": 11.1e9}
    # the shape of sparkd's event log (GET /v1/events)
    events = [{"seq": i, "time": 0, "level": "warning", "type": f"pressure_{i}", "service": "kimi",
               "detector": "psi", "result": "full avg10 53"} for i in range(6)]
    lines = draw(status([svc("kimi", engine=engine)], events=events))
    row = next(line for line in lines if line.startswith("kimi"))
    assert row.split()[1:] == ["active", "80.0G/92.0G", "53.0/12.5", "2048M", "0.37", "3", "91%", "11100"]
    assert "MemAvailable 20.0G of 121.0G · reserve 16.0G · above reserve 4.0G" in lines[1]
    assert "last events" in lines
    shown = [line for line in lines if " kimi pressure_" in line]
    assert [line.split()[2] for line in shown] == ["pressure_2:", "pressure_3:", "pressure_4:", "pressure_5:"]
    assert shown[-1].endswith("kimi pressure_5: full avg10 53")


def test_no_events_and_no_watchers_are_said():
    assert "(none)" in draw(status([svc("kimi")], events=[]))
    lines = draw(status([svc("kimi")], events_reason="could not answer: this sparkd runs without watchers"))
    assert "events – (could not answer: this sparkd runs without watchers)" in lines


def test_missing_figures_show_a_dash():
    body = status([{"name": "cold", "state": "inactive"}])
    del body["system"]
    lines = draw(body)
    assert next(line for line in lines if line.startswith("cold")).split()[1:] == ["inactive", "–/–"] + ["–"] * 6
    assert any("MemAvailable – (this sparkd does not report it)" in line for line in lines)


def test_many_services_never_overflow_the_screen():
    lines = draw(status([svc(f"svc{i:02d}") for i in range(40)]), height=24)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert any(line.startswith("… ") and "more" in line for line in lines)


def test_below_reserve_and_failed_refresh_are_said():
    body = status([svc("kimi")])
    body["system"]["mem_available_bytes"] = 8 * G
    lines = draw(body, error="could not connect to sparkd")
    assert "BELOW reserve by 8.0G" in lines[1]
    assert any("refresh failed: could not connect to sparkd (showing the last answer)" in line for line in lines)
    assert draw(None, error="could not connect")[0] == "sparkd: could not connect"
