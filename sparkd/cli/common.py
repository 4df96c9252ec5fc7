"""Pieces both CLIs share: physical memory size (for percentage sizes) and check-policy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from ..errors import PolicyError
from ..policy import Policy, load_policy


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def read_policy(path: Path) -> Policy:
    return load_policy(path, total_memory_bytes=physical_memory_bytes())


def check_policy(path: Path, *, as_json: bool) -> int:
    """Validate a policy file and print it resolved (sizes in bytes, defaults filled in)."""
    try:
        policy = read_policy(path)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    resolved = policy.model_dump(mode="json")
    if as_json:
        print(json.dumps(resolved, indent=2))
    else:
        print(f"# {path}: valid; resolved policy (sizes in bytes, defaults filled in)")
        print(yaml.safe_dump(resolved, sort_keys=False), end="")
    return 0
