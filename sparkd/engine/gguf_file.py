"""A GGUF model: one file, or the shards of a split model as one model.

Only the header is parsed at open (gguf_header); tensor data is read on demand with
os.pread into fresh buffers, never memory-mapped, so opening a 600 GB model costs a few MiB.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, Keys

from sparkd.engine.errors import (GGUFFormatError, MissingKeyError, MissingShardError, MissingTensorError,
                                  ModelError, ShapeMismatchError, TensorPastEndError, TruncatedFileError,
                                  UnsupportedArchitectureError, UnsupportedTypeError)
from sparkd.engine.gguf_header import RawTensorEntry, ShardHeader, read_shard_header

# llama.cpp's split naming (llama_split_path / gguf-split): <prefix>-00001-of-00003.gguf
_SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_REQUIRED = object()


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives. shape is in torch order (ggml's ne reversed)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    path: Path  # the shard holding the data
    offset: int  # absolute byte offset of the data in that shard
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    def leading_slice(self, index: int) -> tuple[int, int]:
        """(absolute offset, nbytes) of slice `index` along the first torch dimension, e.g. one
        expert of a stacked [experts, rows, cols] tensor: rows of blocks are contiguous."""
        count = self.shape[0] if self.shape else 1
        if not 0 <= index < count:
            raise IndexError(f"slice {index} out of range for tensor {self.name!r} of shape {list(self.shape)}")
        per_slice = self.nbytes // count
        return self.offset + index * per_slice, per_slice


@dataclass(frozen=True)
class Shard:
    """One file of the model. fd stays open until the model is closed, so a file replaced
    on disk after open is still read from the inode that was validated."""

    path: Path
    fd: int
    size_bytes: int
    version: int
    device: int
    inode: int


def shard_paths(first: Path, count: int) -> list[Path]:
    """All shard paths of a split model from its first shard's name."""
    match = _SHARD_NAME.match(first.name)
    if match is None or int(match["no"]) != 1:
        raise GGUFFormatError(
            f"could not open split model {first}: its metadata says split.count = {count} but the "
            f"name does not follow <prefix>-00001-of-{count:05d}.gguf, so the other shards cannot "
            f"be found; keep the names gguf-split gave them", path=first)
    return [first.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _tensor_info(header: ShardHeader, entry: RawTensorEntry) -> TensorInfo:
    path, name, at = header.path, entry.name, header.data_start + entry.data_offset
    try:
        ggml_type = GGMLQuantizationType(entry.type_id)
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise UnsupportedTypeError(
            f"could not index tensor {name!r} in {path}: unknown ggml type id {entry.type_id} "
            f"(header entry at offset {entry.entry_offset}); the file needs a newer engine",
            path=path, tensor=name, offset=entry.entry_offset) from None
    row = entry.ne[0] if entry.ne else 1
    if row % block_size:
        raise ShapeMismatchError(
            f"could not index tensor {name!r} in {path}: row length {row} is not a multiple of "
            f"{ggml_type.name}'s block size {block_size}", path=path, tensor=name, offset=at)
    n_elements = 1
    for dim in entry.ne:
        n_elements *= dim
    nbytes = n_elements // block_size * type_size
    if entry.data_offset % header.alignment:
        raise GGUFFormatError(
            f"could not index tensor {name!r} in {path}: data offset {at} is not aligned to "
            f"{header.alignment} bytes", path=path, tensor=name, offset=at)
    if at + nbytes > header.size_bytes:
        raise TensorPastEndError(
            f"could not index tensor {name!r} in {path}: its data ({nbytes} bytes of "
            f"{ggml_type.name}) at offset {at} runs to byte {at + nbytes} but the file ends at byte "
            f"{header.size_bytes}; the file is truncated or damaged", path=path, tensor=name, offset=at)
    return TensorInfo(name, tuple(reversed(entry.ne)), ggml_type, path, at, nbytes)


def _check_no_overlap(path: Path, infos: list[TensorInfo]) -> None:
    """Shape x type must fit before the next tensor: a wrong shape or type shows up as overlap."""
    ordered = sorted(infos, key=lambda info: info.offset)
    for this, nxt in zip(ordered, ordered[1:]):
        if this.offset + this.nbytes > nxt.offset:
            raise ShapeMismatchError(
                f"could not index tensor {this.name!r} in {path}: shape {list(this.shape)} as "
                f"{this.ggml_type.name} needs {this.nbytes} bytes from offset {this.offset}, which "
                f"overlaps tensor {nxt.name!r} at offset {nxt.offset}; shape or type is wrong",
                path=path, tensor=this.name, offset=this.offset)


_PAGE_BYTES = 4096  # the page cache's unit (x86-64, arm64 4K kernels)


class GGUFModel:
    """Metadata and tensor index of a model; reads tensor bytes with pread. Close when done."""

    def __init__(self, path: Path, shards: list[Shard], metadata: dict[str, Any],
                 tensors: dict[str, TensorInfo]):
        self.path = path
        self.shards = shards
        self.metadata = metadata
        self.tensors = tensors
        self._fds = {shard.path: shard.fd for shard in shards}

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFModel":
        """Open a .gguf file, or the first shard of a split model meaning all its shards."""
        path = Path(path)
        shards: list[Shard] = []
        try:
            first = _open_shard(path, shards)
            count = _split_field(first, Keys.Split.LLM_KV_SPLIT_COUNT, 1)
            no = _split_field(first, Keys.Split.LLM_KV_SPLIT_NO, 0)
            if no != 0:
                raise ModelError(f"could not open split model {path}: this is shard {no + 1} of "
                                 f"{count}; open the first shard (…-00001-of-{count:05d}.gguf)", path=path)
            headers = [first]
            if count > 1:
                headers += [_open_other_shard(p, i, count, shards)
                            for i, p in enumerate(shard_paths(path, count)[1:], start=1)]
            tensors = _index(headers, first)
            return cls(path, shards, first.metadata, tensors)
        except BaseException:
            for shard in shards:
                os.close(shard.fd)
            raise

    # --- metadata -------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.field(Keys.General.ARCHITECTURE)

    def field(self, key: str, default: Any = _REQUIRED) -> Any:
        """Metadata value for key; without a default a missing key is a MissingKeyError."""
        if key in self.metadata:
            return self.metadata[key]
        if default is _REQUIRED:
            raise MissingKeyError(f"could not read metadata key {key!r} from {self.path}: the key is "
                                  f"missing", path=self.path)
        return default

    def arch_field(self, suffix: str, default: Any = _REQUIRED) -> Any:
        """Metadata value for '<arch>.<suffix>', e.g. arch_field('block_count')."""
        return self.field(f"{self.arch}.{suffix}", default)

    def require_architecture(self, supported: Iterable[str]) -> str:
        """The architecture, or UnsupportedArchitectureError listing the supported ones."""
        supported = sorted(supported)
        arch = self.arch
        if arch not in supported:
            raise UnsupportedArchitectureError(
                f"could not load model {self.path}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(supported)})", path=self.path, arch=arch, supported=supported)
        return arch

    # --- tensors ----------------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(f"could not find tensor {name!r} in {self.path}: the model has "
                                     f"no such tensor", path=self.path, tensor=name) from None

    @property
    def total_bytes(self) -> int:
        """Sum of all tensors' data bytes."""
        return sum(info.nbytes for info in self.tensors.values())

    @property
    def file_bytes(self) -> int:
        return sum(shard.size_bytes for shard in self.shards)

    def read_bytes(self, info: TensorInfo) -> np.ndarray:
        """The tensor's raw bytes as a fresh uint8 array, read with pread (no mapping, no cache)."""
        out = np.empty(info.nbytes, dtype=np.uint8)
        self.read_into(info, 0, memoryview(out))
        return out

    def read_into(self, info: TensorInfo, start: int, out: memoryview) -> None:
        """Bytes [start, start + len(out)) of the tensor's data into out (a chunk of it)."""
        fd = self._fds[info.path]
        done, want = 0, len(out)
        while done < want:
            at = info.offset + start + done
            try:
                n = os.preadv(fd, [out[done:]], at)
            except OSError as exc:
                raise ModelError(f"could not read tensor {info.name!r} from {info.path} at offset "
                                 f"{at}: {exc.strerror}", path=info.path, tensor=info.name, offset=at) from exc
            if n == 0:
                raise TruncatedFileError(
                    f"could not read tensor {info.name!r} from {info.path} at offset "
                    f"{at}: the file ends there ({want - done} bytes short); "
                    f"it was truncated after the model was opened", path=info.path,
                    tensor=info.name, offset=at)
            done += n

    def drop_cached(self, info: TensorInfo, start: int, nbytes: int) -> None:
        """Drop the page cache over bytes [start, start + nbytes) of the tensor's data, pages it
        shares with a neighbour too (the kernel keeps partial pages): a cgroup is charged for
        cached pages until the kernel reclaims them."""
        first = (info.offset + start) // _PAGE_BYTES * _PAGE_BYTES
        end = -(-(info.offset + start + nbytes) // _PAGE_BYTES) * _PAGE_BYTES
        os.posix_fadvise(self._fds[info.path], first, end - first, os.POSIX_FADV_DONTNEED)

    def drop_page_cache(self) -> None:
        """Drop every shard's cached pages (after a buffered load; see drop_cached)."""
        for fd in self._fds.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read_ahead(self, on: bool) -> None:
        """Let the kernel read ahead of this model's reads (the default), or not: a reader that
        drops what it read would leave the read-ahead pages behind, charged to its cgroup."""
        for fd in self._fds.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL if on else os.POSIX_FADV_RANDOM)

    def close(self) -> None:
        for shard in self.shards:
            os.close(shard.fd)
        self.shards, self._fds = [], {}

    def __enter__(self) -> "GGUFModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFModel({str(self.path)!r}, shards={len(self.shards)}, tensors={len(self.tensors)})"


