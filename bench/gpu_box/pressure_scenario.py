"""Real memory pressure on a pure cgroup v2 host (the GPU box), watched by a real sparkd (cgroupfs)
with the default policy's pressure rules (policies/dgx-spark.yaml; only the shrink budget is set
for the small engine), expected to fire in order warn -> shrink_cache -> stop.

1. service `storm`: a real streaming engine (`sparkd-engine serve`, generated qwen3moe model, API
   key from engine.embedded.api_key_file). Once it is ready, memory.high is set 640 MiB above what
   it uses (memory.max stays 3G: the kernel throttles instead of OOM-killing) and a workload is moved
   into its cgroup: an anonymous hog growing 32 MiB every 0.5 s beside a reader re-reading a 1 GiB
   file through the page cache. Past memory.high every allocation is throttled (a reclaim stall,
   then a sleep that grows with the overage): sustained full stall. sparkd should warn, shrink the
   engine's expert cache through /admin/cache with the key, then stop the service; and before any of them
   shrink the cache on the throttling itself (memory.events `high`, rule shrink-on-throttling).
2. service `oomer` (memory.max 256M): allocates 512 MiB; the kernel OOM-kills it, sparkd's
   memory.events detector records oom_kill.
Without the memory controller (hybrid hosts like CI) it says so and makes a smoke run: the same
services, files and sparkd, no limits, no pressure, nothing expected to fire.
Prints the timeline (seconds after the workload started) and leaves its files in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket as socketlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from pressure_timeline import Sampler, event_marks, first_time, kernel_marks, longest_run, print_timeline

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from sparkd.usage import find_cgroup2_mount  # noqa: E402

WORK = Path(os.environ.get("SCENARIO_WORK", "/var/tmp/sparkd-scenario"))
MIB = 1 << 20
HIGH_ABOVE_ENGINE_MIB = 640
SHRINK_BUDGET = "192K"  # the generated model's expert arena is 384 KiB: shrink to half
RULES = {"warn": "warn-some-pressure", "shrink": "shrink-on-full-pressure", "stop": "stop-on-sustained-full-pressure",
         "throttle": "shrink-on-throttling"}  # throttle: the early shrink on memory.events `high`, before any stall
# Lower thresholds beside the defaults, dry-run only: if this box's stalls stay under the default
# thresholds, the log still shows where they were and what a scenario-specific policy would do.
LOW_RULES = [
    {"name": "low-warn", "detector": "psi", "kind": "some", "stall": "50ms", "window": "1s", "action": "warn"},
    {"name": "low-shrink", "detector": "psi", "kind": "full", "stall": "30ms", "window": "1s", "duration": "5s",
     "action": "shrink_cache", "budget": SHRINK_BUDGET},
    {"name": "low-stop", "detector": "psi", "kind": "full", "stall": "150ms", "window": "1s", "duration": "10s",
     "action": "stop"},
]


def sh(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def sparkctl(sock: Path, *args: str) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "sparkd.cli.sparkctl", "--socket", str(sock), *args)


def events(sock: Path) -> list[dict]:
    out = sparkctl(sock, "events", "--json")
    return [json.loads(line) for line in out.stdout.splitlines()] if out.returncode == 0 else []


def free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_controller(mount: Path) -> tuple[bool, str]:
    controllers = (mount / "cgroup.controllers").read_text().split()
    if "memory" in controllers:
        return True, f"memory controller at {mount} (controllers: {' '.join(controllers)})"
    return False, (f"NO memory controller at {mount}/cgroup.controllers (controllers: {' '.join(controllers) or 'none'}): "
                   "memory.high/memory.max cannot be enforced on this host, so no pressure can be made here. "
                   "SMOKE RUN: sparkd, the engine with its key, the workload in the service cgroup, sampling "
                   "and the timeline; the pressure rules are not expected to fire")


def make_files(file_mib: int) -> dict[str, Path]:
    from sparkd.engine import make_model as mm
    from sparkd.engine.modelgen.specs import TINY

    WORK.mkdir(parents=True, exist_ok=True)
    files = {"model": WORK / "tiny.gguf", "key": WORK / "engine.key", "thrash": WORK / "thrash.bin",
             "engine": WORK / "sparkd-engine"}
    mm.write_model(files["model"], mm.plan(TINY["qwen3moe"], "Q8_0"), seed=0)
    files["key"].touch(mode=0o600)
    files["key"].write_text(secrets.token_hex(16) + "\n")
    sh("dd", "if=/dev/urandom", f"of={files['thrash']}", "bs=16M", f"count={file_mib // 16}", "conv=fsync")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    files["engine"].write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} -m sparkd.engine.cli \"$@\"\n")
    files["engine"].chmod(0o755)
    return files


def policy(cgroup_root: Path, files: dict[str, Path], listen: str) -> dict:
    """dgx-spark.yaml's pressure and kernel_log rules; shrink budgets sized for the small engine."""
    default = yaml.safe_load((ROOT / "policies" / "dgx-spark.yaml").read_text())
    for rule in default["pressure"]["rules"]:
        if "budget" in rule:
            rule["budget"] = SHRINK_BUDGET
    hogs = str(Path(__file__).with_name("hogs.py"))
    return {
        "daemon": {"placement": "cgroupfs", "cgroup_root": str(cgroup_root), "state_dir": str(WORK / "state"),
                   "control_socket": str(WORK / "control.sock"), "engine_executable": str(files["engine"]),
                   "metrics_listen": f"127.0.0.1:{free_port()}"},
        "guards": {"reserve": "1G", "competitors": []},
        "services": {
            "storm": {"engine": {"embedded": {"model": str(files["model"]), "listen": listen,
                                              "api_key_file": str(files["key"]), "extra_args": ["--threads", "2"]}},
                      "memory_max": "3G", "swap_max": 0, "stop_timeout": "5s"},
            "oomer": {"engine": {"command": [sys.executable, hogs, "oom", "512"]}, "memory_max": "256M", "swap_max": 0},
        },
        "pressure": {**default["pressure"], "rules": default["pressure"]["rules"]
                     + [{**r, "dry_run": True, "cooldown": "300s"} for r in LOW_RULES]},
        "kernel_log": default["kernel_log"],
    }


