"""packaging/build-deb's bad arguments: a clear error before anything is built or downloaded
(the build itself is tested in tests/test_deb_package.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

BUILD_DEB = Path(__file__).resolve().parents[1] / "packaging" / "build-deb"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--engine-wheels"], "could not read --engine-wheels: it needs a folder"),
        (["--out", "--engine-wheels", "x"], "could not read --out: it needs a folder"),
        (["--wheel-cache", ""], "could not read --wheel-cache: it needs a folder"),
        (["--bogus"], "unknown argument '--bogus'"),
    ],
)
def test_bad_arguments_are_refused_before_building(tmp_path, argv, message):
    out = subprocess.run([str(BUILD_DEB), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert "usage: packaging/build-deb" in out.stderr
    assert out.stdout == "" and list(tmp_path.iterdir()) == []  # nothing written


def test_help_lists_the_options():
    out = subprocess.run([str(BUILD_DEB), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--engine-wheels DIR" in out.stdout and "set -e" not in out.stdout, out.stdout
