"""Test configuration: float64 everywhere (the library itself never flips the flag)."""

import os
import sys
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)
# the command line's persistent compilation cache stays off for the in-process CLI tests (it is
# process-wide); tests/test_compilation_cache.py turns it on in child processes
os.environ["DPGM_COMPILATION_CACHE"] = "off"

# make tests/oracles importable as `oracles`, and the source checkout's studies/ and benchmarks/
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    Every compiled XLA program keeps memory mappings of its code for as long as JAX caches it,
    and a worker that runs hundreds of modules reached tens of thousands of mappings (29,000
    five minutes into the suite, counted by hand from ``/proc/self/maps`` after each test; with
    this fixture the worst worker peaked at 18,038); at the kernel's limit
    (``vm.max_map_count``, 65,530 here) the next compilation cannot map its code and the
    worker dies with a segmentation fault inside XLA. Tests that count compilations do so
    within one module.
    """
    yield
    jax.clear_caches()


@pytest.fixture
def keep_programs(monkeypatch):
    """Lift the library's bound on held programs (``numpyro_dpgm._jit.MAX_PROGRAMS``) for a
    test that counts compilations: no clearing in the middle of the count."""
    from numpyro_dpgm import _jit

    monkeypatch.setattr(_jit, "MAX_PROGRAMS", 10**9)
