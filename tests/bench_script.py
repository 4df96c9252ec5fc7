"""A bench/ script imported as a module by the tests that check what it counts (bench/ is not a
package: its scripts run from the checkout)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"


def load_bench_script(relative: str):
    """bench/<relative> (e.g. "gpu_box/launch_count.py") as a module."""
    path = BENCH / relative
    if str(path.parent) not in sys.path:  # its sibling imports (import q4t_pair) work as when it runs from bench/
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
