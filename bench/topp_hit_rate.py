"""How often the K most likely tokens of a real model hold top_p of the mass (session 18, topp41's
candidates-first top-p draw, measured and out of the engine: 64 candidates hold the nucleus at top_p
when their mass reaches it; a wider second stage would need K = 1024). On the CPU, any GGUF (scripts/demo's Gemma 3 270M: sparkd.engine.bundled.assemble_gemma3):
    python3 bench/topp_hit_rate.py --model gemma-3-270m-q4_k_m.gguf --json out.json
Two kinds of positions: teacher-forced over prose (a few documents' opening text: the next-token
distribution of real text) and the model's own continuations of a few prompts at --temp 0.8 with
top_p 0.95 drawn on the host (what a request that sends top_p decodes); the filters see the logits
before temperature (sampler.py), so neither K's share depends on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from sparkd.engine.models import load_model
from sparkd.engine.sampler import Sampler, SamplingParams
from sparkd.engine.tokenizer import Tokenizer

KS = (40, 64, 256, 1024)
TOP_PS = (0.9, 0.95)
PROSE = [
    "The history of the city begins in the early medieval period, when a small market town grew up around a "
    "river crossing. Over the following centuries the town expanded as trade in wool and cloth brought merchants "
    "from across the region. By the sixteenth century it had become one of the most important commercial centres "
    "in the country, with a cathedral, a university and a busy harbour. The industrial revolution transformed it "
    "again: mills and factories were built along the river, the population grew tenfold, and railways connected "
    "it to the capital. Today the city is known for its museums, its parks and its mix of old and new buildings.",
    "To make the bread, mix the flour, salt and yeast in a large bowl, then add the warm water and stir until a "
    "rough dough forms. Turn it out onto a floured surface and knead for ten minutes, until it is smooth and "
    "elastic. Place the dough in an oiled bowl, cover it with a towel and leave it somewhere warm to rise for an "
    "hour, or until it has doubled in size. Knock it back, shape it into a loaf and put it in a tin. Bake in a "
    "hot oven for thirty minutes, until the crust is golden and the loaf sounds hollow when tapped underneath.",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize "
    "foods from carbon dioxide and water. It generally involves the green pigment chlorophyll and generates "
    "oxygen as a byproduct. The light reactions take place in the thylakoid membranes, where energy from light "
    "is captured and used to make ATP and NADPH. These molecules then power the Calvin cycle in the stroma, "
    "which fixes carbon dioxide into sugars that the plant uses for growth and energy storage.",
]
PROMPTS = ["Once upon a time, in a small village by the sea,", "The best way to learn a new language is",
           "Here is a short summary of the French Revolution:", "My favourite thing about winter is"]


def shares(logits: torch.Tensor) -> torch.Tensor:
    """[positions, len(KS)]: the mass of each position's K most likely tokens."""
    probs = torch.softmax(logits.double(), dim=-1)
    top = torch.topk(probs, max(KS), dim=-1).values.cumsum(dim=-1)
    return torch.stack([top[:, k - 1] for k in KS], dim=1)


def table(mass: torch.Tensor) -> dict:
    return {f"top_p {p}": {f"top {k}": round(float((mass[:, i] >= p).double().mean()), 4) for i, k in enumerate(KS)}
            for p in TOP_PS} | {"positions": mass.shape[0],
                                "median mass": {f"top {k}": round(float(mass[:, i].median()), 4)
                                                for i, k in enumerate(KS)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=96, help="tokens each prompt's continuation draws")
    ap.add_argument("--json")
    a = ap.parse_args()
    m = load_model(a.model, device="cpu")
    tok = Tokenizer(m.gguf.metadata, str(m.gguf.path))
    res = {"model": a.model, "n_vocab": m.cfg.n_vocab}
    try:
        with torch.inference_mode():
            forced = []
            for text in PROSE:
                ids = tok.encode(text)
                forced.append(shares(m.net(torch.tensor(ids), m.net.new_cache(len(ids)))[1:]))
            res["teacher-forced prose"] = table(torch.cat(forced))
            own = []
            for i, text in enumerate(PROMPTS):
                ids = tok.encode(text)
                cache = m.net.new_cache(len(ids) + a.tokens + 1)
                logits = m.net(torch.tensor(ids), cache)[-1]
                sample = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=i))
                for _ in range(a.tokens):
                    own.append(shares(logits[None]))
                    nxt = sample(logits)
                    logits = m.net(torch.tensor([nxt]), cache)[-1]
            res["own continuations (temp 0.8, top_p 0.95)"] = table(torch.cat(own))
    finally:
        m.close()
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
