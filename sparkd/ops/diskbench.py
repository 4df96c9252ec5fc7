"""Disk read bandwidth by block size x queue depth, the way the engine's expert streaming reads:
O_DIRECT preadv calls into page-aligned buffers, `queue depth` of them in flight at once (one
thread each; preadv releases the GIL, so the threads really overlap in the kernel).

O_DIRECT bypasses the page cache, so neither the numbers nor anyone else's cached pages are
touched. Where the filesystem refuses O_DIRECT (ramfs, some FUSE), reads fall back to buffered
I/O; then only a temporary file this tool wrote gets its cache dropped (posix_fadvise DONTNEED)
before each configuration — never an existing file, whose cached pages may belong to a running
engine — and the result carries a warning.
"""

from __future__ import annotations

import itertools
import mmap
import os
import random
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import SparkdError
from ..sizes import format_size

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_BLOCK_BYTES = (128 * KIB, 256 * KIB, 512 * KIB, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB)
DEFAULT_QUEUE_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
TEMP_PREFIX = ".sparkd-disk-bench-"
# The temporary file is written in 16 MiB chunks and sized in whole MiB: every write stays
# aligned for O_DIRECT (which needs offsets and lengths in logical-block multiples).
WRITE_CHUNK_BYTES = 16 * MIB
# Leave room on the filesystem: a benchmark must not be what fills a shared disk.
FREE_SPACE_MARGIN_BYTES = 1 << 30
MOUNTINFO = Path("/proc/self/mountinfo")
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


class DiskBenchError(SparkdError):
    """The benchmark could not prepare, read or write its file."""


class Interrupted(DiskBenchError):
    """Ctrl-C, SIGTERM or SIGHUP while measuring; the temporary file is removed anyway."""


@dataclass
class Target:
    path: Path
    region_bytes: int  # bytes from offset 0 that are read
    temporary: bool  # written (and removed) by this tool
    filesystem: str | None = None
    mode: str = "o_direct"  # or "buffered" where O_DIRECT is refused
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Measurement:
    block_bytes: int
    queue_depth: int
    bytes_read: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes_per_second": round(self.bytes_per_second), "mb_per_second": round(self.bytes_per_second / 1e6, 1)}


