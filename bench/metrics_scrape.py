"""Scrape time of sparkd's collector with N services (default 10), each a real cgroup with a
running process under the cgroup2 mount (root), or literal files in a tmp dir (--literal).

    PYTHONPATH=$PWD python bench/metrics_scrape.py [--services 10] [--scrapes 200] [--literal]

GPU: an NVML stand-in (tests/fake_nvml.py) with one process per service, so the per-service GPU
sum (cgroup.procs walk) is part of the measurement; real NVML init time is not (see
docs/performance.md). Prints median, p95 and max wall time of a full render (generate_latest), and its median CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from sparkd.metrics import ServiceView, SparkdCollector, SparkdCounters  # noqa: E402
from sparkd.system.gpu import GpuReader  # noqa: E402
from sparkd.usage import find_cgroup2_mount  # noqa: E402

LITERAL = {"memory.current": "1073741824\n", "memory.max": "2147483648\n", "memory.peak": "1610612736\n",
           "memory.stat": "anon 805306368\nfile 268435456\n" + "".join(f"k{i} {i}\n" for i in range(40)),
           "memory.events": "low 0\nhigh 3\nmax 7\noom 1\noom_kill 2\noom_group_kill 1\n",
           "memory.pressure": "some avg10=1.00 avg60=2.00 avg300=3.00 total=900\nfull avg10=0.50 avg60=1.00 avg300=2.00 total=400\n"}


def real_cgroups(n: int) -> tuple[Path, list[Path], list[subprocess.Popen]]:
    root = Path(find_cgroup2_mount()) / f"sparkd-bench-{os.getpid()}"
    root.mkdir()
    dirs, procs = [], []
    for i in range(n):
        d = root / f"sparkd-s{i}.service"
        d.mkdir()
        p = subprocess.Popen(["sleep", "600"])
        (d / "cgroup.procs").write_text(str(p.pid))
        dirs.append(d)
        procs.append(p)
    return root, dirs, procs


def literal_cgroups(n: int, tmp: Path) -> list[Path]:
    dirs = []
    for i in range(n):
        d = tmp / f"sparkd-s{i}.service"
        d.mkdir()
        for name, text in LITERAL.items():
            (d / name).write_text(text)
        (d / "cgroup.procs").write_text(f"{100000 + i}\n")
        dirs.append(d)
    return dirs


def measure(dirs: list[Path], pids: list[int], scrapes: int) -> list[float]:
    views = [ServiceView(f"s{i}", "active", "cgroupfs", f"sparkd-s{i}.service", d, 8 << 30, True, "success")
             for i, d in enumerate(dirs)]
    nvml = FakeNvml([FakeGpu("NVIDIA H200", 141 << 30, 3 << 30, compute=[(pid, 1 << 30) for pid in pids])])
    counters = SparkdCounters()
    for i in range(len(dirs)):
        counters.service_started(f"s{i}")
    registry = CollectorRegistry()
    registry.register(SparkdCollector(lambda: views, counters, gpu_reader=GpuReader(nvml).read,
                                      reserve_bytes=16 << 30, started_at=time.time()))
    generate_latest(registry)  # warm caches and imports
    times, cpu = [], []
    for _ in range(scrapes):
        t0, c0 = time.perf_counter(), time.process_time()
        body = generate_latest(registry)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    # CPU time says what a scrape costs; wall time also counts waiting for a busy machine's cores.
    print(f"exposition: {len(body)} bytes, {len(body.splitlines())} lines; "
          f"CPU time median {statistics.median(cpu) * 1000:.2f} ms")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--literal", action="store_true", help="literal files in a tmp dir instead of real cgroups")
    args = ap.parse_args()
    if args.literal:
        with tempfile.TemporaryDirectory() as tmp:
            dirs = literal_cgroups(args.services, Path(tmp))
            times = measure(dirs, [100000 + i for i in range(args.services)], args.scrapes)
    else:
        root, dirs, procs = real_cgroups(args.services)
        try:
            times = measure(dirs, [p.pid for p in procs], args.scrapes)
        finally:
            for p in procs:
                p.kill()
                p.wait()
            for d in dirs:
                d.rmdir()
            root.rmdir()
    ms = sorted(t * 1000 for t in times)
    p95 = ms[int(0.95 * (len(ms) - 1))]
    mode = "literal files" if args.literal else "real cgroups"
    print(f"{args.services} services ({mode}), {args.scrapes} scrapes: median {statistics.median(ms):.2f} ms, "
          f"p95 {p95:.2f} ms, max {ms[-1]:.2f} ms")


if __name__ == "__main__":
    main()
