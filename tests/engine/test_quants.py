"""Our torch dequantizers against gguf-py's numpy reference on random valid blocks."""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from sparkd.engine import quants
from sparkd.engine.errors import ShapeMismatchError, UnsupportedTypeError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.modelgen.blocks import set_iq1_m_d
from sparkd.engine.tensors import load_tensor, raw_tensor

# Every type the gguf package can dequantize (its trait registry plus its F32/F16 fast paths).
REFERENCE_TYPES = sorted({T.F32, T.F16, *gq._type_traits}, key=lambda t: t.name)

# Byte offsets of the f16 fields in each block: random bytes there could be inf/NaN, which is
# not a valid block, so they are overwritten with random finite f16 values.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.TQ1_0: [52], T.TQ2_0: [64], T.IQ1_S: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0],
    T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0],
}


def finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 over the whole range: normals, subnormals, zeros, both signs."""
    x = rng.standard_normal(n) * 10.0 ** rng.uniform(-9, 4, n)
    x[rng.random(n) < 0.02] = 0.0
    return x.astype(np.float16)


def random_blocks(qtype: T, n_blocks: int, seed: int) -> np.ndarray:
    """[n_blocks * type_size] uint8 of valid blocks of qtype."""
    rng = np.random.default_rng(seed)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-40, 30, n_blocks)).astype(np.float32).view(np.uint8)
    if qtype == T.BF16:
        return (rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if qtype == T.F16:
        return finite_f16(rng, n_blocks).view(np.uint8)
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for at in F16_FIELDS.get(qtype, []):
        blocks[:, at:at + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(-1, 2)
    if qtype == T.IQ1_M:  # the f16 scale is spread over the top nibbles of 4 u16 at byte 48
        set_iq1_m_d(blocks, finite_f16(rng, n_blocks))
    if qtype == T.MXFP4:  # e8m0 scale byte: 255 is NaN, and near it 2^e * 6 overflows f32
        blocks[:, 0] = rng.integers(0, 250, n_blocks, dtype=np.uint8)
    return blocks.reshape(-1)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between float32 arrays (0 where equal, -0 == +0)."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    dist = np.abs(ordered(a) - ordered(b))
    return np.where(a == b, 0, dist)


@pytest.mark.parametrize("qtype", REFERENCE_TYPES, ids=lambda t: t.name)
def test_matches_gguf_reference(qtype):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 2048 if block_size > 1 else 2048 * 32
    raw = random_blocks(qtype, n_blocks, seed=int(qtype))
    rows = 4
    shape = (rows, n_blocks * block_size // rows)
    ref = gguf.dequantize(raw.reshape(rows, -1), qtype).astype(np.float32).reshape(-1)
    ours = quants.dequantize(torch.from_numpy(raw), qtype, shape)
    assert ours.dtype == torch.float32 and ours.shape == shape
    ours = ours.numpy().reshape(-1)
    assert np.isfinite(ref).all(), "generator made an invalid block"
    ulps = ulp_distance(ours, ref).reshape(-1, block_size).max(axis=1)
    worst = int(ulps.argmax())
    assert ulps[worst] == 0, (  # measured bit-exact for every type; 1 ulp would be allowed
        f"{qtype.name}: worst block {worst} is {ulps[worst]} ulp off; bytes "
        f"{raw.reshape(n_blocks, -1)[worst].tobytes().hex() if block_size > 1 else raw[worst * type_size:(worst + 1) * type_size].tobytes().hex()}\n"
        f"ours {ours.reshape(-1, block_size)[worst][:16]}\nref  {ref.reshape(-1, block_size)[worst][:16]}")


def test_table_matches_gguf_layouts():
    for qtype, fmt in quants.FORMATS.items():
        assert gguf.GGML_QUANT_SIZES[qtype] == (fmt.block_size, fmt.type_size), qtype.name
    assert set(REFERENCE_TYPES) <= set(quants.FORMATS)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.IQ2_XS, T.Q5_0], ids=lambda t: t.name)
def test_many_steps_equal_one(qtype, monkeypatch):
    """The step loop that bounds temporaries must not change results at step edges."""
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = torch.from_numpy(random_blocks(qtype, 40, seed=3))
    whole = quants.dequantize(raw, qtype, (40 * block_size,))
    monkeypatch.setattr(quants, "_STEP_VALUES", 3 * block_size)
    assert torch.equal(quants.dequantize(raw, qtype, (40 * block_size,)), whole)


def test_wrong_byte_count():
    raw = torch.zeros(33, dtype=torch.uint8)
    with pytest.raises(ShapeMismatchError, match=r"Q8_0 tensor of shape \[32\]: expects 34 uint8 bytes"):
        quants.dequantize(raw, T.Q8_0, (32,))


def test_row_not_multiple_of_block():
    with pytest.raises(ShapeMismatchError, match="multiples of 256"):
        quants.dequantize(torch.zeros(144, dtype=torch.uint8), T.Q4_K, (2, 128))


def test_type_without_dequantizer():
    with pytest.raises(UnsupportedTypeError, match="could not dequantize Q8_K: no dequantizer"):
        quants.dequantize(torch.zeros(292, dtype=torch.uint8), T.Q8_K, (256,))


def test_load_tensor_every_type_from_a_file(tmp_path):
    """Write one tensor of each type into a GGUF and load it back through the generic loader."""
    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    expected = {}
    for qtype in REFERENCE_TYPES:
        block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
        raw = random_blocks(qtype, 4 if block_size > 1 else 256, seed=100 + int(qtype)).reshape(2, -1)
        writer.add_tensor(f"t.{qtype.name}", raw, raw_dtype=qtype)
        expected[qtype] = gguf.dequantize(raw, qtype).astype(np.float32)
    writer.add_tensor("t.Q8_K", np.zeros((2, 292), dtype=np.uint8), raw_dtype=T.Q8_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFModel.open(path) as model:
        for qtype, ref in expected.items():
            got = load_tensor(model, f"t.{qtype.name}")
            assert got.shape == ref.shape and np.array_equal(got.numpy(), ref, equal_nan=True), qtype.name
        raw, qtype, shape = raw_tensor(model, "t.Q8_K")
        assert qtype == T.Q8_K and shape == (2, 256) and raw.numel() == 2 * 292
        with pytest.raises(UnsupportedTypeError, match="could not load tensor 't.Q8_K' from .*Q8_K"):
            load_tensor(model, "t.Q8_K")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", REFERENCE_TYPES, ids=lambda t: t.name)
def test_cuda_equals_cpu(qtype):
    """The same torch code on CUDA tensors gives the CPU reference's bits."""
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 512 if block_size > 1 else 512 * 32
    raw = torch.from_numpy(random_blocks(qtype, n_blocks, seed=5))
    shape = (n_blocks * block_size,)
    cpu = quants.dequantize(raw, qtype, shape)
    cuda = quants.dequantize(raw.cuda(), qtype, shape)
    assert cuda.device.type == "cuda" and torch.equal(cuda.cpu(), cpu)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.F16, T.IQ2_XS], ids=lambda t: t.name)
def test_dequantize_into_a_buffer_equals_a_fresh_tensor(qtype):
    """out= (the streaming store's reused buffer, Q8_0's in-place path) gives the same bits, and
    leaves the buffer's tail alone."""
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = torch.from_numpy(random_blocks(qtype, 64, seed=11))
    shape = (8, 8 * block_size)
    buf = torch.full((64 * block_size + 5,), 7.0)
    got = quants.dequantize(raw, qtype, shape, out=buf)
    assert torch.equal(got, quants.dequantize(raw, qtype, shape))
    assert got.data_ptr() == buf.data_ptr() and torch.equal(buf[-5:], torch.full((5,), 7.0))
