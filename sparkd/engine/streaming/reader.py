"""Reads experts from the model files into arena slots: O_DIRECT, 4 KiB-bracketed, chunked,
many reads in flight from a thread pool with two priorities (demand before prefetch).

Where the filesystem refuses O_DIRECT (tmpfs, some FUSE mounts) reads are buffered and followed by
posix_fadvise(DONTNEED) so the page cache does not keep them; that is said once, loudly.
A short read, an I/O error or a file that changed since it was opened is an ExpertReadError naming
the file, the offset and the expert: never zeros.
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sparkd.engine.errors import ModelError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.streaming.arena import Arena
from sparkd.engine.streaming.plan import ALIGN_BYTES

CHUNK_BYTES = 1 << 20  # large enough for full NVMe request sizes, small enough to interleave
DEMAND, PREFETCH = 0, 1


class ExpertReadError(ModelError):
    """An expert could not be read; path, offset, layer and expert say where."""

    def __init__(self, message: str, *, path: Path, offset: int, layer: int, expert: int):
        super().__init__(message, path=path, offset=offset)
        self.layer, self.expert = layer, expert


@dataclass(frozen=True)
class Part:
    """One of an expert's tensors (gate, up or down) as it lies in the file and in a slot."""

    path: Path
    offset: int  # exact data offset in the file
    nbytes: int
    read_start: int  # ALIGN_BYTES-aligned file offset the read starts at
    read_len: int  # aligned length read
    slot_offset: int  # where read_start lands in the slot

    @property
    def data_offset(self) -> int:
        """Where the tensor's bytes start within the slot."""
        return self.slot_offset + self.offset - self.read_start


@dataclass(frozen=True)
class _FileId:
    device: int
    inode: int
    size: int
    mtime_ns: int


class ExpertRead:
    """One expert's outstanding reads; wait() returns or raises the first error."""

    def __init__(self, layer: int, expert: int, slot: int, n_chunks: int, priority: int):
        self.layer, self.expert, self.slot, self.priority = layer, expert, slot, priority
        self._left, self._lock, self._done = n_chunks, threading.Lock(), threading.Event()
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.finished = 0.0
        if n_chunks == 0:
            self._done.set()

    def chunk_done(self, error: BaseException | None) -> None:
        with self._lock:
            self.error = self.error or error
            self._left -= 1
            if self._left == 0:
                self.finished = time.perf_counter()
                self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error


class ExpertReader:
    """Opens every shard for direct reads and serves (slot, parts) read requests."""

    def __init__(self, g: GGUFModel, arena: Arena, threads: int = 8, direct: bool = True,
                 warn: Callable[[str], None] | None = None):
        self.arena, self.direct = arena, direct
        self._warn = warn or (lambda msg: print(f"sparkd-engine: WARNING: {msg}", file=sys.stderr))
        self._fds: dict[Path, int] = {}
        self._ids: dict[Path, _FileId] = {}
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self.bytes_read = 0
        self._lock = threading.Lock()
        try:
            for shard in g.shards:
                st = os.fstat(shard.fd)  # the inode the model was validated from
                self._ids[shard.path] = _FileId(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                self._fds[shard.path] = self._open(shard.path, st.st_ino)
        except BaseException:
            self.close()
            raise
        self._workers = [threading.Thread(target=self._work, name=f"expert-read-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._workers:
            t.start()

    # --- files ---------------------------------------------------------------------------------
    def _open(self, path: Path, inode: int) -> int:
        if self.direct:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
                if self._probe(fd):
                    return self._same_inode(fd, path, inode)
                os.close(fd)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise ModelError(f"could not open model file {path} for direct reads: "
                                     f"{exc.strerror}", path=path) from exc
            self.direct = False
            self._warn(f"O_DIRECT is refused for {path} (tmpfs or a filesystem without direct I/O): "
                       "reading through the page cache and dropping pages after each read "
                       "(posix_fadvise DONTNEED); expect lower bandwidth and page-cache churn")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ModelError(f"could not open model file {path}: {exc.strerror}", path=path) from exc
        return self._same_inode(fd, path, inode)

    def _probe(self, fd: int) -> bool:
        buf = self.arena.buffer(0, 0, ALIGN_BYTES) if self.arena.n_slots else None
        if buf is None:
            return True
        try:
            os.preadv(fd, [buf], 0)
            return True
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False
            raise

    def _same_inode(self, fd: int, path: Path, inode: int) -> int:
        if os.fstat(fd).st_ino != inode:
            os.close(fd)
            raise ModelError(f"could not open model file {path}: it was replaced after the model was "
                             "opened; restart with the new file", path=path)
        return fd

    def check_unchanged(self, path: Path, layer: int, expert: int, offset: int) -> None:
        """The file at path must still be the one opened: same inode, size and mtime."""
        want = self._ids[path]
        try:
            st = os.stat(path)
            now = _FileId(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError as exc:
            now, why = None, exc.strerror
        if now == want:
            return
        why = (why if now is None else
               f"inode {want.inode}->{now.inode}, size {want.size}->{now.size}, "
               f"mtime_ns {want.mtime_ns}->{now.mtime_ns}")
        raise ExpertReadError(
            f"could not read expert {expert} of layer {layer} from {path} at offset {offset}: the file "
            f"changed since the model was opened ({why}); restart the engine on the new file",
            path=path, offset=offset, layer=layer, expert=expert)

    # --- reads ---------------------------------------------------------------------------------
    def submit(self, layer: int, expert: int, slot: int, parts: list[Part], priority: int) -> ExpertRead:
        chunks = []
        for p in parts:
            size = self._ids[p.path].size
            for start in range(0, p.read_len, CHUNK_BYTES):
                n = min(CHUNK_BYTES, p.read_len - start)
                need = max(0, min(n, size - (p.read_start + start)))  # the bracket may pass EOF
                if p.read_start + start < p.offset + p.nbytes:
                    chunks.append((p, start, n, need))
        read = ExpertRead(layer, expert, slot, len(chunks), priority)
        for chunk in chunks:
            self._queue.put((priority, next(self._seq), read, chunk))
        return read

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or item[2] is None:
                return
            _, _, read, (part, start, n, need) = item
            try:
                self._read_chunk(read, part, start, n, need)
                read.chunk_done(None)
            except BaseException as exc:  # every chunk completes, so no waiter hangs
                read.chunk_done(exc)

    def _read_chunk(self, read: ExpertRead, part: Part, start: int, n: int, need: int) -> None:
        fd = self._fds[part.path]
        buf = self.arena.buffer(read.slot, part.slot_offset + start, n)
        offset = part.read_start + start
        got = 0
        while got < need:
            try:
                k = os.preadv(fd, [buf[got:]], offset + got)
            except OSError as exc:
                raise ExpertReadError(
                    f"could not read expert {read.expert} of layer {read.layer} from {part.path} at "
                    f"offset {offset + got}: {exc.strerror}", path=part.path, offset=offset + got,
                    layer=read.layer, expert=read.expert) from exc
            if k == 0:
                raise ExpertReadError(
                    f"could not read expert {read.expert} of layer {read.layer} from {part.path} at "
                    f"offset {offset + got}: the file ends there ({need - got} bytes short); it was "
                    "truncated after the model was opened", path=part.path, offset=offset + got,
                    layer=read.layer, expert=read.expert)
            got += k
        if not self.direct:
            os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)
        with self._lock:
            self.bytes_read += got

    def close(self) -> None:
        for _ in getattr(self, "_workers", ()):
            self._queue.put((-1, next(self._seq), None, None))
        for t in getattr(self, "_workers", ()):
            t.join()
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
