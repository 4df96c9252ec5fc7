"""Print docs/engine-numerics.md's table: our logits vs llama.cpp's per architecture x dtype.

Run from the repository root: PYTHONPATH=$PWD python tests/oracle/numerics_table.py [ARCH ...]
(builds the llama.cpp oracle on first use; about 2 minutes on 2 cores after that). Without
arguments the matrix's architectures; any TINY architecture may be named (e.g. glm-dsa).
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from compare import agreement, full_logits, incremental_logits  # noqa: E402
from llama_oracle import llama_logits  # noqa: E402
from matrix_models import ARCHS, DTYPES, TOKENS, matrix_model  # noqa: E402
from sparkd.engine.models import load_model  # noqa: E402


def main(archs: list[str]) -> None:
    print("| arch | dtype | max rel. error | top-1 | mean KL (nats) | ours: incremental vs full |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            for dtype in DTYPES:
                path = matrix_model(Path(tmp), arch, dtype)
                m = load_model(path)
                try:
                    full = full_logits(m.net, TOKENS)
                    inc = incremental_logits(m.net, TOKENS, n_prompt=5)
                finally:
                    m.close()
                a = agreement(llama_logits(path, TOKENS), full)
                self_err = abs(full - inc).max() / abs(full).max()
                print(f"| {arch} | {dtype} | {a.rel_err:.1e} | {a.top1:.3f} | {a.kl:.1e} | {self_err:.1e} |",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ARCHS)
