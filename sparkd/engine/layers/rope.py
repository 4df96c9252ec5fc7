"""Rotary position embedding, normal (GPT-J pairs) and NeoX (split halves), with YaRN.

Angles are computed like ggml's rope cache: theta starts at the position and is multiplied by
base^(-2/n_rot) once per pair in float32, so positions far from 0 round the same way as llama.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RopeConfig:
    n_rot: int
    base: float
    neox: bool  # pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    freq_scale: float = 1.0
    ext_factor: float = 0.0  # yarn ramp mix; 1.0 when yarn is on
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0



def _corr_dim(n_rot: int, n_ctx_orig: int, beta: float, base: float) -> float:
    return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))


def rope_cos_sin(cfg: RopeConfig, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, n_rot/2] (already multiplied by the yarn magnitude scale)."""
    half = cfg.n_rot // 2
    f32 = np.float32
    theta_scale = f32(cfg.base) ** f32(-2.0 / cfg.n_rot)
    theta = pos.cpu().numpy().astype(f32)
    low = max(0.0, math.floor(_corr_dim(cfg.n_rot, cfg.n_ctx_orig or 1, cfg.beta_fast, cfg.base)))
    high = min(cfg.n_rot - 1.0, math.ceil(_corr_dim(cfg.n_rot, cfg.n_ctx_orig or 1, cfg.beta_slow, cfg.base)))
    mscale = f32(cfg.attn_factor)
    if cfg.ext_factor != 0.0:
        mscale = f32(mscale * f32(1.0 + 0.1 * math.log(1.0 / cfg.freq_scale)))
    cols = np.empty((theta.shape[0], half), dtype=f32)
    for i in range(half):
        th = f32(cfg.freq_scale) * theta
        if cfg.ext_factor != 0.0:
            ramp = f32((1.0 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))) * cfg.ext_factor)
            th = th * (f32(1.0) - ramp) + theta * ramp
        cols[:, i] = th
        theta = theta * theta_scale
    t = torch.from_numpy(cols)
    return torch.cos(t) * float(mscale), torch.sin(t) * float(mscale)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x: [T, H, Dh] with the rotated part in the first n_rot dims; cos/sin: [T, n_rot/2]."""
    n_rot = cos.shape[-1] * 2
    rot, rest = x[..., :n_rot], x[..., n_rot:]
    c, s = cos[:, None, :].to(x.device, x.dtype), sin[:, None, :].to(x.device, x.dtype)  # [T, 1, n_rot/2]
    if neox:
        a, b = rot[..., : n_rot // 2], rot[..., n_rot // 2:]
        out = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)
