"""GGUFModel against small real GGUFs written by gguf.GGUFWriter, and every bad-file case."""

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from sparkd.engine.errors import (GGUFFormatError, MissingKeyError, MissingShardError, MissingTensorError,
                                  ModelError, ShapeMismatchError, TensorPastEndError, TruncatedFileError,
                                  UnsupportedArchitectureError, UnsupportedTypeError)
from sparkd.engine import gguf_header
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.tensors import load_tensor, raw_tensor

def tensors_fixture() -> dict[str, np.ndarray]:
    RNG = np.random.default_rng(7)  # same values on every call
    return {
        "token_embd.weight": RNG.standard_normal((8, 64)).astype(np.float32),
        "blk.0.attn_norm.weight": RNG.standard_normal(64).astype(np.float16),
        "blk.0.ffn_up.weight": RNG.standard_normal((4, 2, 64)).astype(np.float32),
        "blk.0.ssm_f_b": RNG.standard_normal(64).astype(np.float32),  # stored as Q8_0 below
    }


def write_model(path: Path, tensors: dict[str, np.ndarray], *, quant: dict[str, T] | None = None,
                split_max_tensors: int = 0, arch: str = "qwen3moe") -> Path:
    """Write tensors (F32/F16 as given, names in `quant` quantized) and return the first file."""
    quant = quant or {}
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    writer.add_block_count(1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "ü"])
    writer.add_array("tokenizer.ggml.scores", [0.5, 1.5, -2.0])
    for name, data in tensors.items():
        if name in quant:
            writer.add_tensor(name, gguf.quantize(data, quant[name]), raw_dtype=quant[name])
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return path.with_name(f"{path.stem}-00001-of-{len(writer.tensors):05d}.gguf")
    return path


@pytest.fixture
def model_path(tmp_path) -> Path:
    return write_model(tmp_path / "m.gguf", tensors_fixture(), quant={"blk.0.ssm_f_b": T.Q8_0})


def test_metadata_and_index(model_path):
    with GGUFModel.open(model_path) as model:
        assert model.arch == "qwen3moe"
        assert model.field("qwen3moe.block_count") == 1
        assert model.arch_field("block_count") == 1
        assert model.field("tokenizer.ggml.tokens") == ["a", "b", "ü"]
        assert model.field("tokenizer.ggml.scores") == [0.5, 1.5, -2.0]
        assert model.field("nope", 3) == 3
        up = model.tensors["blk.0.ffn_up.weight"]
        assert up.shape == (4, 2, 64) and up.ggml_type == T.F32 and up.nbytes == 4 * 2 * 64 * 4
        assert up.offset % 32 == 0 and up.path == model_path
        assert model.tensors["blk.0.ssm_f_b"].ggml_type == T.Q8_0
        assert model.total_bytes == sum(t.nbytes for t in model.tensors.values())
        assert len(model.shards) == 1


def test_read_bytes_matches_reader(model_path):
    """Cross-check offsets against gguf's own reader."""
    reader = gguf.GGUFReader(model_path)
    expected = {t.name: (int(t.data_offset), bytes(t.data.tobytes())) for t in reader.tensors}
    del reader
    with GGUFModel.open(model_path) as model:
        for name, (offset, data) in expected.items():
            info = model.tensors[name]
            assert info.offset == offset
            assert model.read_bytes(info).tobytes() == data


def test_load_tensor_any_type(model_path):
    src = tensors_fixture()
    with GGUFModel.open(model_path) as model:
        emb = load_tensor(model, "token_embd.weight")
        assert emb.dtype == torch.float32 and torch.equal(emb, torch.from_numpy(src["token_embd.weight"]))
        norm = load_tensor(model, "blk.0.attn_norm.weight", dtype=torch.float16)
        assert torch.equal(norm, torch.from_numpy(src["blk.0.attn_norm.weight"]))
        # a "should be float" bias stored as Q8_0 loads like anything else
        bias = load_tensor(model, "blk.0.ssm_f_b", expect_shape=(64,))
        ref = gguf.dequantize(gguf.quantize(src["blk.0.ssm_f_b"], T.Q8_0), T.Q8_0)
        assert torch.equal(bias, torch.from_numpy(ref))
        raw, qtype, shape = raw_tensor(model, "blk.0.ssm_f_b")
        assert raw.dtype == torch.uint8 and raw.numel() == 2 * 34 and qtype == T.Q8_0 and shape == (64,)


