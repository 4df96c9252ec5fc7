"""Real memory pressure and a real OOM kill on the GPU box, watched by a real sparkd (cgroupfs).

1. service `storm` (memory.max 1G, no swap): an anonymous hog growing from 512 MiB to 1000 MiB
   beside readers streaming a 2 GiB file and re-reading a 96 MiB hot file through the page cache;
   sparkd's rules (policies/dgx-spark.yaml's thresholds) should fire warn -> shrink_cache -> stop.
2. service `oomer` (memory.max 256M): allocates 512 MiB; the kernel OOM-kills it and sparkd's
   memory.events detector records oom / oom_kill.
Prints the timeline (seconds after `storm` started) and leaves its files in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Overridable only for a smoke run elsewhere (a hybrid host has no memory controller: no pressure).
CGROUP_ROOT = Path(os.environ.get("SCENARIO_CGROUP_ROOT", "/sys/fs/cgroup/sparkd-scenario"))
WORK = Path("/var/tmp/sparkd-scenario")
STORM_TIMEOUT_SECONDS = float(os.environ.get("SCENARIO_STORM_SECONDS", 240))
OOM_TIMEOUT_SECONDS = float(os.environ.get("SCENARIO_OOM_SECONDS", 60))


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def sparkctl(socket: Path, *args: str) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(socket), *args, timeout=300)


def make_files() -> tuple[Path, Path]:
    WORK.mkdir(parents=True, exist_ok=True)
    big, hot = WORK / "big.bin", WORK / "hot.bin"
    sh("dd", "if=/dev/zero", f"of={big}", "bs=16M", "count=128", "conv=fsync")
    with open(hot, "wb") as f:
        f.write(os.urandom(96 << 20))
        os.fsync(f.fileno())
    Path("/proc/sys/vm/drop_caches").write_text("1")  # the storm must read from disk, not our cache
    return big, hot


def policy(state: Path, socket: Path, big: Path, hot: Path) -> dict:
    hogs = str(ROOT / "bench" / "gpu_box" / "hogs.py")
    psi = lambda name, kind, stall, duration, action, **kw: {  # noqa: E731
        "name": name, "detector": "psi", "kind": kind, "stall": stall, "window": "1s", "duration": duration,
        "action": action, "cooldown": "60s", **kw}
    return {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(CGROUP_ROOT), "state_dir": str(state),
                   "control_socket": str(socket)},
        "guards": {"reserve": "1G", "competitors": []},
        "services": {
            "storm": {"engine": {"command": [sys.executable, hogs, "storm", "512", "1000", str(big), str(hot)]},
                      "memory_max": "1G", "swap_max": 0, "stop_timeout": "5s"},
            "oomer": {"engine": {"command": [sys.executable, hogs, "oom", "512"]}, "memory_max": "256M", "swap_max": 0},
        },
        "pressure": {"sample_interval": "1s", "rules": [
            psi("warn", "some", "150ms", "0s", "warn"),
            psi("shrink", "full", "100ms", "5s", "shrink_cache", budget="8G"),
            psi("stop", "full", "500ms", "10s", "stop"),
            {"name": "oom-kill", "detector": "memory_events", "counter": "oom_kill", "action": "warn", "cooldown": "1s"},
            {"name": "at-max", "detector": "memory_events", "counter": "max", "action": "warn", "cooldown": "30s"},
            {"name": "system", "detector": "psi_system", "kind": "some", "stall": "150ms", "action": "warn"},
        ]},
        "kernel_log": {"rules": [{"name": "nvrm-oom", "match": "no_memory", "action": "stop", "dry_run": True}]},
    }


def _read(path: Path) -> str:
    try:
        return " ".join(path.read_text().split())
    except OSError:
        return "-"


def sample_pressure(cgroup: Path, out: Path, stop: threading.Event, t0: float) -> None:
    with open(out, "w") as f:
        f.write("t_seconds\tmemory.pressure\tmemory.current\tmemory.events\n")
        while not stop.is_set():
            row = [_read(cgroup / n) for n in ("memory.pressure", "memory.current", "memory.events")]
            f.write(f"{time.time() - t0:.2f}\t" + "\t".join(row) + "\n")
            f.flush()
            stop.wait(0.5)


def events(socket: Path) -> list[dict]:
    out = sparkctl(socket, "events", "--json")
    return [json.loads(l) for l in out.stdout.splitlines()] if out.returncode == 0 else []


def wait_for(socket: Path, pred, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if any(pred(e) for e in events(socket)):
            return True
        time.sleep(0.5)
    return False


def timeline(evs: list[dict], t0: float) -> None:
    print("\n== timeline (seconds after `sparkctl start storm`) ==")
    for e in evs:
        if e["type"] in ("detector_running",):
            continue
        what = " ".join(str(x) for x in (e["type"], e.get("service") or "-", e.get("detector") or "-",
                                         e.get("rule") or "", e.get("action") or "") if x != "")
        vals = e.get("values") or {}
        brief = {k: vals[k] for k in ("stall_seconds", "threshold_seconds", "trigger_fired", "avg10", "counter",
                                      "before", "after") if k in vals}
        print(f"+{e['time'] - t0:8.2f}s  {what}  {json.dumps(brief) if brief else ''}  {e.get('result') or ''}")


def cleanup(d: subprocess.Popen | None, socket: Path) -> None:
    for name in ("storm", "oomer"):
        sparkctl(socket, "stop", name)
    if d is not None and d.poll() is None:
        d.send_signal(signal.SIGTERM)
        d.wait(30)
    for cg in sorted(CGROUP_ROOT.rglob("*"), key=lambda p: len(p.parts), reverse=True) if CGROUP_ROOT.exists() else []:
        if cg.is_dir():
            (cg / "cgroup.kill").write_text("1") if (cg / "cgroup.kill").exists() else None
            time.sleep(0.2)
            cg.rmdir()
    if CGROUP_ROOT.exists():
        CGROUP_ROOT.rmdir()
    shutil.rmtree(WORK, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    if "memory" not in (CGROUP_ROOT.parent / "cgroup.controllers").read_text().split() and "SCENARIO_CGROUP_ROOT" not in os.environ:
        print("no memory controller at /sys/fs/cgroup: this scenario needs pure cgroup v2 (the GPU box)")
        return 1
    print(f"kernel {os.uname().release}; python {sys.version.split()[0]}; cpus {os.cpu_count()}")
    t_files = time.monotonic()
    big, hot = make_files()
    print(f"files written in {time.monotonic() - t_files:.1f} s")
    CGROUP_ROOT.mkdir(exist_ok=True)
    state, socket = WORK / "state", WORK / "control.sock"
    pol = WORK / "policy.yaml"
    pol.write_text(yaml.safe_dump(policy(state, socket, big, hot)))
    d = None
    try:
        d = subprocess.Popen([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(pol), "run"],
                             stdout=open(out / "sparkd.log", "w"), stderr=subprocess.STDOUT)
        while "event=ready" not in (out / "sparkd.log").read_text():
            if d.poll() is not None:
                print("sparkd exited:\n" + (out / "sparkd.log").read_text())
                return 1
            time.sleep(0.1)
        t0 = time.time()
        print(sparkctl(socket, "start", "storm").stdout.strip())
        cgroup = CGROUP_ROOT / "sparkd.slice" / "sparkd-storm.service"
        stop = threading.Event()
        threading.Thread(target=sample_pressure, args=(cgroup, out / "pressure.tsv", stop, t0), daemon=True).start()
        time.sleep(3)
        (out / "status.json").write_text(sparkctl(socket, "status", "--json").stdout)
        stopped = wait_for(socket, lambda e: e["type"] == "action" and e.get("rule") == "stop", STORM_TIMEOUT_SECONDS)
        stop.set()
        print(f"storm: stop rule acted: {stopped}")
        print(sparkctl(socket, "start", "oomer").stdout.strip())
        oom = wait_for(socket, lambda e: e.get("detector") == "memory_events" and e.get("service") == "oomer"
                       and (e.get("values") or {}).get("counter") == "oom_kill", OOM_TIMEOUT_SECONDS)
        print(f"oomer: oom_kill seen in memory.events: {oom}")
        evs = events(socket)
        timeline(evs, t0)
        with open(out / "events.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in evs)
        print("\n== watcher health ==")
        print(json.dumps(json.loads((out / "status.json").read_text() or "{}").get("watchers"), indent=1))
        return 0 if stopped and oom else 2
    finally:
        cleanup(d, socket)


if __name__ == "__main__":
    sys.exit(main())
