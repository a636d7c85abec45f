"""Memory cap of the exact oracle: junction trees whose cliques are too large are refused.

The oracle refuses (:class:`CliqueTooLargeError`, before anything is allocated or compiled) a
junction tree any of whose cliques would hold more than a cap of bytes as a float64 table; the
error names the largest cliques with their cells and bytes, what each triangulation heuristic
would need (given the network), and the alternatives: the other ``method``, the approximate
oracle (:class:`~numpyro_dpgm.oracles.protocol.ConvexGBPOracle`, APPGM:
``prox_pgm(..., oracle="convex_gbp")``, region graphs of the network's own cliques) and how to
raise the cap. The cap is :data:`DEFAULT_MAX_CLIQUE_BYTES` (1 GiB, 134,217,728 cells),
overridden by the environment variable ``NUMPYRO_DPGM_MAX_CLIQUE_BYTES`` (bytes, read at each
check) or, within a block, by :func:`clique_memory_cap`; :func:`check_memory` applies it to a
tree (with an explicit cap as an argument, and the tree's network to compare the heuristics).
It also refuses (:class:`JunctionTreeTooLargeError`) a tree whose tables together,
:data:`WORKING_COPIES` float64 copies of each (:func:`oracle_bytes`), would not fit in the
machine's physical memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..network import MarkovNetwork
from .triangulation import JunctionTree, build_junction_tree

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


#: Cliques an error names before it says how many more there are.
_SHOWN = 3
#: The heuristics an error compares (``"auto"`` picks one of these trees).
_HEURISTICS = ("min_fill", "min_size")


def _largest_bytes(tree: JunctionTree) -> int:
    """Bytes of the tree's largest clique table as float64 (0 for a tree without cliques)."""
    return max((tree.domain.size(c) for c in tree.cliques), default=0) * _ITEMSIZE


def _named_cliques(tree: JunctionTree, cliques: list) -> str:
    """The first :data:`_SHOWN` of ``cliques`` with their cells, and how many more there are."""
    shown = ", ".join(f"{c} ({tree.domain.size(c):,} cells)" for c in cliques[:_SHOWN])
    more = len(cliques) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _heuristic_trees(network: MarkovNetwork | None) -> dict[str, JunctionTree]:
    """The junction tree of each heuristic for ``network`` (none without a network)."""
    if network is None:
        return {}
    return {m: build_junction_tree(network, m) for m in _HEURISTICS}


def _needs(tree: JunctionTree, trees: dict[str, JunctionTree]) -> str:
    """What each heuristic's tree needs: cells in all, its largest clique, bytes to run."""
    parts = []
    for m, t in trees.items():
        mark = " (this tree)" if t is tree else ""
        big = _largest_bytes(t)
        parts.append(f"method={m!r}{mark} {t.num_cells:,} cells in all, largest clique "
                     f"{big // _ITEMSIZE:,} cells ({_gib(big)}), about {_gib(oracle_bytes(t))} "
                     "to run")
    return "; the triangulations need: " + "; ".join(parts) if parts else ""


def _other_method(
    tree: JunctionTree, trees: dict[str, JunctionTree], fits: Callable[[JunctionTree], bool]
) -> list[str]:
    """The advice to switch heuristic: the other one if it fits, none if neither does."""
    if not trees:
        return ["the other triangulation method ('min_fill' or 'min_size')"]
    return [f"method={m!r} (it fits)" for m, t in trees.items() if t is not tree and fits(t)]


_APPROXIMATE = ("the approximate oracle ConvexGBPOracle (APPGM: prox_pgm(..., "
                "oracle='convex_gbp'))")


def check_memory(
    tree: JunctionTree, max_bytes: int | None = None, *, network: MarkovNetwork | None = None
) -> None:
    """Refuse a junction tree whose largest clique table would exceed ``max_bytes``, or whose
    tables together (:func:`oracle_bytes`) would exceed the machine's physical memory.

    Parameters
    ----------
    tree : JunctionTree
    max_bytes : int, optional
        Bytes one float64 clique table may take; default :func:`max_clique_bytes`.
    network : MarkovNetwork, optional
        The network ``tree`` was built for; with it, an error also says what each
        triangulation heuristic (``method="min_fill"``, ``"min_size"``) would need, and
        suggests the other one where it fits.

    Raises
    ------
    CliqueTooLargeError
        Naming the largest cliques above the cap with their cells, the cap, what each
        heuristic needs, and the alternatives: the other heuristic, the approximate oracle, and
        how to raise the cap (the environment variable or :func:`clique_memory_cap`).
    JunctionTreeTooLargeError
        Naming the tree's cells, the estimated bytes, the machine's memory, what each heuristic
        needs and the remedies.
    """
    cap = max_clique_bytes() if max_bytes is None else _positive_bytes(max_bytes, "max_bytes")
    if not tree.cliques:
        return
    size = tree.domain.size
    ranked = sorted(tree.cliques, key=lambda c: -size(c))
    big, cells = ranked[0], size(ranked[0])
    if cells * _ITEMSIZE > cap:
        trees = _heuristic_trees(network)
        over = [c for c in ranked if size(c) * _ITEMSIZE > cap]
        need = cells * _ITEMSIZE
        advice = [*_other_method(tree, trees, lambda t: _largest_bytes(t) <= cap), _APPROXIMATE,
                  f"raise the cap to at least {need:,} bytes: set ${MAX_CLIQUE_BYTES_ENV}={need} "
                  "or run inside 'with numpyro_dpgm.oracles.memory.clique_memory_cap("
                  f"{need}):'"]
        raise CliqueTooLargeError(
            f"the junction tree has clique {big} with {cells:,} cells ({need:,} "
            f"bytes = {_gib(need)} as float64), above the exact oracle's cap of "
            f"{cap:,} bytes ({_gib(cap)}); cliques above the cap: "
            f"{_named_cliques(tree, over)}{_needs(tree, trees)}; alternatives: "
            + "; ".join(advice)
        )
    need, physical = oracle_bytes(tree), physical_memory()
    if physical is not None and need > physical:
        trees = _heuristic_trees(network)
        advice = [*_other_method(tree, trees, lambda t: _largest_bytes(t) <= cap
                                 and oracle_bytes(t) <= physical), _APPROXIMATE,
                  "measure smaller cliques (coarsen an attribute)"]
        raise JunctionTreeTooLargeError(
            f"the junction tree's {len(tree.cliques)} cliques hold {tree.num_cells:,} cells "
            f"(largest {_named_cliques(tree, ranked)}); exact inference needs about "
            f"{_gib(need)} ({WORKING_COPIES} float64 copies of every table), more than this "
            f"machine's {_gib(physical)}{_needs(tree, trees)}; alternatives: "
            + "; ".join(advice)
        )
