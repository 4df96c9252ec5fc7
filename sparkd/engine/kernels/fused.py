"""The one switch for the fused decode kernels (RMSNorm, rope + KV write, decode attention, router
top-k, and norm_quant: the RMSNorm also writing x's int8 blocks for the integer GEMV after it, so
that GEMV skips its own quantization launch; it needs rms_norm on; norm_fold: the residual add +
RMSNorm after attention adds the output projection's split-K partials in order, so that GEMV's
launch has no fold (matmul.fold_part) of its own, the same bits; it needs rms_norm too; rope_attention:
rope_kv and attention as one launch, kernels/rope_attention.py; it needs both; hyper_conn: DeepSeek V4's
hyper-connection weights (the sigmoids and the Sinkhorn normalisation, ~140 torch launches) in one launch,
kernels/hyper_conn.py, and its mix and merge as batched products; rope_tail: DeepSeek V4's rope on the last
dims of each head, kernels/rope_tail.py; compressor: DeepSeek V4's compressor in a static step, its ring row and
pooled entry in one launch, kernels/compressor.py): which of them the layers use on CUDA tensors instead of their torch code.

The torch code stays the CPU path and the reference; a fused kernel runs only where it is
switched on and the tensor is on a GPU (or, for tests, on the CPU under TRITON_INTERPRET=1 after
configure(..., on_cpu=True)). The environment variable SPARKD_FUSED_KERNELS sets the starting
choice, read once here so a GPU run can fall back without a code change: "all" (the default),
"none", or a comma-separated list of names from KERNELS. This module imports no Triton: the CPU
engine runs without it.

rope_kv and attention serve one-token steps: the static (CUDA graph) step always, and the eager
one (streamed experts keep decode eager) too unless $SPARKD_FUSED_EAGER=0, which gives the eager
step back its torch rope and attend (their summation order; ~30 small launches per layer more).
"""

from __future__ import annotations

import torch

from sparkd.engine import switches

KERNELS = ("rms_norm", "rope_kv", "attention", "router", "norm_quant", "norm_fold", "rope_attention", "hyper_conn",
           "rope_tail", "compressor")
ENV = "SPARKD_FUSED_KERNELS"
# rope_attention serves a static step's buckets of at most this many rows, an eager step its positions below it
# (the same launches at each position); longer ones keep rope_kv and decode_attention apart. H200, 32 heads over 4
# KV heads of 128, rope_kv + decode_attention "grouped" (session 29) against the one launch: 9.7 / 7.6 us at 264
# positions, 10.1 / 10.2 at 520, 10.6 / 13.3 at 1000, 13.2 / 24.2 at 2000 (session 28 set 1024 against "auto").
# Over float16 rows (--kv-type f16) the two launches won the kernel bench at every position (session 30 call 2:
# 5.2 / 5.4 us at position 8, 6.7 / 8.9 at 72, 7.6 / 8.2 at 264) but lost the 12-layer decode at positions 8-136
# (call 3: 1712-1718 tok/s against 1834 with the one launch, call 2): the same span for both types
ROPE_ATTENTION_SPAN = 512
EAGER_ENV = "SPARKD_FUSED_EAGER"


def parse(spec: str) -> frozenset[str]:
    """"all", "none"/"" or names separated by commas → the set of kernels switched on."""
    return switches.parse_names(spec, KERNELS, "fused kernels", ENV)


_on: frozenset[str] = switches.names(ENV, KERNELS, "fused kernels")
_on_cpu = False
_eager = switches.flag(EAGER_ENV, True)


def configure(spec: str, on_cpu: bool = False) -> str:
    """Switch the fused kernels (see parse); on_cpu runs them on CPU tensors too, which only the
    Triton interpreter can (tests). Returns the previous choice as a spec (on_cpu off)."""
    global _on, _on_cpu
    before = current()
    _on, _on_cpu = parse(spec), on_cpu
    return before


def current() -> str:
    """The kernels switched on, as a spec configure() takes."""
    return ",".join(k for k in KERNELS if k in _on) or "none"


def active(name: str, t: torch.Tensor) -> bool:
    """Whether the layer computing on t uses the fused kernel `name`."""
    return name in _on and (t.is_cuda or _on_cpu)


def one_token(static: bool) -> bool:
    """Whether a one-token step may use the decode kernels (rope_kv, attention): the static step
    always, an eager one unless switched off ($SPARKD_FUSED_EAGER=0, configure_eager)."""
    return static or _eager


def configure_eager(on: bool) -> bool:
    """Switch the eager one-token step's use of the decode kernels; returns the previous choice."""
    global _eager
    before, _eager = _eager, on
    return before
