"""Session 43: where the IQ2_XS model's prompt at "ieee" leaves the CPU reference on CUDA (5.86e-3 of the logits; the
kernels alone agree to 3e-7, call 2). Every module's output on the prompt, kernel model on DEV against the CPU
reference, at ieee and int8: the first module past 1e-4 is the suspect. Usage: DEV=cuda python iq2xs_layers.py."""
import os
import sys
import tempfile
from pathlib import Path

import torch

from sparkd.engine.layers import linear
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model

DEV = os.environ.get("DEV", "cuda")
QUANT = sys.argv[1] if len(sys.argv) > 1 else "IQ2_XS"
PROMPT = [1, 5, 9, 33, 2]
shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)


def outputs(net) -> dict:
    got, hooks = {}, []
    for name, m in net.named_modules():
        def hook(mod, args, out, name=name):
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                got[name] = out.detach().double().cpu()
        hooks.append(m.register_forward_hook(hook))
    with torch.no_grad():
        logits = net(torch.tensor(PROMPT), net.new_cache(len(PROMPT)))
    for h in hooks:
        h.remove()
    got["<logits>"] = logits.detach().double().cpu()
    return got


with tempfile.TemporaryDirectory() as tmp:
    path = write_model(Path(tmp) / "m.gguf", plan(shape, QUANT), seed=5)[0]
    for precision in ("ieee", "int8"):
        linear.PREFILL_PRECISION = precision
        ref, k = load_model(path), load_model(path, device=DEV, kernels=True)
        try:
            want, got = outputs(ref.net), outputs(k.net)
        finally:
            ref.close()
            k.close()
        print(f"== {QUANT} {precision} on {DEV}", flush=True)
        for name, g in got.items():
            w = want.get(name)
            if w is None or w.shape != g.shape:
                print(f"  {name:40s} (no reference output{'' if w is None else ' of ' + str(list(g.shape))})")
                continue
            err = float((g - w).norm() / max(w.norm(), 1e-30))
            print(f"  {name:40s} {list(g.shape)!s:16s} {err:.2e}{'  <--' if err > 1e-4 else ''}")