def test_missing_tensor_key_and_expected_shape(model_path):
    with GGUFModel.open(model_path) as model:
        with pytest.raises(MissingTensorError, match="'blk.9.x'"):
            load_tensor(model, "blk.9.x")
        with pytest.raises(MissingKeyError, match="'qwen3moe.expert_count'"):
            model.arch_field("expert_count")
        with pytest.raises(ShapeMismatchError, match=r"\[4, 2, 64\] does not match the \[4, 64\]"):
            load_tensor(model, "blk.0.ffn_up.weight", expect_shape=(4, 64))


def test_unsupported_architecture_lists_supported(model_path):
    with GGUFModel.open(model_path) as model:
        assert model.require_architecture(["qwen3moe", "gemma3"]) == "qwen3moe"
        with pytest.raises(UnsupportedArchitectureError) as err:
            model.require_architecture(["gemma3", "deepseek2"])
    assert "'qwen3moe' is not supported (supported: deepseek2, gemma3)" in str(err.value)


def test_split_model_is_one_model(tmp_path):
    src = tensors_fixture()
    first = write_model(tmp_path / "s.gguf", src, split_max_tensors=1)
    assert first.name == "s-00001-of-00004.gguf"
    with GGUFModel.open(first) as model:
        assert len(model.shards) == 4 and model.arch == "qwen3moe"
        assert {info.path.name for info in model.tensors.values()} == {
            f"s-0000{i}-of-00004.gguf" for i in range(1, 5)}
        for name in ("token_embd.weight", "blk.0.ffn_up.weight"):
            assert torch.equal(load_tensor(model, name), torch.from_numpy(src[name]))


def test_missing_shard_named(tmp_path):
    first = write_model(tmp_path / "s.gguf", tensors_fixture(), split_max_tensors=1)
    gone = tmp_path / "s-00003-of-00004.gguf"
    gone.unlink()
    with pytest.raises(MissingShardError, match="shard 3 of 4") as err:
        GGUFModel.open(first)
    assert err.value.path == gone and str(gone) in str(err.value)


def test_later_shard_refused(tmp_path):
    write_model(tmp_path / "s.gguf", tensors_fixture(), split_max_tensors=1)
    with pytest.raises(ModelError, match="shard 2 of 4; open the first shard"):
        GGUFModel.open(tmp_path / "s-00002-of-00004.gguf")


def test_truncated_shard(tmp_path):
    first = write_model(tmp_path / "s.gguf", tensors_fixture(), split_max_tensors=1)
    shard = tmp_path / "s-00003-of-00004.gguf"
    os.truncate(shard, shard.stat().st_size - 10)
    with pytest.raises(TensorPastEndError, match="'blk.0.ffn_up.weight'.*the file is truncated") as err:
        GGUFModel.open(first)
    assert err.value.path == shard and err.value.tensor == "blk.0.ffn_up.weight"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_failed_open_leaves_no_fds(tmp_path):
    first = write_model(tmp_path / "s.gguf", tensors_fixture(), split_max_tensors=1)
    (tmp_path / "s-00004-of-00004.gguf").unlink()
    before = _open_fds()
    with pytest.raises(MissingShardError):
        GGUFModel.open(first)
    assert _open_fds() == before