def filesystem_of(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The filesystem type of the mount holding path (longest matching mount point)."""
    real = os.path.realpath(path)
    best, fstype = "", None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, right.split()[0]
    return fstype


def _aligned_buffer(length: int) -> mmap.mmap:
    # Anonymous mmap memory starts on a page boundary, which satisfies O_DIRECT's alignment.
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def open_for_read(target: Target) -> int:
    """An fd for reading target; sets target.mode to 'buffered' (with a warning) if O_DIRECT is refused."""
    try:
        return os.open(target.path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno != 22:  # EINVAL: the filesystem does not do O_DIRECT
            raise DiskBenchError(f"could not open {target.path} for reading: {exc.strerror}") from exc
    target.mode = "buffered"
    if target.temporary:
        target.warnings.append(f"O_DIRECT REFUSED by {target.filesystem or 'this filesystem'}: measured buffered reads, "
                               "dropping this tool's own file from the page cache before each configuration")
    else:
        target.warnings.append(f"O_DIRECT REFUSED by {target.filesystem or 'this filesystem'}: measured buffered reads; "
                               f"{target.path}'s cached pages were left alone (others may use them), so numbers may "
                               "be page-cache speed, not disk speed")
    try:
        return os.open(target.path, os.O_RDONLY)
    except OSError as exc:
        raise DiskBenchError(f"could not open {target.path} for reading: {exc.strerror}") from exc


def drop_own_cache(fd: int, target: Target) -> None:
    """Buffered fallback only, and only for the file this tool wrote."""
    if target.mode == "buffered" and target.temporary:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _offsets(pattern: str, region_bytes: int, block_bytes: int, worker: int, shared: itertools.count) -> Callable[[], int]:
    blocks = region_bytes // block_bytes
    if pattern == "random":
        rng = random.Random(worker)  # reproducible offsets for a given configuration
        return lambda: rng.randrange(blocks) * block_bytes
    # sequential: the workers take the next block in turn (next() on a count is atomic under the GIL)
    return lambda: (next(shared) % blocks) * block_bytes


def measure(fd: int, target: Target, block_bytes: int, queue_depth: int, seconds: float, pattern: str,
            stop: threading.Event) -> Measurement:
    """Keep queue_depth reads of block_bytes in flight for `seconds`; bytes read / wall time."""
    drop_own_cache(fd, target)
    shared = itertools.count()
    totals = [0] * queue_depth
    errors: list[OSError] = []
    ready = threading.Barrier(queue_depth + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        buf = _aligned_buffer(block_bytes)
        next_offset = _offsets(pattern, target.region_bytes, block_bytes, index, shared)
        ready.wait()
        try:
            while not stop.is_set() and time.monotonic() < deadline[0]:
                totals[index] += os.preadv(fd, [buf], next_offset())
        except OSError as exc:
            errors.append(exc)
        finally:
            buf.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(queue_depth)]
    for t in threads:
        t.start()
    start = time.monotonic()
    deadline[0] = start + seconds
    ready.wait()
    for t in threads:
        while t.is_alive():
            t.join(0.1)  # short joins keep Ctrl-C deliverable to the main thread
    elapsed = time.monotonic() - start
    if errors:
        raise DiskBenchError(f"could not read {target.path} ({format_size(block_bytes)} blocks, queue depth {queue_depth}): "
                             f"{errors[0].strerror}")
    if stop.is_set():
        raise Interrupted("interrupted")
    return Measurement(block_bytes, queue_depth, sum(totals), elapsed)


def best_of(results: list[Measurement]) -> Measurement:
    return max(results, key=lambda m: m.bytes_per_second)


def file_size(path: Path) -> int:
    st = path.stat()
    if stat.S_ISBLK(st.st_mode):
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    return st.st_size


def check_free_space(directory: Path, size_bytes: int) -> None:
    vfs = os.statvfs(directory)
    if vfs.f_blocks == 0:  # ramfs and the like report no capacity at all: nothing to check against
        return
    free = vfs.f_bavail * vfs.f_frsize
    if free < size_bytes + FREE_SPACE_MARGIN_BYTES:
        raise DiskBenchError(
            f"could not write a {format_size(size_bytes)} test file in {directory}: only {format_size(free)} free "
            f"(keeping {format_size(FREE_SPACE_MARGIN_BYTES)} spare); use a smaller --size or an existing large file"
        )


def create_temp_file(directory: Path) -> Path:
    """An empty, uniquely named file in directory (created without O_DIRECT: an O_CREAT|O_DIRECT open
    that fails on such a filesystem still leaves the file behind)."""
    try:
        fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=directory)
    except OSError as exc:
        raise DiskBenchError(f"could not create a test file in {directory}: {exc.strerror}") from exc
    os.close(fd)
    return Path(name)


def fill_temp_file(target: Target, on_bytes: Callable[[int], None], stop: threading.Event) -> None:
    """Write target.region_bytes of random data (incompressible: some drives compress)."""
    try:
        fd = os.open(target.path, os.O_WRONLY | os.O_DIRECT)
        direct = True
    except OSError:
        fd = os.open(target.path, os.O_WRONLY)
        direct = False
    buf = _aligned_buffer(WRITE_CHUNK_BYTES)
    buf.write(os.urandom(WRITE_CHUNK_BYTES))
    try:
        offset = 0
        while offset < target.region_bytes:
            if stop.is_set():
                raise Interrupted("interrupted")
            length = min(WRITE_CHUNK_BYTES, target.region_bytes - offset)
            offset += os.pwritev(fd, [memoryview(buf)[:length]], offset)
            on_bytes(offset)
        if not direct:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        raise DiskBenchError(f"could not write test file {target.path}: {exc.strerror}") from exc
    finally:
        buf.close()
        os.close(fd)


def prepare_target(path: Path, size_bytes: int, largest_block_bytes: int, mountinfo: Path = MOUNTINFO) -> Target:
    """An existing file or block device is read as is (its first size_bytes); a directory gets a
    temporary file of size_bytes, created here and filled by fill_temp_file."""
    if not path.exists():
        raise DiskBenchError(f"could not find {path}: give an existing large file to read, or a directory to write "
                             "a temporary test file in")
    fstype = filesystem_of(path, mountinfo)
    if path.is_dir():
        region = size_bytes // MIB * MIB
        if region < largest_block_bytes:
            raise DiskBenchError(f"could not benchmark with --size {format_size(size_bytes)}: it must be at least the "
                                 f"largest block size, {format_size(largest_block_bytes)}")
        check_free_space(path, region)
        target = Target(create_temp_file(path), region, True, fstype)
    else:
        available = file_size(path)
        region = min(available, size_bytes) // largest_block_bytes * largest_block_bytes
        if region < largest_block_bytes:
            raise DiskBenchError(f"could not benchmark {path}: it holds {format_size(available)}, less than the largest "
                                 f"block size {format_size(largest_block_bytes)}; use a larger file or smaller --block-sizes")
        target = Target(path, region, False, fstype)
    if fstype in MEMORY_FILESYSTEMS:
        target.warnings.append(f"{path} is on {fstype}: its data lives in memory, so this measures memory, not a disk")
    return target


def remove_temp_file(target: Target | None) -> None:
    if target is not None and target.temporary:
        try:
            target.path.unlink()
        except FileNotFoundError:
            pass
