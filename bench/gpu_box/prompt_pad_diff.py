"""Where a padded prompt's forward (what prompt_graphs.PromptForward's graph replays) first leaves the
eager prompt's bits: both forwards run with forward hooks on every module of the network, and the
modules are listed in call order with whether their inputs and outputs over the real tokens' rows
are bit-equal; the first module whose inputs agree and outputs do not is the op that takes another
order at the padded length. A forward's rows are the real tokens' (the first n).

    python3 bench/gpu_box/prompt_pad_diff.py --quant Q4_K --tokens 5,600 --json out.json
(a seeded tiny qwen3moe model, as tests/engine/test_cuda_graphs.py's GPU tests make it; --model: a GGUF)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from sparkd.engine.prompt_graphs import PromptForward
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model


def first_rows(t, n: int):
    """The real tokens' rows of a module's tensor (or of each tensor in a tuple)."""
    if isinstance(t, tuple):
        return tuple(first_rows(x, n) for x in t if isinstance(x, torch.Tensor))
    return t[:n].detach().clone() if isinstance(t, torch.Tensor) and t.dim() else None


def traced(net, n: int, call) -> list[tuple[str, object, object]]:
    """(module name, its first input's rows, its output's rows) per module call of call()."""
    calls, handles = [], []
    for name, mod in net.named_modules():
        if name:
            handles.append(mod.register_forward_hook(
                lambda m, args, out, name=name: calls.append((name, first_rows(args[0] if args else None, n),
                                                               first_rows(out, n)))))
    try:
        call()
    finally:
        for h in handles:
            h.remove()
    return calls


def equal(a, b) -> bool | None:
    if a is None or b is None:
        return None
    if isinstance(a, tuple):
        return all(equal(x, y) is not False for x, y in zip(a, b))
    return a.shape == b.shape and bool(torch.equal(a, b))


def compare(net, n: int, ctx: int) -> dict:
    tokens = torch.tensor([(7 * i + 3) % net.cfg.n_vocab for i in range(n)])
    eager = traced(net, n, lambda: net(tokens, net.new_cache(ctx), last=True))
    padded_forward = PromptForward(net, net.new_cache(ctx), "padded")
    bucket = padded_forward.bucket(n)
    padded = traced(net, n, lambda: padded_forward(tokens, last=True))
    rows = []
    for (name, xe, ye), (name_p, xp, yp) in zip(eager, padded):
        if name != name_p:
            raise SystemExit(f"the two forwards called other modules: {name} vs {name_p}")
        rows.append({"module": name, "in_equal": equal(xe, xp), "out_equal": equal(ye, yp)})
    first = next((r["module"] for r in rows if r["in_equal"] and r["out_equal"] is False), None)
    return {"bucket": bucket, "first_op_that_differs": first,
            "differing": [r for r in rows if r["out_equal"] is False][:12]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF (default: the tiny seeded qwen3moe of --quant)")
    ap.add_argument("--quant", default="Q4_K")
    ap.add_argument("--tokens", default="5,70,600")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    lengths = [int(t) for t in a.tokens.split(",")]
    with tempfile.TemporaryDirectory() as d:
        path = a.model
        if path is None:
            shape = TINY["qwen3moe"] if a.quant == "Q8_0" else \
                TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256)
            path = write_model(Path(d) / "q.gguf", plan(shape, a.quant), seed=3)[0]
        m = load_model(path, device=a.device)
        try:
            with torch.inference_mode():
                res = {n: compare(m.net, n, max(lengths) * 2) for n in lengths}
        finally:
            m.close()
    for n, r in res.items():
        print(f"{a.quant} {n} tokens (bucket {r['bucket']}): first op that differs: {r['first_op_that_differs']}; "
              f"differing: {[x['module'] for x in r['differing']]}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