# --- bad files, made by editing the bytes of a good one -----------------------------------------
def _edit(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _first_entry_type_offset(path: Path, name: str) -> int:
    """Offset of the type id field in the tensor index entry of `name`."""
    reader = gguf.GGUFReader(path)
    field = next(t.field for t in reader.tensors if t.name == name)
    _len, _name, _ndims, dims, _type, _off = field.parts
    at = field.offset + 8 + len(name) + 4 + 8 * len(dims)
    del reader
    return at


def test_bad_magic(model_path):
    _edit(model_path, 0, b"GGML")
    with pytest.raises(GGUFFormatError, match=r"bad magic b'GGML' at offset 0") as err:
        GGUFModel.open(model_path)
    assert err.value.path == model_path and err.value.offset == 0


def test_bad_version(model_path):
    _edit(model_path, 4, struct.pack("<I", 7))
    with pytest.raises(GGUFFormatError, match="version 7 at offset 4 is not supported"):
        GGUFModel.open(model_path)


def test_truncated_header(model_path):
    os.truncate(model_path, 100)
    with pytest.raises(TruncatedFileError, match="file ends at byte 100"):
        GGUFModel.open(model_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(TruncatedFileError, match="magic at offset 0 needs 4 bytes"):
        GGUFModel.open(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="could not open model file .*nothere.gguf: No such file"):
        GGUFModel.open(tmp_path / "nothere.gguf")


def test_truncated_data(model_path):
    with GGUFModel.open(model_path) as model:
        last = max(model.tensors.values(), key=lambda info: info.offset)
    os.truncate(model_path, last.offset + last.nbytes - 1)
    with pytest.raises(TensorPastEndError) as err:
        GGUFModel.open(model_path)
    assert err.value.tensor == last.name and err.value.offset == last.offset
    assert f"ends at byte {last.offset + last.nbytes - 1}; the file is truncated" in str(err.value)


def test_tensor_offset_past_end(model_path):
    at = _first_entry_type_offset(model_path, "blk.0.attn_norm.weight") + 4
    _edit(model_path, at, struct.pack("<Q", 1 << 40))
    with pytest.raises(TensorPastEndError, match=r"'blk.0.attn_norm.weight'.*at offset \d+ runs to byte"):
        GGUFModel.open(model_path)


def test_unknown_type_id(model_path):
    at = _first_entry_type_offset(model_path, "blk.0.ffn_up.weight")
    _edit(model_path, at, struct.pack("<I", 99))
    with pytest.raises(UnsupportedTypeError, match="'blk.0.ffn_up.weight'.*unknown ggml type id 99"):
        GGUFModel.open(model_path)


def test_type_changed_overlaps_neighbour(model_path):
    """F16 -> F32 for the norm doubles its size: it now runs into the next tensor."""
    at = _first_entry_type_offset(model_path, "blk.0.attn_norm.weight")
    _edit(model_path, at, struct.pack("<I", int(T.F32)))
    with pytest.raises(ShapeMismatchError, match="'blk.0.attn_norm.weight'.*overlaps tensor"):
        GGUFModel.open(model_path)


def test_row_not_multiple_of_block(model_path):
    at = _first_entry_type_offset(model_path, "blk.0.attn_norm.weight")
    _edit(model_path, at, struct.pack("<I", int(T.Q4_K)))
    with pytest.raises(ShapeMismatchError, match="row length 64 is not a multiple of Q4_K's block size 256"):
        GGUFModel.open(model_path)


def test_truncated_after_open(model_path):
    with GGUFModel.open(model_path) as model:
        os.truncate(model_path, model.tensors["blk.0.ffn_up.weight"].offset + 8)
        with pytest.raises(TruncatedFileError, match="truncated after the model was opened"):
            load_tensor(model, "blk.0.ffn_up.weight")


def test_header_parsed_across_small_chunks(model_path, monkeypatch):
    """Every field straddling a read-chunk boundary still parses (the fast path falls back)."""
    with GGUFModel.open(model_path) as model:
        expected = (model.metadata, model.tensors)
    monkeypatch.setattr(gguf_header, "_CHUNK_BYTES", 7)
    with GGUFModel.open(model_path) as model:
        assert (model.metadata, model.tensors) == expected


def test_invalid_utf8_in_string_array(model_path):
    data = model_path.read_bytes()
    at = data.index("ü".encode())
    _edit(model_path, at, b"\xff\xfe")
    with pytest.raises(GGUFFormatError, match=f"'tokenizer.ggml.tokens' at offset {at - 8} is not UTF-8"):
        GGUFModel.open(model_path)


def test_expert_slices(tmp_path):
    src = tensors_fixture()
    path = write_model(tmp_path / "e.gguf", src, quant={"blk.0.ffn_up.weight": T.Q8_0})
    with GGUFModel.open(path) as model:
        info = model.tensors["blk.0.ffn_up.weight"]  # [4 experts, 2, 64] as Q8_0
        raw = model.read_bytes(info)
        per_expert = info.nbytes // 4
        for e in range(4):
            offset, nbytes = info.leading_slice(e)
            assert (offset, nbytes) == (info.offset + e * per_expert, per_expert)
        with pytest.raises(IndexError):
            info.leading_slice(4)
        assert raw.size == 4 * per_expert


def test_directory_is_not_a_model(tmp_path):
    before = _open_fds()
    with pytest.raises(ModelError, match="not a regular file"):
        GGUFModel.open(tmp_path)
    assert _open_fds() == before


def test_big_endian_refused(model_path):
    _edit(model_path, 4, struct.pack(">I", 3))
    with pytest.raises(GGUFFormatError, match="big-endian"):
        GGUFModel.open(model_path)
