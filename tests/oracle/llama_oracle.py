"""llama.cpp as an oracle: run the tools scripts/build-llama-cpp builds (independent of sparkd).

llama_tool(name) builds on first use (several minutes on 2 cores, then cached) and skips the
calling test with the reason when the build cannot happen here (no compiler, cmake or PyPI).
A build that starts and then fails is an error, not a skip.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-llama-cpp"
TOOLS = ("dump_logits", "generate", "tokenize", "detokenize", "quantize")


class OracleBuildError(RuntimeError):
    pass


def _missing_prerequisite() -> str | None:
    for prog in ("cmake", "c++", "tar"):
        if shutil.which(prog) is None:
            return f"{prog} is not installed"
    return None


@functools.cache
def llama_bin_dir() -> Path:
    """Directory holding the built tools; builds them if needed."""
    if why := _missing_prerequisite():
        pytest.skip(f"cannot build the llama.cpp oracle: {why}")
    env = dict(os.environ, PYTHON=sys.executable)
    # One build at a time: both xdist workers may ask at once on a cold machine (the oracle tests run
    # in one group, but test_chat and others read llama_source_dir() from their own), and two builds
    # in one cache dir break each other. The second waits, then finds the cached tools.
    lock_dir = Path.home() / ".cache" / "sparkd"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "llama-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run([str(BUILD_SCRIPT)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        if "download" in proc.stderr and "PyPI" in proc.stderr:
            pytest.skip(f"cannot build the llama.cpp oracle: {proc.stderr.strip()[-400:]}")
        raise OracleBuildError(f"could not build the llama.cpp oracle:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def llama_tool(name: str) -> Path:
    if name not in TOOLS:
        raise ValueError(f"unknown oracle tool {name!r}; known: {', '.join(TOOLS)}")
    return llama_bin_dir() / name


def llama_source_dir() -> Path:
    """The vendored llama.cpp source tree (models/ has vocab-only GGUFs, templates/ chat templates)."""
    return llama_bin_dir().parent / "src" / "llama.cpp"


def _run(args: list, what: str) -> None:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OracleBuildError(f"could not {what}: {Path(args[0]).name} exited {proc.returncode}:\n"
                               f"{proc.stderr[-3000:]}")


def _write_i32(path: Path, ids: Iterable[int]) -> None:
    path.write_bytes(np.asarray(list(ids), dtype="<i4").tobytes())


def llama_logits(gguf_path: str | Path, tokens: Iterable[int], threads: int = 2) -> np.ndarray:
    """float32 [n_tokens, n_vocab]: llama.cpp's logits at every position (F32 KV, no flash attn)."""
    tokens = list(tokens)
    with tempfile.TemporaryDirectory() as tmp:
        tok, out = Path(tmp, "tokens.i32"), Path(tmp, "logits.f32")
        _write_i32(tok, tokens)
        _run([llama_tool("dump_logits"), gguf_path, tok, out, threads], f"compute logits of {gguf_path}")
        return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


def llama_generate(gguf_path: str | Path, prompt: Iterable[int], n_new: int,
                   stop_at_eog: bool = True, threads: int = 2) -> list[int]:
    """Greedy continuation of prompt, decoded one token at a time."""
    with tempfile.TemporaryDirectory() as tmp:
        tok, out = Path(tmp, "prompt.i32"), Path(tmp, "out.i32")
        _write_i32(tok, prompt)
        _run([llama_tool("generate"), gguf_path, tok, n_new, out, threads, int(stop_at_eog)],
             f"generate with {gguf_path}")
        return np.fromfile(out, dtype="<i4").tolist()


def llama_tokenize_many(gguf_path: str | Path, texts: list[str], add_special: bool,
                        parse_special: bool = True) -> list[list[int]]:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "texts.rec"), Path(tmp, "ids.txt")
        src.write_bytes(b"".join(struct.pack("<I", len(b)) + b for b in (t.encode() for t in texts)))
        _run([llama_tool("tokenize"), gguf_path, src, out, int(add_special), int(parse_special)],
             f"tokenize with {gguf_path}")
        lines = out.read_text().split("\n")[:len(texts)]
        return [[int(x) for x in line.split()] for line in lines]


def llama_tokenize(gguf_path: str | Path, text: str, add_special: bool,
                   parse_special: bool = True) -> list[int]:
    return llama_tokenize_many(gguf_path, [text], add_special, parse_special)[0]


def llama_detokenize_many(gguf_path: str | Path, id_lists: list[list[int]],
                          remove_special: bool = False, unparse_special: bool = False) -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "ids.txt"), Path(tmp, "texts.rec")
        src.write_text("".join(" ".join(map(str, ids)) + "\n" for ids in id_lists))
        _run([llama_tool("detokenize"), gguf_path, src, out, int(remove_special), int(unparse_special)],
             f"detokenize with {gguf_path}")
        data, texts, pos = out.read_bytes(), [], 0
        while pos < len(data):
            (n,) = struct.unpack_from("<I", data, pos)
            texts.append(data[pos + 4:pos + 4 + n])
            pos += 4 + n
        return texts


def llama_quantize(src: str | Path, dst: str | Path, quant_type: str, threads: int = 2, pure: bool = False) -> Path:
    """Quantize a GGUF with llama.cpp (e.g. "Q4_K_M", "Q8_0"); pure: llama-quantize --pure (every weight quant_type,
    or llama-quant.cpp's fallback where its rows do not fit it)."""
    _run([llama_tool("quantize"), src, dst, quant_type, threads, *(["pure"] if pure else [])],
         f"quantize {src} to {quant_type}")
    return Path(dst)
