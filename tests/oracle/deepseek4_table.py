"""Print DeepSeek V4 (deepseek4)'s error table: our logits vs llama.cpp's per dtype on the tiny
generated model, plus greedy decode and our incremental-vs-full error.

Run from the repository root: PYTHONPATH=$PWD python tests/oracle/deepseek4_table.py
(about a minute on 2 cores once the llama.cpp oracle is built).
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from compare import agreement, first_divergence, full_logits, greedy, incremental_logits  # noqa: E402
from llama_oracle import llama_generate, llama_logits  # noqa: E402
from sparkd.engine.make_model import plan, write_model  # noqa: E402
from sparkd.engine.modelgen.specs import TINY  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402

ARCH = "deepseek4"
# 140 positions: an HCA block completes (128) and llama.cpp splits the prompt into ubatches
LONG = [int(t) for t in np.random.default_rng(7).integers(0, 256, 140)]
SHORT = LONG[:48]
N_GREEDY = 24
SEED = 11


def shape(dtype: str):
    s = TINY[ARCH]
    # K-quant rows must be multiples of 256 or they are written as F16
    return s.replace(n_embd=256, n_ff_exp=256, q_lora_rank=256) if dtype.endswith("_K") else s


def row(path: Path, dtype: str) -> str:
    m = load_model(path)
    try:
        full = full_logits(m.net, LONG)
        inc = incremental_logits(m.net, LONG, n_prompt=5)
        ours = greedy(m.net, SHORT[:8], N_GREEDY)
        theirs = llama_generate(path, SHORT[:8], N_GREEDY, stop_at_eog=False)
        div = first_divergence(path, SHORT[:8], ours, theirs, llama_logits, m.net)
    finally:
        m.close()
    ref = llama_logits(path, LONG)
    a = agreement(ref, full)
    same = "yes" if div is None else f"no (at {div[0]}, margins {div[1]:.3f} / ours {div[2]:.3f})"
    self_err = abs(full - inc).max() / abs(full).max()
    return (f"| {dtype} | {abs(full - ref).max():.1e} | {a.rel_err:.1e} | {a.top1:.3f} | {a.kl:.1e} | {same} "
            f"| {self_err:.1e} |")


def main() -> None:
    print(f"| dtype | max abs error | max rel. error | top-1 | mean KL (nats) | greedy {N_GREEDY} identical "
          "| ours: incremental vs full |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in sys.argv[1:] or ["F32", "F16", "Q8_0", "Q4_K"]:
            path = write_model(Path(tmp) / f"{dtype}.gguf", plan(shape(dtype), dtype), seed=SEED)[0]
            print(row(path, dtype), flush=True)


if __name__ == "__main__":
    main()
