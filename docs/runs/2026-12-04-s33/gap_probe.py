"""Session 33: why gpt-oss Q6_K's greedy decode parted from llama.cpp's under session 32's grouped attend.

Run from a worktree with 27afaf3's attend (git diff 0a8791a 27afaf3 -- sparkd/engine/layers/attention.py | git apply):
    PYTHONPATH=$PWD:$PWD/tests/oracle python docs/runs/2026-12-04-s33/gap_probe.py
Printed (session 33, CI VM): the divergence (24, llama.cpp's margin 0.100, ours 0.767); each router's margin between
its k-th and (k+1)-th gate logits at that step (layer 3: 3.8e-4); with layer 3's pick flipped our pick is llama.cpp's
token 198 (by 0.053).
"""
from pathlib import Path

import torch
from compare import first_divergence, greedy
from llama_oracle import llama_generate, llama_logits
from matrix_models import TOKENS, matrix_model

from sparkd.engine.models import load_model

d = Path("/tmp/gapmodels")
d.mkdir(exist_ok=True)
path = matrix_model(d, "gpt-oss", "Q6_K")
m = load_model(path)
prompt = TOKENS[:8]
ours = greedy(m.net, prompt, 32)
theirs = llama_generate(path, prompt, 32, stop_at_eog=False)
div = first_divergence(path, prompt, ours, theirs, llama_logits, m.net)
print("divergence (step, llama.cpp's margin, ours):", div)
i = div[0]
ctx = prompt + ours[:i]


def last_step(flip_layer: int | None = None) -> torch.Tensor:
    """Our logits row at the divergent step, stepping as greedy does; flip_layer: that layer's (k+1)-th gate logit
    nudged 0.001 above its k-th at that step (the other pick of a near-tie). Prints each router's margin."""
    margins, last = [], {"on": False}
    handles = []
    for il, b in enumerate(m.net.blocks):
        router = b.ffn.router

        def hook(mod, args, out, il=il, k=router.top_k):
            if not last["on"]:
                return out
            top = torch.sort(out[-1], descending=True)
            margins.append((il, round(float(top.values[k - 1] - top.values[k]), 6)))
            if il == flip_layer:
                out = out.clone()
                out[-1, top.indices[k]] = top.values[k - 1] + 0.001
            return out
        handles.append(router.gate.register_forward_hook(hook))
    cache = m.net.new_cache(len(ctx) + 1)
    m.net(torch.tensor(ctx[:8]), cache)
    for t in ctx[8:-1]:
        m.net(torch.tensor([t]), cache)
    last["on"] = True
    row = m.net(torch.tensor(ctx[-1:]), cache)[-1]
    for h in handles:
        h.remove()
    print("routers' k-th minus (k+1)-th gate logit:", margins)
    return row


row = last_step()
print("ours", int(row.argmax()), "llama.cpp's", theirs[i])
row = last_step(flip_layer=3)
print("layer 3 flipped: ours", int(row.argmax()), "margin over ours", float(row[theirs[i]] - row[ours[i]]))
