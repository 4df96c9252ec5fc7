"""Architectures: a module per GGUF `general.architecture`, each with config() and build()."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sparkd.engine.errors import EngineError
from sparkd.engine.gguf_file import GGUFModel
from sparkd.engine.layers.experts import ExpertStore, ResidentExperts
from sparkd.engine.layers.quant_experts import KernelExperts
from sparkd.engine.models.config import ModelConfig
from sparkd.engine.models.decoder import Decoder
from sparkd.engine.models.staging import DeviceStager
from sparkd.engine.models.weights import Weights

# GGUF architecture name → module under sparkd.engine.models
ARCHITECTURES = {
    "qwen3moe": "qwen3moe",
    "deepseek2": "deepseek2",
    "glm4moe": "glm4moe",
    "gpt-oss": "gpt_oss",
    "llama": "llama",
    "gemma3": "gemma3",
    "glm-dsa": "glm_dsa",
    "deepseek4": "deepseek4",
    "kimi-k3": "kimi_k3",
}


def arch_module(name: str):
    return importlib.import_module(f"sparkd.engine.models.{ARCHITECTURES[name]}")


@dataclass
class LoadedModel:
    gguf: GGUFModel
    cfg: ModelConfig
    net: Decoder

    def close(self) -> None:
        self.gguf.close()


def config_of(gguf: GGUFModel) -> ModelConfig:
    arch = gguf.require_architecture(ARCHITECTURES)
    return arch_module(arch).config(gguf.metadata, str(gguf.path))


Progress = Callable[[int, int], None]  # (bytes loaded, bytes total)


def load_model(path: str | Path | GGUFModel, store: ExpertStore | None = None,
               progress: Progress | None = None, device: str | torch.device | None = None,
               kernels: bool | None = None) -> LoadedModel:
    """Open a GGUF (first shard = all shards), configure and build its network.

    Routed experts come from `store`; the default keeps them resident in memory. An already
    open GGUFModel may be passed instead of a path (the streaming store shares it); the
    LoadedModel then owns it. `progress` hears bytes read against the bytes the load will read
    (the routed experts' too when they are resident, loaded on first use).

    device "cuda": the network is built there, each trunk tensor read through a bounded host
    buffer into device memory and dequantized there (models/staging.py: the host never holds the
    trunk); projections and routed experts whose type has a Triton kernel stay raw GGUF blocks
    (KernelLinear, KernelExperts), the rest is float32. kernels defaults to device != "cpu" (True
    on the CPU runs the kernels under TRITON_INTERPRET=1). torch.device("meta") (the object: a
    device name from the command line is checked, and meta is not one) builds the device path
    without data, for tests of where tensors go and what the host holds.
    """
    device = "meta" if _is_meta(device) else check_device(device or "cpu")
    kernels = device != "cpu" if kernels is None else kernels
    gguf = path if isinstance(path, GGUFModel) else GGUFModel.open(path)
    try:
        cfg = config_of(gguf)
        # a model streamed on the CPU keeps its trunk quantized: the budget is for experts
        stager = None if device == "cpu" else DeviceStager(gguf, device, _largest_trunk_tensor(gguf))
        w = Weights(gguf, _counter(gguf, progress, resident=store is None) if progress else None,
                    kernels=kernels, quantized=store is not None, stager=stager)
        if store is None and kernels:
            store = KernelExperts(gguf, device, w.get, w.act_format)
        store = store or ResidentExperts(w.get, w.has, w.act_format)
        try:
            net = arch_module(cfg.arch).build(cfg, w, store)
        finally:
            if stager is not None:  # later reads (expert biases on first use) go through the host
                w.stager = None
                stager.close()
        return LoadedModel(gguf, cfg, net.to(device))
    except BaseException:
        gguf.close()
        raise


def warm_experts(net: Decoder) -> None:
    """Read every resident expert now (they load a layer at a time on first use), so neither a first request nor a
    timed prompt pays for it."""
    for block in net.blocks:
        if hasattr(block.ffn, "store"):  # a MoE block
            block.ffn.store.get(block.ffn.il, [0])


def check_device(device: str) -> str:
    """The device, if torch can run on it: "cpu" or "cuda[:N]" with a CUDA device present."""
    if device != "cpu" and not (device.split(":")[0] == "cuda" and torch.cuda.is_available()):
        raise EngineError(f"could not use device {device!r}: torch {torch.__version__} sees "
                          f"{torch.cuda.device_count()} CUDA device(s); use --device cpu, or a "
                          f"CUDA build of torch on a machine with an NVIDIA GPU")
    return device


def _is_meta(device: str | torch.device | None) -> bool:
    return isinstance(device, torch.device) and device.type == "meta"


def _largest_trunk_tensor(gguf: GGUFModel) -> int:
    # here, not at the top: plan imports this package
    from sparkd.engine.streaming.plan import largest_trunk_tensor_bytes

    return largest_trunk_tensor_bytes(gguf)


def _counter(gguf: GGUFModel, progress: Progress, resident: bool) -> Callable[[int], None]:
    from sparkd.engine.streaming.plan import EXPERT_WEIGHT

    total = sum(t.nbytes for n, t in gguf.tensors.items() if resident or not EXPERT_WEIGHT.match(n))
    done = [0]

    def on_read(nbytes: int) -> None:
        done[0] += nbytes
        progress(min(done[0], total), total)
    return on_read
