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

**A bound on the programs kept.** Every compiled XLA program stays in memory as long as its
cache holds it, and the CPU backend maps every fused kernel of a program separately: a fit's
loop takes hundreds of memory maps. The mechanisms compile new programs for every network they
fit (MST on Titanic added about 2,700 maps a run), so a process that ran them in a loop (a
simulation study) reached the kernel's limit of memory maps (``vm.max_map_count``, 65,530 by
default) in its third dozen of runs and died in LLVM ("Cannot allocate memory", then a
segmentation fault). The wrappers here therefore count the programs they hold, all together
(one per function, compile mode, static arguments and argument shapes): once
:data:`MAX_PROGRAMS` are held and a call needs a new one, every wrapper's cache is emptied
first (:func:`clear_programs`). Thirty MST runs on Titanic in one process then peaked at
about 18,000 maps (counted by hand from ``/proc/self/maps`` after each run). A structure used
again after a clearing is compiled again; a fit calls one structure's programs many times in a
row and keeps them.

>>> import jax.numpy as jnp
>>> double = jit_modes(lambda x: 2 * x)
>>> float(double(jnp.ones(()), compile_mode="quick"))
2.0
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["COMPILE_MODES", "MAX_PROGRAMS", "check_compile_mode", "clear_programs",
           "device_array", "jit_modes", "programs_held"]

#: The most compiled programs the :class:`jit_modes` wrappers hold together (module notes).
MAX_PROGRAMS = 32

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
    picks the program. The programs held count towards :data:`MAX_PROGRAMS`.

    Parameters
    ----------
    fun : callable
    static_argnames, static_argnums : sequence of str, sequence of int
        As ``jax.jit``'s.
    """

    def __init__(self, fun: Callable[..., Any], static_argnames: Sequence[str] = (),
                 static_argnums: Sequence[int] = ()):
        self.__wrapped__ = fun
        self.__doc__ = fun.__doc__
        # jax.jit finds the positions of static_argnames itself only without static_argnums
        nums = {"static_argnums": tuple(static_argnums)} if static_argnums else {}
        self._jitted = {mode: jax.jit(fun, static_argnames=tuple(static_argnames),
                                      compiler_options=_OPTIONS[mode], **nums)
                        for mode in COMPILE_MODES}
        names = list(inspect.signature(fun).parameters)
        self._static = {names[i] for i in static_argnums} | set(static_argnames)
        self._positions = {name: i for i, name in enumerate(names)}
        self._held: set[tuple] = set()
        _WRAPPERS.add(self)

    def __call__(self, *args: Any, compile_mode: str = "optimized", **kwargs: Any) -> Any:
        jitted = self._jitted[check_compile_mode(compile_mode)]
        key = (compile_mode, self._signature(args, kwargs))
        if key not in self._held:
            if programs_held() >= MAX_PROGRAMS:
                clear_programs()
            self._held.add(key)
        return jitted(*args, **kwargs)

    def _signature(self, args: tuple, kwargs: dict) -> tuple:
        """The static arguments, and the shapes and types of the others: what a program is
        compiled for."""
        static, dynamic = [], []
        # positional arguments first (fewer than the parameters where defaults apply)
        for name, value in [*zip(self._positions, args, strict=False), *sorted(kwargs.items())]:
            (static if name in self._static else dynamic).append((name, value))
        leaves = jax.tree_util.tree_leaves([v for _, v in dynamic])
        return (tuple(static),
                tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves))

    def clear_cache(self) -> None:
        """Drop this function's compiled programs (every mode)."""
        for f in self._jitted.values():
            f.clear_cache()
        self._held.clear()

    def _cache_size(self) -> int:
        """Programs compiled so far, all modes together."""
        return sum(f._cache_size() for f in self._jitted.values())


_WRAPPERS: weakref.WeakSet[jit_modes] = weakref.WeakSet()


def clear_programs() -> None:
    """Drop every program the :class:`jit_modes` wrappers hold (they compile again on their
    next call). Programs of other JAX functions are untouched (``jax.clear_caches()`` drops
    those too)."""
    for wrapper in list(_WRAPPERS):
        wrapper.clear_cache()


def programs_held() -> int:
    """The number of programs counted towards :data:`MAX_PROGRAMS` (those of the live
    wrappers)."""
    return sum(len(wrapper._held) for wrapper in list(_WRAPPERS))
