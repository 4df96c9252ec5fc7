"""Shared test setup: markers that skip with a reason where the real part cannot exist."""

import os
import shutil

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    reasons = {}
    if not _has_cuda():
        reasons["gpu"] = "no CUDA GPU here; runs on the device box"
    if os.geteuid() != 0:
        reasons["root"] = "needs root"
    if os.geteuid() != 0 or not shutil.which("unshare") or not os.path.exists("/lib/systemd/systemd"):
        reasons["systemd"] = "needs root, unshare and /lib/systemd/systemd to boot a sandboxed systemd"
    for item in items:
        for mark, why in reasons.items():
            if mark in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))
