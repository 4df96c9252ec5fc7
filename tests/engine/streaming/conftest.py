"""Shared setup for the streaming tests: models written on a real disk (page-cache and O_DIRECT
tests are meaningless on tmpfs), a way to build a streaming model at an exact cache size, and a
page-cache probe (mincore)."""

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan as model_plan, write_model
from sparkd.engine.models import config_of, load_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.streaming.plan import SLACK_MIN_BYTES, Budget, make_plan
from sparkd.engine.streaming.store import StreamingExperts

REPO = Path(__file__).resolve().parents[3]


def fs_type(path: Path) -> str:
    """Filesystem type of the mount holding path, from /proc/self/mountinfo."""
    best, kind = "", ""
    real = str(Path(path).resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mnt = fields[4]
        fstype = fields[fields.index("-") + 1]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, fstype
    return kind


@pytest.fixture(scope="session")
def disk_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream-models")
    if fs_type(d) in ("tmpfs", "ramfs", "overlay"):
        d = REPO / ".cache" / "test-models"
        d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def tiny_models(disk_dir):
    out = {}
    for arch in TINY:
        for quant in ("Q8_0", "F32"):
            out[arch, quant] = write_model(disk_dir / f"{arch}-{quant}.gguf", model_plan(TINY[arch], quant),
                                           seed=5)[0]
    return out


def open_stream(path, slots: int, prefetch: int = 0, policy: str = "lru", direct: bool = True,
                warn=None, trace=None):
    """(LoadedModel, store) with exactly `slots` cache slots."""
    g = GGUFModel.open(path)
    cfg = config_of(g)
    probe = make_plan(g, cfg, Budget(1 << 50, "test"), 64, prefetch, batch_tokens=64, runtime_bytes=0)
    fixed = probe.model_bytes + prefetch * probe.slot_bytes + SLACK_MIN_BYTES
    plan = make_plan(g, cfg, Budget(fixed + slots * probe.slot_bytes, "test"), 64, prefetch, batch_tokens=64,
                     runtime_bytes=0)
    assert plan.cache_slots == min(slots, plan.n_experts_total)
    store = StreamingExperts(g, plan, policy, threads=4, direct=direct, warn=warn, trace=trace)
    return load_model(g, store), store


def resident_pages(path) -> int:
    """Pages of path in the page cache (mincore over a mapping made only to ask)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = ctypes.create_string_buffer(pages)
        addr = _map_address(m)
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(b & 1 for b in vec.raw)


def _map_address(m: mmap.mmap) -> int:
    # a read-only mapping cannot export a writable buffer; numpy reads its address without one
    import numpy as np
    return np.frombuffer(m, dtype=np.uint8).ctypes.data


def drop_page_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
