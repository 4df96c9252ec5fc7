"""How much the prompt graphs' shared memory pool holds after capturing every bucket up to 1024
tokens shortest first (as lazy capture by growing prompts does) against longest first (what
`--prompt-graphs auto` does at load), and the 1024 bucket alone. A small random qwen3moe (Q8_0,
16 heads, so attention's [H, T, T] scores reach 64 MiB at 1024 tokens) made here, or --model.
    python3 bench/gpu_box/prompt_pool_order.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from sparkd.engine.prompt_graphs import PromptForward, prompt_buckets
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model


def pool_mib(net, spans: list[int]) -> float:
    p = PromptForward(net, net.new_cache(1024))
    for span in spans:
        p.prepare(span)
    held = sum(p.pool_bytes.values()) / 2**20
    del p
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shape = TINY["qwen3moe"].replace(n_embd=256, n_ff_exp=256, n_ff=256, n_head=16, n_ctx=1024)
        path = a.model or write_model(Path(tmp) / "q.gguf", plan(shape, "Q8_0"), seed=3)[0]
        m = load_model(path, device="cuda")
        try:
            spans = prompt_buckets(1024)
            pool_mib(m.net, spans[:1])  # compile the kernels first
            res = {"ascending_mib": pool_mib(m.net, spans), "descending_mib": pool_mib(m.net, spans[::-1]),
                   "alone_1024_mib": pool_mib(m.net, [1024]), "buckets": spans}
        finally:
            m.close()
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
