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

The one exception (session 48, the MoE down's early weight words: moe._idown_kernel's EARLY, q4_k_pair.down_sums'
WAIT): a kernel may also read, before its wait, what was written before the kernel launched just before it waited, if
that kernel lets it launch only after that wait (start(PDL, False), then dependents(PDL)): the MoE gate/up does so
where the down reads the router's selection (and the offsets it indexes) early, to load its first weight words. Its
writes, and its reads of anything else, still follow its wait.

Weights before the wait (session 11, pdl11): $SPARKD_PDL_PREFETCH (read at import; prefetching() for
benches) "off", "lines", "bulk" or "small": a kernel may call prefetch_l2 before start() to ask the L2 for
its weight bytes (matmul's dense integer GEMV, its program's share of its row tile), so their DRAM ramp
overlaps the kernel before it instead of following its wait. A prefetch moves no byte into a register,
so it reads nothing an earlier kernel wrote and changes no bit; test_pdl.py allows it and nothing else
there. "lines": a prefetch.global.L2 per 128-byte line; "bulk": one cp.async.bulk.prefetch.L2 of the
range. Only in launches that use PDL (sm_90 and later, SPARKD_PDL not off): without the wait there is
nothing to overlap. On the H200 asking for a program's whole share up front slowed the GEMV at weights of
14 MB or more and paid only at the smallest (docs/performance.md, session 11, pdl11), so the default
(pdl12) is "small": bulk, only in launches whose weight is at most SMALL_BYTES (attention's qkv and o;
12-layer Qwen3-30B-A3B decode on the H200: Q8_0 +1.7-3.4 %, Q4_K +0.5 %, the same bits); "off" switches
it back.
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


PREFETCH_ENV = "SPARKD_PDL_PREFETCH"
PREFETCHES = ("off", "lines", "bulk", "small")
_prefetch = switches.choice(PREFETCH_ENV, PREFETCHES, "small")
SMALL_BYTES = 12 << 20  # "small": launches of at most this many weight bytes (pdl11: the prefetch slowed >= 14 MB)


def configure_prefetch(mode: str) -> str:
    """Set the weight prefetch (one of PREFETCHES) for the launches from now on → the one before."""
    global _prefetch
    if mode not in PREFETCHES:
        raise switches.SwitchError(f"could not configure the weight prefetch {mode!r}: choose one of "
                                   f"{', '.join(PREFETCHES)} ({PREFETCH_ENV})")
    before, _prefetch = _prefetch, mode
    return before


def current_prefetch() -> str:
    return _prefetch


@contextlib.contextmanager
def prefetching(mode: str):
    """The launches inside prefetch their weights so (benches and tests: the modes in one process)."""
    before = configure_prefetch(mode)
    try:
        yield
    finally:
        configure_prefetch(before)


def prefetch_mode(device: torch.device | str, nbytes: int = 0) -> int:
    """prefetch_l2's MODE for a launch on device over nbytes of weights: 0 where the launch has no PDL wait to
    overlap (off CUDA, PDL off, or a GPU without it: bulk's cp.async.bulk needs sm_90 too), switched off, or
    "small" over SMALL_BYTES; 1 lines; 2 bulk ("small" too)."""
    if _prefetch == "off" or (_prefetch == "small" and nbytes > SMALL_BYTES) or not enabled(device):
        return 0
    return 1 if _prefetch == "lines" else 2


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
    """consts for an offline compile (triton.compiler.ASTSource names every argument): PDL and the weight
    prefetch off, and a GEMV ungrouped (matmul.gemv's groups), unless given, where the kernel takes them."""
    defaults = (("PDL", False), ("PREFETCH", 0), ("GROUP_ROWS", 0), ("XBLOCK", 32))
    off = {k: v for k, v in defaults if k in kern.arg_names}
    return {**off, **consts}


@triton.jit
def start(PDL: tl.constexpr, DEPENDENTS: tl.constexpr = True):
    """A PDL kernel's first call: let the next kernel launch (it waits in its own start) unless not
    DEPENDENTS, then wait until the kernel before this one has finished and its writes are visible
    (the module's rule). DEPENDENTS False: the kernel calls dependents() later (or the next kernel
    launches when this one ends); where it lets the next one launch changes no bit, since that one
    still waits for all of this one."""
    if PDL:
        if DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def dependents(PDL: tl.constexpr):
    """Let the next kernel launch from here (a kernel that called start(PDL, False))."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


LINE = tl.constexpr(128)  # bytes a prefetch.global.L2 asks for


@triton.jit
def prefetch_l2(addr, nbytes, MODE: tl.constexpr):
    """Ask the L2 for the weight bytes [addr, addr + nbytes) (addr an int64 address): MODE 0 nothing, 1 a
    prefetch.global.L2 per 128-byte line (the lines spread over 32 lanes), 2 one cp.async.bulk.prefetch.L2 of
    the 16-byte-aligned bytes inside the range, from lane 0. The only call a kernel may make before start()
    (the module's rule): no byte reaches a register."""
    t = tl.arange(0, 32)
    if MODE == 1:
        first = addr // LINE * LINE
        lines = tl.cdiv(addr + nbytes - first, LINE).to(tl.int32)
        for i in range(0, lines, 32):
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }", "=r,l,r",
                [first + (i + t).to(tl.int64) * LINE, (i + t < lines).to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
    elif MODE == 2:
        lo = (addr + 15) // 16 * 16
        size = tl.where(t == 0, (addr + nbytes) // 16 * 16 - lo, 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
            "=r,l,r", [lo + tl.zeros_like(t).to(tl.int64), size], dtype=tl.int32, is_pure=False, pack=1)
