"""Session 45, on the CPU (no device budget left): do test_prompt_cache's GPU tests keep their greedy tokens under
SPARKD_SDPA_PRECISION=half? On CUDA a whole prompt's attention (from position 0) now rounds q * scale, k and v to
float16 (and its output), while a short continuation (under CONTINUE_SDPA_ROWS) and decode stay float32, so a cached
turn and the same prompt whole differ by half's error (3.4e-4), no longer by float32's (1e-7). This emulates that on
the CPU reference (attend over float16-rounded operands from position 0, T > 1) and runs the GPU test's sequences
(test_on_the_gpu_conversations_taking_turns_continue_their_own: two conversations, three rounds, 8 tokens) with the
prompt cache on and off. Usage: python half_emulation.py ARCH QUANT SEED (the test: qwen3moe Q8_0 3)."""
import sys
import threading

from sparkd.engine.layers import attention
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.runtime import Engine, GenerationRequest
from sparkd.engine.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
exact = attention.attend


def half_attend(q, k, v, scale, start, *a, **kw):
    if q.shape[0] > 1 and isinstance(start, int) and start == 0:
        o = exact((q * scale).half().float(), k.half().float(), v.half().float(), 1.0, start, *a, **kw)
        return o.half().float()
    return exact(q, k, v, scale, start, *a, **kw)


def run(engine, ids, n=8):
    req = GenerationRequest(list(ids), n, GREEDY)
    return list(engine.generate(req, threading.Event())), req.cached_tokens


arch, quant, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
path = write_model(f"/tmp/{arch}-{quant}-{seed}.gguf", plan(TINY[arch], quant), seed=seed)[0]
for emulate in (False, True):
    attention.attend = half_attend if emulate else exact
    on, off = (Engine(path, ctx=256, device="cpu", resident=True, prompt_cache=c) for c in (True, False))
    for e in (on, off):
        e.load()
    prompts = [[(5 * i + 1) % 300 + 2 for i in range(40)], [(7 * i + 2) % 300 + 2 for i in range(33)]]
    for r in range(3):
        for i, ids in enumerate(prompts):
            got, cached = run(on, ids)
            whole, _ = run(off, ids)
            print(f"half {emulate} round {r} conversation {i} cached {cached}: same tokens {got == whole}")
            prompts[i] = ids + got + [40 + 3 * r + i, 7, 9]
    on.close()
    off.close()