def start_sparkd(pol: dict, out: Path) -> subprocess.Popen:
    (WORK / "policy.yaml").write_text(yaml.safe_dump(pol))
    log = out / "sparkd.log"
    d = subprocess.Popen([sys.executable, "-m", "sparkd.cli.daemon", "--policy", str(WORK / "policy.yaml"), "run"],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "event=ready" not in log.read_text():
        if d.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("sparkd did not get ready:\n" + log.read_text())
        time.sleep(0.1)
    return d


def engine_ready(listen: str, key: str, timeout_seconds: float = 120) -> int:
    """Waits for the engine; its expert cache budget (GET /admin/cache with the key)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{listen}/health", timeout=2).json().get("status") == "ready":
                r = httpx.get(f"http://{listen}/admin/cache", headers={"Authorization": f"Bearer {key}"}, timeout=5)
                r.raise_for_status()
                return int(r.json()["budget"])
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the storm engine at {listen} was not ready after {timeout_seconds:.0f} s")


def start_workload(cgroup: Path, files: dict[str, Path], cap_mib: int, out: Path) -> subprocess.Popen:
    """The hog, moved into the service's cgroup before it allocates anything."""
    hog = subprocess.Popen([sys.executable, str(Path(__file__).with_name("hogs.py")), "leak", str(files["thrash"]),
                            "32", "0.5", str(cap_mib)], stdin=subprocess.PIPE, stdout=open(out / "hog.log", "w"),
                           stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=hog.wait, daemon=True).start()  # reaped as soon as sparkd's stop ends it
    (cgroup / "cgroup.procs").write_text(str(hog.pid))
    hog.stdin.write("go\n")
    hog.stdin.flush()
    return hog


def wait_for_event(sock: Path, pred, timeout_seconds: float) -> list[dict]:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        evs = events(sock)
        if any(pred(e) for e in evs):
            return evs
        time.sleep(1)
    return events(sock)


def set_memory_high(cgroup: Path) -> str:
    """By hand, not through the policy's memory_high: the threshold is relative to what the engine
    uses once ready, which is not known when the policy is written."""
    current = int((cgroup / "memory.current").read_text())
    high = current + HIGH_ABOVE_ENGINE_MIB * MIB
    (cgroup / "memory.high").write_text(str(high))
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return (f"engine uses {current / MIB:.0f} MiB (anon {int(stat['anon']) / MIB:.0f}, file {int(stat['file']) / MIB:.0f}); "
            f"memory.high set to {high / MIB:.0f} MiB, "
            f"memory.max {(cgroup / 'memory.max').read_text().strip()}")


def run_storm(sock: Path, cgroup: Path, files: dict[str, Path], enforced: bool, out: Path, storm_seconds: float):
    """The workload in the storm service until sparkd's stop rule acts (or storm_seconds)."""
    print(f"memory.high: {set_memory_high(cgroup)}" if enforced else "memory.high: not set (no memory controller)")
    t0 = time.time()
    sampler = Sampler(cgroup, t0).start()
    hog = start_workload(cgroup, files, 2560 if enforced else 128, out)
    print(f"workload pid {hog.pid} moved into {cgroup}; cgroup.procs: "
          f"{' '.join((cgroup / 'cgroup.procs').read_text().split())}")
    stopped = lambda e: e["type"] == "action" and e.get("rule") == RULES["stop"] and e.get("action") == "stop"  # noqa: E731
    wait_for_event(sock, stopped, storm_seconds)
    time.sleep(3 if enforced else 0)  # the stop's effect on the samples
    sampler.stop()
    if hog.poll() is None:
        hog.send_signal(signal.SIGTERM)
    hog.wait(30)
    return t0, sampler, hog


def run_oomer(sock: Path) -> bool:
    print(sparkctl(sock, "start", "oomer").stdout.strip())
    evs = wait_for_event(sock, lambda e: e.get("service") == "oomer" and e.get("detector") == "memory_events"
                         and (e.get("values") or {}).get("counter") == "oom_kill", 30)
    return any(e.get("service") == "oomer" and (e.get("values") or {}).get("counter") == "oom_kill" for e in evs)


def hog_marks(out: Path, t0: float) -> list[tuple[float, str]]:
    marks, shown = [], 0
    for line in (out / "hog.log").read_text().splitlines():
        stamp, _, rest = line.partition(" ")
        if rest.startswith("anon_mib=") and int(rest[9:]) >= shown + 128:
            shown = int(rest[9:])
            marks.append((float(stamp) - t0, f"workload: anonymous hog at {shown} MiB"))
    return marks


def verdict(evs: list[dict], t0: float, rows: list[dict]) -> dict:
    acted = {k: first_time(evs, t0, "action", rule) for k, rule in RULES.items()}
    results = {k: next((e["result"] for e in evs if e["type"] == "action" and e.get("rule") == rule), None)
               for k, rule in RULES.items()}
    times = [acted[k] for k in ("warn", "shrink", "stop")]
    low = {r["name"]: first_time(evs, t0, "fired", r["name"]) for r in LOW_RULES}
    return {"acted_seconds": acted, "results": results, "dry_run_low_thresholds_fired_seconds": low,
            "in_order": None not in times and times == sorted(times),
            "shrink_ok": (results["shrink"] or "").startswith("expert cache shrunk"),
            "throttle_shrink_ok": (results["throttle"] or "").startswith("expert cache shrunk"),
            "longest_full_ge_0.1_seconds": longest_run(rows, "full", 0.1),
            "longest_full_ge_0.5_seconds": longest_run(rows, "full", 0.5)}


def report(sock: Path, out: Path, t0: float, sampler: Sampler) -> tuple[list[dict], dict]:
    evs = events(sock)
    with open(out / "events.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in evs)
    sampler.write_tsv(out / "pressure.tsv")
    rows = sampler.with_rates()
    marks = kernel_marks(rows) + event_marks(evs, t0) + hog_marks(out, t0)
    print_timeline(marks, "timeline (seconds after the workload started; kernel: the storm cgroup's files, "
                          "sparkd: `sparkctl events --json`)")
    v = verdict(evs, t0, rows)
    print("\n== verdict ==\n" + json.dumps(v, indent=1))
    return evs, v


def cleanup(d: subprocess.Popen | None, sock: Path, cgroup_root: Path) -> None:
    for name in ("storm", "oomer"):
        sparkctl(sock, "stop", name)
    if d is not None and d.poll() is None:
        d.send_signal(signal.SIGTERM)
        d.wait(30)
    dirs = sorted((p for p in cgroup_root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) \
        if cgroup_root.exists() else []
    for cg in [*dirs, cgroup_root] if cgroup_root.exists() else []:
        if (cg / "cgroup.kill").exists():
            (cg / "cgroup.kill").write_text("1")
            time.sleep(0.2)
        cg.rmdir()
    sh("rm", "-rf", str(WORK))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--storm-seconds", type=float, default=100, help="give up on the stop rule after this long")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mount = find_cgroup2_mount()
    enforced, why = memory_controller(mount)
    print(f"kernel {os.uname().release}; python {sys.version.split()[0]}; cpus {os.cpu_count()}; {why}")
    cgroup_root = mount / "sparkd-scenario"
    cgroup = cgroup_root / "sparkd.slice" / "sparkd-storm.service"
    sock, d = WORK / "control.sock", None
    try:
        t = time.monotonic()
        files = make_files(1024 if enforced else 64)
        print(f"files (model, key, {1024 if enforced else 64} MiB thrash file) in {time.monotonic() - t:.1f} s")
        Path("/proc/sys/vm/drop_caches").write_text("1") if enforced else None  # the reader starts from disk
        listen = f"127.0.0.1:{free_port()}"
        cgroup_root.mkdir(exist_ok=True)
        d = start_sparkd(policy(cgroup_root, files, listen), args.out)
        print(sparkctl(sock, "start", "storm").stdout.strip())
        budget = engine_ready(listen, files["key"].read_text().strip())
        print(f"storm engine ready; expert cache budget {budget} bytes (GET /admin/cache with the key); shrink to {SHRINK_BUDGET}")
        (args.out / "status.json").write_text(sparkctl(sock, "status", "--json").stdout)
        t0, sampler, hog = run_storm(sock, cgroup, files, enforced, args.out, args.storm_seconds if enforced else 8)
        oom = run_oomer(sock) if enforced else None
        evs, v = report(sock, args.out, t0, sampler)
        print(f"oomer: oom_kill seen in memory.events: {oom}" if enforced else "oomer: skipped (no memory.max here)")
        if not enforced:
            ok = bool(sampler.rows) and bool(evs)
            print(f"SMOKE {'OK' if ok else 'FAILED'}: engine ready with its key, workload in the service cgroup, "
                  f"{len(sampler.rows)} samples, {len(evs)} events; pressure rules not expected to fire here")
            return 0 if ok else 2
        return 0 if v["in_order"] and v["shrink_ok"] and v["throttle_shrink_ok"] and oom else 2
    finally:
        cleanup(d, sock, cgroup_root)


if __name__ == "__main__":
    sys.exit(main())
