"""The scenario's workload (stdlib only), run inside a service cgroup.

leak FILE STEP_MIB INTERVAL_SECONDS MAX_MIB: wait for a line on stdin (the scenario moves this
process into the service's cgroup first), then re-read FILE through the page cache in a loop
(a working set that refaults once the cache is squeezed) while an anonymous hog grows by STEP_MIB
every INTERVAL_SECONDS, every page touched, up to MAX_MIB (a safety cap: the cgroup's memory.high
is meant to throttle it long before). Prints one line per step: "anon_mib=N".
oom MIB: allocate MIB at once (past memory.max: the kernel's OOM killer ends it).
"""

import sys
import threading
import time

PAGE = 4096
READ_CHUNK = 1 << 20


def reread(path: str) -> None:
    while True:
        with open(path, "rb", buffering=0) as f:
            while f.read(READ_CHUNK):
                pass


def touched(mib: int) -> bytearray:
    block = bytearray(mib << 20)  # calloc'd: charged to the cgroup only when touched
    for i in range(0, len(block), PAGE):
        block[i] = 1
    return block


def leak(path: str, step_mib: int, interval_seconds: float, max_mib: int) -> None:
    sys.stdin.readline()
    threading.Thread(target=reread, args=(path,), daemon=True).start()
    held, anon_mib = [], 0
    while True:
        if anon_mib + step_mib <= max_mib:
            held.append(touched(step_mib))
            anon_mib += step_mib
            print(f"{time.time():.3f} anon_mib={anon_mib}", flush=True)
        time.sleep(interval_seconds)


def main() -> None:
    if sys.argv[1] == "oom":
        held = touched(int(sys.argv[2]))
        while held:  # kept alive until the OOM killer comes
            time.sleep(3600)
    else:
        leak(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))


main()
