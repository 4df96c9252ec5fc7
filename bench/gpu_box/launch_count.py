"""Count the kernels one static (CUDA graph) decode step launches, with the fused decode kernels
(sparkd/engine/kernels/fused.py) off and on.

Counting:
  - CUDA: torch.profiler around the step; every device activity is a kernel or a copy/memset
    (a graph replay's kernels are reported one by one, as eager ones are). count_cuda().
  - CPU (no GPU; the fused kernels under TRITON_INTERPRET=1): the aten ops the step dispatches
    that would launch a kernel (composite ops decomposed; views and allocations launch none),
    counted by a dispatch mode, plus one per Triton launch (the interpreter's own torch calls are
    not counted). count_cpu(). An approximation of the CUDA count (a CUDA op may take two kernels,
    and the tiny model's experts run the torch path, not the MoE kernels), exact in what the
    fused kernels remove.
Usage (CPU, a tiny generated model, a few seconds):
    TRITON_INTERPRET=1 python3 bench/gpu_box/launch_count.py --arch qwen3moe
--quant Q8_0 writes the model quantized and runs its projections through the GEMV kernels
(KernelLinear) on the CPU too; --n-embd 2048 widens it enough for split-K GEMVs (~2 minutes).
--moe-decode none switches the MoE decode's fused parts back (layers/moe.DECODE_PARTS).
decode_profile.py reports the CUDA count of a graph replay on the real-width models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = ("empty", "empty_like", "empty_strided", "detach", "lift_fresh", "alias", "set_")
COPY_NAMES = ("Memcpy", "Memset", "memcpy", "memset")


class _AtenCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # inference mode hands over composite ops (linear, einsum, to): count what they become
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = func.overloadpacket.__name__
        if not self.paused and not func.is_view and name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **kwargs)


def count_cpu(step: Callable[[], object]) -> dict:
    """Kernels step() would launch, counted on the CPU: {"aten": n, "triton": n, "total": n,
    "ops": {name: n}}."""
    counter = _AtenCounter()
    triton_launches: Counter[str] = Counter()
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:
        GridExecutor = None
    if GridExecutor is not None:
        launch = GridExecutor.__call__

        def counted(self, *args, **kwargs):
            triton_launches[self.fn.__name__] += 1
            counter.paused += 1
            try:
                return launch(self, *args, **kwargs)
            finally:
                counter.paused -= 1
        GridExecutor.__call__ = counted
    try:
        with counter:
            step()
    finally:
        if GridExecutor is not None:
            GridExecutor.__call__ = launch
    aten, tri = sum(counter.ops.values()), sum(triton_launches.values())
    return {"aten": aten, "triton": tri, "total": aten + tri,
            "ops": dict(counter.ops.most_common()) | {f"triton:{k}": v for k, v in triton_launches.items()}}


def count_kernels(events) -> dict:
    """Device activities among profiler events: {"kernels": n, "copies": n, "names": {name: n}}
    (record_function ranges, which also show on the device timeline, are left out)."""
    names = Counter(e.name for e in events if e.device_type.name == "CUDA" and not e.name.startswith("stage:"))
    copies = sum(n for k, n in names.items() if k.startswith(COPY_NAMES))
    return {"kernels": sum(names.values()) - copies, "copies": copies, "names": dict(names.most_common())}


def count_cuda(step: Callable[[], object]) -> dict:
    """count_kernels of one step() on CUDA."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return count_kernels(prof.events())


def tiny_model(arch: str, folder: Path, quant: str = "F32", n_embd: int = 0) -> Path:
    import dataclasses

    from sparkd.engine.make_model import plan, write_model
    from sparkd.engine.modelgen.specs import TINY

    shape = dataclasses.replace(TINY[arch], n_embd=n_embd) if n_embd else TINY[arch]
    path = folder / f"{arch}-{quant}-{shape.n_embd}.gguf"
    if not path.exists():
        write_model(path, plan(shape, quant), seed=3)
    return path


def static_step_counts(net, spec: str, on_cpu: bool, logits: list | None = None) -> dict:
    """The kernels of one static decode step (the one a graph captures) with fused kernels `spec`; logits: a list
    that gets the uncounted first step's logits (token 5 after the prompt 1, 7, 42), for a caller's check of
    its bits without a step of its own."""
    from sparkd.engine.cuda_graphs import StaticDecode
    from sparkd.engine.kernels import fused

    before = fused.configure(spec, on_cpu=on_cpu)
    try:
        cache = net.new_cache(64)
        net(torch.tensor([1, 7, 42]), cache)
        step = StaticDecode(net, cache, graphs=False, first_bucket=16)
        first = step(5)  # first call outside the count (Triton compiles, rope table)
        if logits is not None:
            logits.append(first)
        if on_cpu:
            return count_cpu(lambda: step(6))
        return count_cuda(lambda: step(6))
    finally:
        fused.configure(before)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3moe")
    ap.add_argument("--dir", default=None, help="where the tiny model is written (default: a temp dir)")
    ap.add_argument("--quant", default="F32", help="the model's type; a kernel type (Q8_0) runs KernelLinear")
    ap.add_argument("--n-embd", type=int, default=0, help="hidden width (default: the tiny preset's)")
    ap.add_argument("--moe-decode", default=None, help="the MoE decode parts switched on "
                    "(layers/moe.DECODE_PARTS: all, none, or some; default: $SPARKD_MOE_DECODE)")
    ap.add_argument("--json")
    a = ap.parse_args()
    from sparkd.engine.models import load_model

    on_cpu = not torch.cuda.is_available()
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        print("no GPU: run with TRITON_INTERPRET=1 so the fused kernels can run on the CPU", file=sys.stderr)
        return 2
    if a.moe_decode is not None:
        from sparkd.engine.layers import moe

        moe.DECODE_ON = moe.decode_parts(a.moe_decode)
    with tempfile.TemporaryDirectory() as tmp:
        m = load_model(tiny_model(a.arch, Path(a.dir or tmp), a.quant, a.n_embd), device="cpu" if on_cpu else "cuda",
                       kernels=True if a.quant != "F32" else None)
        try:
            res = {spec: static_step_counts(m.net, spec, on_cpu) for spec in ("none", "all")}
            n_layer = len(m.net.blocks)
        finally:
            m.close()
    key = "total" if on_cpu else "kernels"
    print(f"{a.arch} ({n_layer} layers, {'CPU dispatch count' if on_cpu else 'CUDA profiler'}): "
          f"fused none {res['none'][key]} launches/step, all {res['all'][key]}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
