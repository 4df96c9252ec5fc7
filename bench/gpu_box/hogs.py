"""The scenario's workload, run as a sparkd service: an anonymous hog that grows to `anon_max_mib`
(16 MiB a second, every page touched) beside readers that stream a file larger than memory.max
and re-read a small hot file through the page cache. `oom` mode: allocate past the limit at once."""

import os
import sys
import threading
import time

CHUNK = 16 << 20


def reader(path: str) -> None:
    while True:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass


def main() -> None:
    mode = sys.argv[1]
    held = []
    if mode == "oom":
        for _ in range(int(sys.argv[2]) // 16):
            held.append(bytearray(os.urandom(1 << 10)) * (CHUNK >> 10))
        time.sleep(3600)
    anon_start_mib, anon_max_mib, big, hot = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    for path in (big, big, hot, hot):
        threading.Thread(target=reader, args=(path,), daemon=True).start()
    size = 0
    while True:
        if size < anon_max_mib << 20:
            step = CHUNK if size >= anon_start_mib << 20 else anon_start_mib << 20
            held.append(bytearray(step))
            for i in range(0, step, 4096):
                held[-1][i] = 1
            size += step
        time.sleep(1)


main()
