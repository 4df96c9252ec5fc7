"""Programmatic dependent launch (PDL) for the decode step's Triton kernels: on Hopper (sm_90) and
later (Blackwell, the GB10 too) a kernel launched with PDL may be launched while the kernel before
it in the stream still drains, so its launch and its first instructions overlap that kernel's tail.
A CUDA graph captured from such launches keeps them as programmatic edges.

$SPARKD_PDL (read at import; configure() for benches): "auto" (default) PDL on CUDA devices of
compute capability 9 or more, off elsewhere (the interpreter, older GPUs); "on" the same but an
older GPU is an error; "off" every kernel launches as before. A kernel that takes it has a
`PDL: tl.constexpr` argument, calls start(PDL) and gets its launch keywords from launch(device).

THE RULE, which start() enforces by where the kernels call it (first, before anything else; the
CPU test test_pdl.py checks every kernel's source): a kernel launched with PDL runs gdc_wait
- before it reads anything an earlier kernel wrote (activations, the KV cache, positions, tickets);
- before it writes anything (an earlier kernel may still read what the allocator hands out again);
- and before it ends, on every path: a kernel's wait covers only the kernel launched just before
  it, so a later kernel's wait implies the earlier ones finished only if each waited for its own.
Only loads of weights, which no kernel writes, may go before the wait. Torch ops in the step
launch without PDL and wait for all the work before them, as before.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from sparkd.engine import switches

ENV = "SPARKD_PDL"
MODES = ("auto", "on", "off")
MIN_MAJOR = 9  # griddepcontrol: sm_90 and later
_mode = switches.choice(ENV, MODES, "auto")


def configure(mode: str) -> str:
    """Set the mode (one of MODES) for the launches from now on → the mode before."""
    global _mode
    if mode not in MODES:
        raise switches.SwitchError(f"could not configure PDL {mode!r}: choose one of {', '.join(MODES)} ({ENV})")
    before, _mode = _mode, mode
    return before


def current() -> str:
    return _mode


@contextlib.contextmanager
def using(mode: str):
    """The launches inside run in mode (benches and tests: PDL on and off in one process)."""
    before = configure(mode)
    try:
        yield
    finally:
        configure(before)


_MAJOR: dict[int, int] = {}


def _major(device: torch.device) -> int:
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _MAJOR:
        _MAJOR[index] = torch.cuda.get_device_capability(index)[0]
    return _MAJOR[index]


def enabled(device: torch.device | str) -> bool:
    """Whether launches on device use PDL (see the module's doc for the modes)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if _mode == "off" or device.type != "cuda":
        return False
    if _major(device) >= MIN_MAJOR:
        return True
    if _mode == "on":
        raise switches.SwitchError(f"could not use {ENV}=on on {torch.cuda.get_device_name(device)}: programmatic "
                                   f"dependent launch needs compute capability {MIN_MAJOR}.0 or more (auto: off there)")
    return False


_ON, _OFF = {"PDL": True, "launch_pdl": True}, {"PDL": False}  # (unpacked by the callers, never changed)


def launch(device: torch.device | str) -> dict:
    """A PDL kernel's launch keywords on device: its PDL constexpr, and Triton's launch_pdl where on."""
    return _ON if enabled(device) else _OFF


def compile_args(kern, consts: dict) -> dict:
    """consts for an offline compile (triton.compiler.ASTSource names every argument): PDL off unless
    given, where the kernel takes it."""
    return {"PDL": False, **consts} if "PDL" in kern.arg_names else consts


@triton.jit
def start(PDL: tl.constexpr):
    """A PDL kernel's first call: let the next kernel launch (it waits in its own start), then wait
    until the kernel before this one has finished and its writes are visible (the module's rule)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
