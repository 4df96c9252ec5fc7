"""Parse one GGUF file's header (metadata and tensor index) with buffered preads.

Why not gguf.GGUFReader: it memory-maps the whole file (expert data included, which the
streaming design forbids even transiently), builds a numpy view per tensor, raises bare
ValueError/KeyError without the file or offset, and cannot represent an unknown tensor type id.
The layout constants (magic, value types, default alignment) come from the gguf package.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType, Keys

from sparkd.engine.errors import GGUFFormatError, ModelError, TruncatedFileError

SUPPORTED_VERSIONS = (2, 3)  # v1 used 32-bit lengths and is long obsolete
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses tensors with more dimensions
# A vocabulary of 150k tokens is a few MiB of header; 1 MiB preads keep syscalls few.
_CHUNK_BYTES = 1 << 20
_U64 = struct.Struct("<Q")

# GGUF scalar value types: struct format (little-endian) and numpy dtype for arrays.
_SCALARS: dict[GGUFValueType, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"), GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"), GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"), GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.UINT64: ("<Q", "<u8"), GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT32: ("<f", "<f4"), GGUFValueType.FLOAT64: ("<d", "<f8"),
    GGUFValueType.BOOL: ("<?", "?"),
}


@dataclass
class RawTensorEntry:
    """A tensor index entry as written: ggml order dims, raw type id, offset in the data section."""

    name: str
    ne: tuple[int, ...]
    type_id: int
    data_offset: int
    entry_offset: int  # where the entry starts in the file, for error messages


@dataclass
class ShardHeader:
    path: Path
    size_bytes: int
    version: int
    metadata: dict[str, Any]
    entries: list[RawTensorEntry]
    data_start: int  # absolute offset of the (aligned) tensor data section
    alignment: int
    value_types: dict[str, GGUFValueType] = field(default_factory=dict)


class _Cursor:
    """Sequential reader over a file descriptor; every short read is a truncation error."""

    def __init__(self, fd: int, path: Path, size_bytes: int):
        self.fd, self.path, self.size_bytes = fd, path, size_bytes
        self.pos = 0
        self._buf = b""
        self._buf_start = 0

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > self.size_bytes:
            raise TruncatedFileError(
                f"could not read GGUF header of {self.path}: {what} at offset {self.pos} needs "
                f"{n} bytes but the file ends at byte {self.size_bytes}; the file is truncated "
                f"or not a complete GGUF", path=self.path, offset=self.pos)
        if self.pos < self._buf_start or end > self._buf_start + len(self._buf):
            try:
                self._buf = os.pread(self.fd, max(n, _CHUNK_BYTES), self.pos)
            except OSError as exc:
                raise ModelError(f"could not read GGUF header of {self.path} at offset {self.pos}: "
                                 f"{exc.strerror}", path=self.path, offset=self.pos) from exc
            self._buf_start = self.pos
            if len(self._buf) < n:
                raise TruncatedFileError(
                    f"could not read GGUF header of {self.path}: short read at offset {self.pos} "
                    f"({len(self._buf)} of {n} bytes); the file shrank while being read",
                    path=self.path, offset=self.pos)
        start = self.pos - self._buf_start
        self.pos = end
        return self._buf[start:start + n]

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        at = self.pos
        length = self.scalar("<Q", f"length of {what}")
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(
                f"could not read GGUF header of {self.path}: {what} at offset {at} is not UTF-8 "
                f"({exc.reason})", path=self.path, offset=at) from exc


    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings; a vocabulary has 150k of them, so the common case (whole string
        inside the buffer) is parsed in place and only the rest goes through string()."""
        out: list[str] = []
        for _ in range(count):
            rel, buf = self.pos - self._buf_start, self._buf
            if 0 <= rel and rel + 8 <= len(buf):
                (length,) = _U64.unpack_from(buf, rel)
                end = rel + 8 + length
                if end <= len(buf):
                    try:
                        out.append(buf[rel + 8:end].decode("utf-8"))
                        self.pos += 8 + length
                        continue
                    except UnicodeDecodeError:
                        pass  # string() reports it with the offset
            out.append(self.string(what))
        return out


