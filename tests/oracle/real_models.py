"""The real small models the oracle tests run (assembled by sparkd.engine.bundled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.engine.bundled import DEFAULT_CACHE, ModelUnavailable, assemble_gemma3


def gemma3_270m(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF, or skip the calling test with the reason."""
    try:
        return assemble_gemma3(cache_dir)
    except ModelUnavailable as exc:
        pytest.skip(str(exc))
