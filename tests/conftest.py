"""Test configuration: float64 everywhere (the library itself never flips the flag)."""

import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

# make tests/oracles importable as `oracles`
sys.path.insert(0, str(Path(__file__).parent))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
