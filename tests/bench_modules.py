"""A bench/ script loaded as a module for its tests (bench/ is not a package)."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    """bench/<name>.py, run as a fresh module named bench_<name>."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
