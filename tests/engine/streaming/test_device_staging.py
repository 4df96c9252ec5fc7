"""The trunk goes to a device tensor by tensor through one bounded host buffer (models/staging.py).

Without a GPU, torch's "meta" device stands in for it: load_model(device=META) runs the device
path (the staging buffer is real host memory, the device tensors take none), so the host memory
a child process holds during that load is what the loader holds. The same measurement on CUDA
runs on the GPU box (marked gpu), with the loaded weights compared bit for bit to the CPU's."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO, drop_page_cache, resident_pages

from sparkd.engine.errors import EngineError
from sparkd.engine.gguf_file import GGUFModel, TruncatedFileError
from sparkd.engine.make_model import plan as model_plan
from sparkd.engine.make_model import write_model
from sparkd.engine.modelgen.shape import Shape
from sparkd.engine.modelgen.specs import TINY
from sparkd.engine.models import load_model
from sparkd.engine.models.staging import DeviceStager, staging_buffer_bytes
from sparkd.engine.streaming.plan import largest_trunk_tensor_bytes
from sparkd.engine.tensors import load_tensor

# the repo first, then what the caller had (the GPU box installs wheels on PYTHONPATH)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
META = torch.device("meta")  # the object: load_model refuses the name, as the command line's --device
# Anonymous memory a load may hold above the buffer: Python objects, the allocator's rounding.
SLACK_BYTES = 16 << 20


@pytest.fixture(scope="module")
def wide(disk_dir):
    """A 2-layer qwen3moe with a 32768 x 1024 vocabulary: its token embedding is 134 MB as f32
    (the GPU path dequantizes it), from 36 MB of Q8_0 blocks; 79 MB file."""
    shape = Shape("qwen3moe", n_vocab=32768, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128)
    path = write_model(disk_dir / "wide-vocab-q8_0.gguf", model_plan(shape, "Q8_0"), seed=1)[0]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped: the page-cache test needs them written back
    finally:
        os.close(fd)
    return path


def load_memory(model, device: str) -> dict:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "load_memory.py"), str(model), "--device", device],
                       capture_output=True, text=True, timeout=120, env=ENV, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_device_load_holds_the_staging_buffer_not_the_trunk(wide):
    with GGUFModel.open(wide) as g:
        embd_f32 = 4 * g.tensor("token_embd.weight").n_elements
        buffer = staging_buffer_bytes(largest_trunk_tensor_bytes(g))
    assert buffer + SLACK_BYTES < embd_f32 / 2  # the bound below tells the two loaders apart
    control = load_memory(wide, "cpu")  # the trunk lives on the host: the measurement sees it
    assert control["peak_over_baseline_bytes"] > embd_f32
    m = load_memory(wide, "meta")
    print(f"host peak over the built network: cpu {control['peak_over_after_bytes']}, "
          f"meta {m['peak_over_after_bytes']} (buffer {buffer}, f32 embedding {embd_f32})")
    assert m["peak_over_baseline_bytes"] < buffer + SLACK_BYTES, m
    assert m["peak_over_after_bytes"] < buffer + SLACK_BYTES, m


def test_the_staged_trunk_leaves_no_page_cache_behind(wide):
    drop_page_cache(wide)
    m = load_model(wide, device=META)
    m.close()
    trunk_pages = sum(-(-t.nbytes // 4096) for n, t in GGUFModel.open(wide).tensors.items() if "_exps." not in n)
    # what stays: the header and readahead past the last chunk of a tensor, not the trunk
    assert resident_pages(wide) < trunk_pages / 10


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_staged_bytes_in_small_chunks_equal_a_host_read(disk_dir, quant):
    path = write_model(disk_dir / f"stage-{quant}.gguf", model_plan(TINY["gpt-oss"], quant), seed=2)[0]
    with GGUFModel.open(path) as g:
        stager = DeviceStager(g, "cpu", largest_trunk_tensor_bytes(g), chunk_bytes=4096)
        try:
            assert stager.chunk_bytes == 4096 and max(t.nbytes for t in g.tensors.values()) > 3 * 4096
            for name, info in g.tensors.items():  # sizes under, at and over a chunk and both halves
                assert torch.equal(stager.raw(info), torch.from_numpy(g.read_bytes(info))), name
                assert torch.equal(load_tensor(g, name, read=stager.raw), load_tensor(g, name)), name
        finally:
            stager.close()
    assert stager.buffer_bytes == 0


def test_every_architecture_builds_its_trunk_on_the_device(disk_dir):
    """A builder that mixed a host tensor into the staged ones would fail here (meta and CPU
    tensors do not mix), as it would on CUDA."""
    for arch in sorted(TINY):
        path = write_model(disk_dir / f"stage-{arch}.gguf", model_plan(TINY[arch], "Q8_0"), seed=3)[0]
        m = load_model(path, device=META)
        try:
            tensors = list(m.net.parameters()) + list(m.net.buffers())
        finally:
            m.close()
        assert tensors and {t.device.type for t in tensors} == {"meta"}, arch


def test_a_file_truncated_under_a_device_load_is_a_clear_error(wide, tmp_path):
    path = tmp_path / "cut.gguf"
    shutil.copyfile(wide, path)
    g = GGUFModel.open(path)
    os.truncate(path, g.tensor("token_embd.weight").offset + 4096)
    with pytest.raises(TruncatedFileError) as err:
        load_model(g, device=META)
    msg = str(err.value)
    assert "could not read tensor" in msg and str(path) in msg and "truncated" in msg
    assert g.shards == []  # the loader closed the model it was given


def test_meta_is_not_a_device_name_the_command_line_can_give(wide):
    with pytest.raises(EngineError, match="could not use device 'meta'"):
        load_model(wide, device="meta")


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["F16", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"])
def test_cuda_load_equals_the_host_built_weights(disk_dir, quant):
    """Dequantized on the GPU from staged bytes (the token embedding, norms) = dequantized on the
    CPU and moved, bit for bit; raw blocks byte for byte. Rows of 256: K-quants stay K-quants."""
    shape = Shape("qwen3moe", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff_exp=256)
    path = write_model(disk_dir / f"stage-cuda-{quant}.gguf", model_plan(shape, quant), seed=4)[0]
    host, dev = load_model(path, device="cpu", kernels=True), load_model(path, device="cuda")
    try:
        want, got = host.net.state_dict(), dev.net.state_dict()
        assert want.keys() == got.keys()
        for key, value in want.items():
            assert got[key].is_cuda and torch.equal(got[key].cpu(), value), key
    finally:
        host.close()
        dev.close()


@pytest.mark.gpu
def test_a_cuda_load_holds_the_staging_buffer_not_the_trunk(wide):
    with GGUFModel.open(wide) as g:
        buffer = staging_buffer_bytes(largest_trunk_tensor_bytes(g))
    m = load_memory(wide, "cuda")
    print(f"cuda: host peak over the built network {m['peak_over_after_bytes']} (buffer {buffer})")
    assert m["peak_over_after_bytes"] < buffer + SLACK_BYTES, m
