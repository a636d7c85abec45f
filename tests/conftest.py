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


# --- where the suite's time goes: JAX's compile-time events, summed per worker and printed ---
_JAX_TIME = {"trace": 0.0, "lower": 0.0, "compile": 0.0, "cache_load": 0.0}
_JAX_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
               "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
               "/jax/core/compile/backend_compile_duration": "compile",
               "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load"}
_JAX_COUNT = {"programs": 0, "cache_hits": 0}


def _on_duration(event: str, duration: float, **_: object) -> None:
    key = _JAX_EVENTS.get(event)
    if key is not None:
        _JAX_TIME[key] += duration
        if key == "compile":
            _JAX_COUNT["programs"] += 1


def _on_event(event: str, **_: object) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _JAX_COUNT["cache_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the sums to the controller
        workeroutput["jax_time"] = dict(_JAX_TIME, **_JAX_COUNT)


def pytest_testnodedown(node: object, error: object) -> None:
    sums = getattr(node, "workeroutput", {}).get("jax_time")
    if sums:
        for key in _JAX_TIME:
            _JAX_TIME[key] += sums[key]
        for key in _JAX_COUNT:
            _JAX_COUNT[key] += sums[key]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    t = _JAX_TIME
    terminalreporter.write_sep("-", "JAX's compilation in this process and its workers")
    terminalreporter.write_line(
        f"tracing {t['trace']:.0f} s, lowering {t['lower']:.0f} s, XLA compiling "
        f"{t['compile']:.0f} s ({_JAX_COUNT['programs']} programs, "
        f"{_JAX_COUNT['cache_hits']} of them loaded from the persistent cache in "
        f"{t['cache_load']:.0f} s); the notebooks' kernels and other child processes not "
        "counted")
