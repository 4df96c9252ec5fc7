"""make-model's tensor types against llama-quantize's (session 36): an F32 model quantized by llama.cpp with --pure
(every weight the asked type, llama-quant.cpp's fallback where its rows are not whole blocks of it) has, tensor by
tensor, the types make-model writes for that type. The tiny shapes' rows of 16, 32 and 64 values meet every fallback:
a 32-value type of about the same bits (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL),
F16 where that does not fit either."""

import pytest

from llama_oracle import llama_quantize
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.make_model import plan, write_model
from sparkd.engine.modelgen.specs import TINY

pytestmark = pytest.mark.oracle
# the quantize tool takes llama.cpp's file types, whose default type --pure writes everywhere
FTYPE = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M"}


CASES = [(arch, quant) for arch in ("qwen3moe", "deepseek2") for quant in ("Q4_K", "Q5_K", "Q6_K", "Q3_K", "IQ4_XS")]
CASES.append(("deepseek2", "Q8_0"))  # its attn_k_b's rows of 16: F16


@pytest.mark.parametrize("arch, quant", CASES)
def test_make_model_falls_back_as_llama_quantize_does(tmp_path, arch, quant):
    f32 = write_model(tmp_path / "f32.gguf", plan(TINY[arch], "F32"), seed=2)[0]
    ours = {name: q for name, _, q, _, _ in plan(TINY[arch], quant).tensors}
    with GGUFModel.open(llama_quantize(f32, tmp_path / "q.gguf", FTYPE.get(quant, quant), pure=True)) as g:
        theirs = {name: t.ggml_type for name, t in g.tensors.items()}
    assert {n: q.name for n, q in ours.items()} == {n: q.name for n, q in theirs.items()}
    assert {q.name for q in ours.values()} - {quant, "F32"}  # some weight fell back
