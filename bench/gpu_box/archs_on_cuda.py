"""Every architecture's tiny generated model on CUDA (--device cuda: trunk and experts on the GPU,
kernel-typed weights as raw blocks) against the CPU reference: prompt logits' relative error and
whether greedy tokens agree. Run on the GPU box from the checkout root:
    python3 bench/gpu_box/archs_on_cuda.py [--quant Q8_0]
Prints one line per architecture; exits 1 if any architecture fails to run or disagrees."""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

PROMPT = [1, 7, 42, 3, 99, 5, 17, 8]
BOUND = 1e-3  # relative error of the prompt logits; the kernels are exact up to summation order


def greedy(net, prompt: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    cache = net.new_cache(64)
    logits = net(torch.tensor(prompt), cache)
    first, out = logits.clone(), []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = net(torch.tensor([out[-1]]), cache)
    return first, out


def check(arch: str, quant: str, directory: Path) -> bool:
    path = write_model(directory / f"{arch}.gguf", plan(TINY[arch], quant), seed=3)[0]
    ref, gpu = load_model(path), load_model(path, device="cuda")
    try:
        want_logits, want = greedy(ref.net, PROMPT, 8)
        got_logits, got = greedy(gpu.net, PROMPT, 8)
    finally:
        ref.close()
        gpu.close()
    err = float((got_logits - want_logits).norm() / want_logits.norm())
    ok = err < BOUND and got == want
    print(f"{arch:10s} {quant}: prompt logits relative error {err:.2e}, greedy {'equal' if got == want else 'DIFFERS'}"
          f" {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quant", default="Q8_0")
    args = ap.parse_args()
    failed = []
    with tempfile.TemporaryDirectory() as d:
        for arch in sorted(TINY):
            try:
                if not check(arch, args.quant, Path(d)):
                    failed.append(arch)
            except Exception:  # one architecture's failure must not hide the others'
                traceback.print_exc()
                print(f"{arch:10s} {args.quant}: FAILED to run", flush=True)
                failed.append(arch)
    print("failed:", ", ".join(failed) or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