def _value_type(cur: _Cursor, what: str) -> GGUFValueType:
    at = cur.pos
    raw = cur.scalar("<I", f"value type of {what}")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFFormatError(
            f"could not read GGUF header of {cur.path}: {what} at offset {at} has unknown value "
            f"type id {raw}", path=cur.path, offset=at) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}")
    if vtype == GGUFValueType.ARRAY:
        item_type = _value_type(cur, f"array items of {key!r}")
        count = cur.scalar("<Q", f"array length of {key!r}")
        if item_type in _SCALARS:
            dtype = np.dtype(_SCALARS[item_type][1])
            raw = cur.take(count * dtype.itemsize, f"array data of {key!r}")
            return np.frombuffer(raw, dtype=dtype).tolist()
        if item_type == GGUFValueType.STRING:
            return cur.strings(count, f"string in array {key!r}")
        return [_read_value(cur, item_type, key) for _ in range(count)]
    return cur.scalar(_SCALARS[vtype][0], f"value of {key!r}")


def _read_preamble(cur: _Cursor) -> tuple[int, int, int]:
    magic = cur.take(4, "magic")
    if struct.unpack("<I", magic)[0] != GGUF_MAGIC:
        raise GGUFFormatError(
            f"could not open {cur.path} as GGUF: bad magic {magic!r} at offset 0 (expected b'GGUF'); "
            f"is this a GGUF model file?", path=cur.path, offset=0)
    version = cur.scalar("<I", "version")
    if version & 0xFFFF == 0 and version != 0:
        raise GGUFFormatError(
            f"could not open {cur.path} as GGUF: it is big-endian (version field byte-swapped: "
            f"{version:#x}); only little-endian GGUF is supported", path=cur.path, offset=4)
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(
            f"could not open {cur.path} as GGUF: version {version} at offset 4 is not supported "
            f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})", path=cur.path, offset=4)
    n_tensors = cur.scalar("<Q", "tensor count")
    n_kv = cur.scalar("<Q", "metadata count")
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, GGUFValueType]]:
    metadata: dict[str, Any] = {}
    types: dict[str, GGUFValueType] = {}
    for _ in range(n_kv):
        at = cur.pos
        key = cur.string("metadata key")
        if key in metadata:
            raise GGUFFormatError(f"could not read GGUF header of {cur.path}: metadata key {key!r} "
                                  f"at offset {at} appears twice", path=cur.path, offset=at)
        types[key] = _value_type(cur, f"metadata {key!r}")
        metadata[key] = _read_value(cur, types[key], key)
    return metadata, types


def _read_entry(cur: _Cursor) -> RawTensorEntry:
    at = cur.pos
    name = cur.string("tensor name")
    n_dims = cur.scalar("<I", f"dimension count of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise GGUFFormatError(
            f"could not read GGUF header of {cur.path}: tensor {name!r} at offset {at} has "
            f"{n_dims} dimensions (at most {MAX_DIMS})", path=cur.path, tensor=name, offset=at)
    ne = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"dimensions of tensor {name!r}"))
    type_id = cur.scalar("<I", f"type of tensor {name!r}")
    data_offset = cur.scalar("<Q", f"data offset of tensor {name!r}")
    return RawTensorEntry(name, tuple(ne), type_id, data_offset, at)


def _alignment(path: Path, metadata: dict[str, Any]) -> int:
    alignment = metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"could not open {path} as GGUF: {Keys.General.ALIGNMENT} = "
                              f"{alignment!r} is not a power of two", path=path)
    return alignment


def read_shard_header(fd: int, path: Path) -> ShardHeader:
    """Parse the header of the GGUF open on fd (path is for messages)."""
    size_bytes = os.fstat(fd).st_size
    cur = _Cursor(fd, path, size_bytes)
    version, n_tensors, n_kv = _read_preamble(cur)
    metadata, types = _read_metadata(cur, n_kv)
    entries = [_read_entry(cur) for _ in range(n_tensors)]
    alignment = _alignment(path, metadata)
    data_start = -(-cur.pos // alignment) * alignment
    return ShardHeader(path, size_bytes, version, metadata, entries, data_start, alignment, types)
