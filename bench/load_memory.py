"""Host memory while a model's trunk loads: anonymous RSS (heap, tensors, buffers; RssAnon +
RssShmem) sampled every 2 ms around `load_model(MODEL, device=D)`, as one JSON line:
baseline_bytes (after imports, before the load), peak_bytes, after_bytes (the network built),
peak_over_baseline_bytes and peak_over_after_bytes (the load's transient above its result).

Run it in a fresh process per measurement. --device meta builds the device path without a GPU
(device tensors take no memory), so what it reports is what the loader holds on the host; cuda
measures the real thing. File-backed pages are left out: shared libraries fault in by how much
of them the page cache holds, not by what the loader does.

    PYTHONPATH=$PWD python3 bench/load_memory.py MODEL --device meta
"""

from __future__ import annotations

import argparse
import json
import threading
import time

_STATUS = "/proc/self/status"


def anon_bytes(status: str = _STATUS) -> int:
    total = 0
    with open(status) as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


class PeakSampler:
    """The highest anon RSS seen between start() and stop()."""

    def __init__(self, interval_seconds: float = 0.002):
        self.interval_seconds, self.peak_bytes = interval_seconds, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, anon_bytes())
            time.sleep(self.interval_seconds)

    def start(self) -> PeakSampler:
        self.peak_bytes = anon_bytes()
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, anon_bytes())
        return self.peak_bytes


def measure(model: str, device: str) -> dict:
    import torch

    from sparkd.engine.models import load_model
    from sparkd.engine.streaming.session import limit_allocator_slack

    limit_allocator_slack()  # as open_streaming does: freed tensors go back to the kernel
    # torch's one-time set-up of a broadcasting op (33 MiB on meta here) and of cat (37 MiB on
    # meta: its Python meta kernel; the load's fused QKV stack is a cat) is runtime, not load
    torch.ones(2, 2, device=device).mul_(torch.ones(2, 1, device=device))
    torch.cat([torch.ones(2, dtype=torch.uint8, device=device)] * 2)
    baseline = anon_bytes()
    sampler = PeakSampler().start()
    m = load_model(model, device=torch.device("meta") if device == "meta" else device)
    peak = sampler.stop()
    after = anon_bytes()
    m.close()
    return {"device": device, "baseline_bytes": baseline, "peak_bytes": peak, "after_bytes": after,
            "peak_over_baseline_bytes": peak - baseline, "peak_over_after_bytes": peak - after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="meta")
    args = ap.parse_args()
    print(json.dumps(measure(args.model, args.device)))


if __name__ == "__main__":
    main()
