"""``jax.jit`` with a choice between a quickly compiled and a fully optimised program.

A fit compiles its loop once per network. Where the network changes every round and each
program runs a few hundred iterations of small tables (AIM's and MWEM's refits), compiling is
most of the time: AIM on Adult spent 336 of its 361 fitting seconds compiling. XLA's backend
optimisation level 0 (no LLVM optimisation passes) compiles those programs about twice as
fast, and runs them 1.5 to 2 times slower (AIM's refits on Adult at ε = 1, one run each;
docs/mechanisms.md). Both programs compute the same function in the same floating-point
type; the compiler may round differently in the last bits (fusing or reordering operations),
so iterates agree to rounding and a stopping rule may fire an iteration or so apart.

:class:`jit_modes` holds one ``jax.jit`` of a function per :data:`COMPILE_MODES` entry and
calls the one its ``compile_mode=`` keyword names (each keeps its own cache).

>>> import jax.numpy as jnp
>>> double = jit_modes(lambda x: 2 * x)
>>> float(double(jnp.ones(()), compile_mode="quick"))
2.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["COMPILE_MODES", "check_compile_mode", "device_array", "jit_modes"]

#: ``"optimized"``: XLA's defaults; ``"quick"``: backend optimisation level 0.
COMPILE_MODES = ("optimized", "quick")
_OPTIONS: dict[str, dict[str, Any] | None] = {
    "optimized": None,
    "quick": {"xla_backend_optimization_level": 0},
}


def device_array(value: Any) -> Any:
    """A host value as a JAX array, by a transfer: ``jnp.asarray`` of a NumPy array compiles a
    small program per shape, which a loop over many shapes pays for every time. A traced
    value is returned as it is.

    >>> device_array(np.arange(3.0)).shape
    (3,)
    """
    if isinstance(value, jax.core.Tracer):
        return value
    return jax.device_put(np.asarray(value))


def check_compile_mode(compile_mode: str) -> str:
    """``compile_mode`` if it is one of :data:`COMPILE_MODES`; else a ``ValueError``."""
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}: "
                         "'quick' for programs run briefly (a new network every round), "
                         "'optimized' for long fits")
    return compile_mode


class jit_modes:
    """``fun`` jitted once per compile mode; ``compile_mode=`` (default ``"optimized"``)
    picks the program.

    Parameters
    ----------
    fun : callable
    static_argnames : sequence of str
        As ``jax.jit``'s.
    """

    def __init__(self, fun: Callable[..., Any], static_argnames: Sequence[str] = ()):
        self.__wrapped__ = fun
        self.__doc__ = fun.__doc__
        self._jitted = {mode: jax.jit(fun, static_argnames=tuple(static_argnames),
                                      compiler_options=_OPTIONS[mode])
                        for mode in COMPILE_MODES}

    def __call__(self, *args: Any, compile_mode: str = "optimized", **kwargs: Any) -> Any:
        return self._jitted[check_compile_mode(compile_mode)](*args, **kwargs)

    def _cache_size(self) -> int:
        """Programs compiled so far, all modes together."""
        return sum(f._cache_size() for f in self._jitted.values())