def _open_shard(path: Path, shards: list[Shard]) -> ShardHeader:
    """Open path read-only, append it to shards (so the caller can close it), parse its header."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ModelError(f"could not open model file {path}: {exc.strerror}", path=path) from exc
    st = os.fstat(fd)
    shards.append(Shard(path, fd, st.st_size, 0, st.st_dev, st.st_ino))
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"could not open model file {path}: not a regular file", path=path)
    header = read_shard_header(fd, path)
    shards[-1] = Shard(path, fd, st.st_size, header.version, st.st_dev, st.st_ino)
    return header


def _open_other_shard(path: Path, index: int, count: int, shards: list[Shard]) -> ShardHeader:
    if not path.exists():
        raise MissingShardError(f"could not open split model: shard {index + 1} of {count}, {path}, "
                                f"is missing; all shards must sit in one directory", path=path)
    header = _open_shard(path, shards)
    no = _split_field(header, Keys.Split.LLM_KV_SPLIT_NO, None)
    got_count = _split_field(header, Keys.Split.LLM_KV_SPLIT_COUNT, None)
    if no != index or got_count != count:
        raise GGUFFormatError(f"could not open split model: {path} says it is shard "
                              f"{None if no is None else no + 1} of {got_count}, expected shard "
                              f"{index + 1} of {count}; shards of different models mixed?", path=path)
    return header


def _split_field(header: ShardHeader, key: str, default: Any) -> Any:
    value = header.metadata.get(key, default)
    if value is not default and not isinstance(value, int):
        raise GGUFFormatError(f"could not open {header.path}: {key} = {value!r} is not an integer",
                              path=header.path)
    return value


def _index(headers: list[ShardHeader], first: ShardHeader) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for header in headers:
        infos = [_tensor_info(header, entry) for entry in header.entries]
        _check_no_overlap(header.path, infos)
        for info in infos:
            if info.name in tensors:
                raise GGUFFormatError(
                    f"could not index tensor {info.name!r}: it appears in {tensors[info.name].path} "
                    f"and again in {info.path}", path=info.path, tensor=info.name, offset=info.offset)
            tensors[info.name] = info
    expected = first.metadata.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if expected is not None and expected != len(tensors):
        raise GGUFFormatError(f"could not open split model {first.path}: its shards hold "
                              f"{len(tensors)} tensors but split.tensors.count says {expected}",
                              path=first.path)
    return tensors
