"""Memory cap of the exact oracle: junction trees whose cliques are too large are refused.

The oracle refuses (:class:`CliqueTooLargeError`, before anything is allocated or compiled) a
junction tree any of whose cliques would hold more than a cap of bytes as a float64 table; the
error names the clique, its cells and bytes, and points to the approximate oracle
(``prox_pgm(..., oracle="convex_gbp")``, region graphs of the network's own cliques). The cap
is :data:`DEFAULT_MAX_CLIQUE_BYTES` (1 GiB, 134,217,728 cells), overridden by the environment
variable ``NUMPYRO_DPGM_MAX_CLIQUE_BYTES`` (bytes, read at each check) or, within a block, by
:func:`clique_memory_cap`; :func:`check_memory` applies it to a tree (with an explicit cap as an
argument). It also refuses (:class:`JunctionTreeTooLargeError`) a tree whose tables together,
:data:`WORKING_COPIES` float64 copies of each (:func:`oracle_bytes`), would not fit in the
machine's physical memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from .triangulation import JunctionTree

__all__ = [
    "DEFAULT_MAX_CLIQUE_BYTES",
    "MAX_CLIQUE_BYTES_ENV",
    "WORKING_COPIES",
    "CliqueTooLargeError",
    "JunctionTreeTooLargeError",
    "check_memory",
    "clique_memory_cap",
    "max_clique_bytes",
    "oracle_bytes",
    "physical_memory",
]

# ------------------------------------------------------------------------------------------------
# Memory cap
# ------------------------------------------------------------------------------------------------
#: Default cap on one junction-tree clique table: 1 GiB, i.e. 134,217,728 float64 cells.
DEFAULT_MAX_CLIQUE_BYTES = 2**30
#: Environment variable that overrides the default cap (an integer number of bytes).
MAX_CLIQUE_BYTES_ENV = "NUMPYRO_DPGM_MAX_CLIQUE_BYTES"
_CAP_OVERRIDE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "numpyro_dpgm_max_clique_bytes", default=None)
_ITEMSIZE = 8  # float64


#: Float64 copies of the junction tree's tables that a fit holds at once, an estimate: the
#: log-potentials, the beliefs, the messages, and the residuals that differentiation keeps.
WORKING_COPIES = 4


class CliqueTooLargeError(MemoryError):
    """A junction-tree clique would exceed the exact oracle's memory cap."""


class JunctionTreeTooLargeError(CliqueTooLargeError):
    """The junction tree's tables together would need more memory than the machine has."""


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or ``None`` where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def oracle_bytes(tree: JunctionTree) -> int:
    """Estimated bytes the exact oracle holds for ``tree``: :data:`WORKING_COPIES` float64 copies
    of every clique and separator table."""
    cells = tree.num_cells + sum(tree.domain.size(s) for s in tree.separators)
    return WORKING_COPIES * _ITEMSIZE * cells


def _positive_bytes(value: Any, where: str) -> int:
    """``value`` as a positive int (an int, or a string of digits as from the environment)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool | float | str) or not hasattr(value, "__index__") or value <= 0:
        raise ValueError(f"{where} must be a positive integer number of bytes, got {value!r}")
    return int(value)


def max_clique_bytes() -> int:
    """The cap in force: :func:`clique_memory_cap`'s, else the environment's, else the default.

    Returns
    -------
    int
        Bytes one junction-tree clique table (float64) may take.
    """
    override = _CAP_OVERRIDE.get()
    if override is not None:
        return override
    env = os.environ.get(MAX_CLIQUE_BYTES_ENV)
    if env is not None and env.strip():
        return _positive_bytes(env.strip(), f"${MAX_CLIQUE_BYTES_ENV}")
    return DEFAULT_MAX_CLIQUE_BYTES


@contextlib.contextmanager
def clique_memory_cap(max_bytes: int) -> Iterator[int]:
    """Within the block, the exact oracle's cap is ``max_bytes`` (bytes per clique table).

    Programs compiled before the block are not re-checked; the cap applies when a network's
    oracle is first traced (or run eagerly) inside it.
    """
    token = _CAP_OVERRIDE.set(_positive_bytes(max_bytes, "max_bytes"))
    try:
        yield _CAP_OVERRIDE.get()
    finally:
        _CAP_OVERRIDE.reset(token)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.3g} GiB"


def check_memory(tree: JunctionTree, max_bytes: int | None = None) -> None:
    """Refuse a junction tree whose largest clique table would exceed ``max_bytes``, or whose
    tables together (:func:`oracle_bytes`) would exceed the machine's physical memory.

    Parameters
    ----------
    tree : JunctionTree
    max_bytes : int, optional
        Bytes one float64 clique table may take; default :func:`max_clique_bytes`.

    Raises
    ------
    CliqueTooLargeError
        Naming the largest clique, its cells and bytes, the cap, and the approximate oracle.
    JunctionTreeTooLargeError
        Naming the tree's cells, the estimated bytes, the machine's memory and the remedies.
    """
    cap = max_clique_bytes() if max_bytes is None else _positive_bytes(max_bytes, "max_bytes")
    if not tree.cliques:
        return
    big = max(tree.cliques, key=tree.domain.size)
    cells = tree.domain.size(big)
    if cells * _ITEMSIZE > cap:
        raise CliqueTooLargeError(
            f"the junction tree has clique {big} with {cells:,} cells ({cells * _ITEMSIZE:,} "
            f"bytes = {_gib(cells * _ITEMSIZE)} as float64), above the exact oracle's cap of "
            f"{cap:,} bytes ({_gib(cap)}); use the approximate oracle, e.g. "
            "prox_pgm(..., oracle='convex_gbp'), or raise the cap with "
            f"${MAX_CLIQUE_BYTES_ENV} or inference.memory.clique_memory_cap(bytes)"
        )
    need, physical = oracle_bytes(tree), physical_memory()
    if physical is not None and need > physical:
        raise JunctionTreeTooLargeError(
            f"the junction tree's {len(tree.cliques)} cliques hold {tree.num_cells:,} cells "
            f"(largest {big}, {cells:,}); exact inference needs about {_gib(need)} "
            f"({WORKING_COPIES} float64 copies of every table), more than this machine's "
            f"{_gib(physical)}; use the approximate oracle, e.g. prox_pgm(..., "
            "oracle='convex_gbp'), or measure smaller cliques (coarsen an attribute)"
        )
