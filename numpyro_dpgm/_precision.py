"""Guards against silent float32 arithmetic.

Counts reach 1e6 and step sizes 1/N: in float32 the estimators stall without an error. The
library never enables float64 itself (that is a process-wide JAX flag); it warns instead.
"""

from __future__ import annotations

import jax

from ._warnings import warn

__all__ = ["Float32Warning", "warn_if_float32"]


class Float32Warning(UserWarning):
    """JAX runs in float32; results of this routine may be inaccurate."""


def warn_if_float32(where: str) -> None:
    """Warn once per call site when JAX's 64-bit mode is off."""
    if not jax.config.jax_enable_x64:
        warn(
            f"{where}: JAX is running in float32, which loses precision with counts in the "
            "thousands and large log-potentials. Call numpyro.enable_x64() (or "
            "jax.config.update('jax_enable_x64', True)) at the start of your program.",
            Float32Warning
        )
