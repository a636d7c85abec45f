"""JAX's persistent compilation cache, turned on for the command line.

Every ``dpgm`` command is a new process, and without a cache each one compiles its programs
afresh (the library keeps them only for the life of a process). The command line therefore turns
on JAX's persistent compilation cache, so that a command run again on a release of a known
structure loads its programs from disk instead: ``python -m benchmarks cli_cache`` measures the
effect. The library itself never does (where a program's compilations go is its user's choice).

Where: ``DPGM_COMPILATION_CACHE`` names the folder, or ``off`` turns the cache off; by default
the user's cache folder (``numpyro_dpgm/jax`` under ``platformdirs.user_cache_dir``). A folder
set through JAX's own ``JAX_COMPILATION_CACHE_DIR`` is left as it is. JAX does not bound the
folder's size here (its bound, ``jax_compilation_cache_max_size``, needs the ``filelock``
package); deleting the folder clears it, at the cost of compiling again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["ENV", "enable_compilation_cache"]

#: The environment variable: a folder, or ``off`` (also ``0``, ``false``, ``no``).
ENV = "DPGM_COMPILATION_CACHE"

_OFF = {"off", "0", "false", "no"}


def enable_compilation_cache(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Turn JAX's persistent compilation cache on for this process; return its folder.

    Every program is cached, however quick its compilation (a command compiles many small
    ones). Before JAX is imported this sets JAX's environment variables (so that nothing is
    imported for ``--help``); after, it updates JAX's configuration.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read and set (default ``os.environ``).

    Returns
    -------
    Path or None
        The folder, or ``None`` when ``DPGM_COMPILATION_CACHE`` turns the cache off.

    Examples
    --------
    >>> enable_compilation_cache({"DPGM_COMPILATION_CACHE": "off"}) is None
    True
    >>> env = {"DPGM_COMPILATION_CACHE": "/tmp/dpgm-jax", "JAX_COMPILATION_CACHE_DIR": "/x"}
    >>> enable_compilation_cache(env)  # JAX's own setting wins
    PosixPath('/x')
    """
    environ = os.environ if environ is None else environ
    setting = environ.get(ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(environ["JAX_COMPILATION_CACHE_DIR"])
    if setting:
        folder = Path(setting).expanduser()
    else:
        import platformdirs

        folder = Path(platformdirs.user_cache_dir("numpyro_dpgm")) / "jax"
    values = {"jax_compilation_cache_dir": str(folder),
              "jax_persistent_cache_min_compile_time_secs": 0.0}
    if "jax" in sys.modules and environ is os.environ:
        import jax

        if jax.config.jax_compilation_cache_dir:  # set in this process already
            return Path(jax.config.jax_compilation_cache_dir)
        for name, value in values.items():
            jax.config.update(name, value)
    else:
        for name, value in values.items():
            environ.setdefault(name.upper(), str(value))
    return folder
