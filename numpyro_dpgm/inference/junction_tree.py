"""Exact marginal oracle: junction tree construction and sum-product calibration.

Given the log-potentials ``θ`` of a :class:`~numpyro_dpgm.network.MarkovNetwork`, the oracle
returns ``log Z = A(θ)`` and the clique marginals ``μ(θ) = ∇A(θ)`` (seed 003, §2 "marginal
oracle"; seed 002, §2). Construction follows the textbook recipe:

1. the primal graph of the cliques is triangulated by an elimination order (networkx's min-fill
   heuristic, or the greedy "smallest new clique" order of Private-PGM as ``method="min_size"``);
2. the maximal cliques of the triangulated graph are joined by a maximum-weight spanning tree
   (weight ``|C_i ∩ C_j|``), which has the running-intersection property;
3. messages are passed leaves -> root -> leaves.

Calibration is organised so that every clique table is exponentiated once. The upward pass is
a log-space sum-product: clique ``i`` sends ``m_i(s) = log Σ_{C_i∖S_i} exp(ψ_i + Σ_k m_k)``,
computed with a max shift per separator cell, so θ of ±30 per cell neither overflows nor
underflows; the same exponentials, divided by their row sums, are the conditionals
``p(x_{C_i∖S_i} | x_{S_i})``. The downward pass then runs in probability space: the root's
marginal is its normalised table, and every other clique's marginal is its conditional times
the separator marginal summed out of its parent's marginal (sums and products only). The
answer is exact up to rounding; the only departure from log-space arithmetic is that a
separator cell whose probability is below the float64 range (about 1e-308) is returned as 0
(its log-belief as ``-inf``).

Cliques made large by triangulation, whose own factors (network potentials placed in them,
children's messages, separator) are small, are *factored* in :func:`marginals` and
:func:`log_partition`: their table is never built. Their log-factors are merged into a few
tables, each exponentiated shifted by its maximum (so every factor is at most one), and the
message or marginal is their contraction (``jnp.einsum`` with an opt_einsum order), e.g. a
sum over a 3-way clique of two-way factors is a matrix product rather than an exponential per
cell. Scaled this way no term can overflow, and a contraction is exact to rounding wherever
its result is at least ``1e-200`` (whatever underflowed is then below ``1e-90`` of it).
Every such result is checked; if one is smaller (potentials spanning hundreds of nats, or
``-inf`` structural zeros) the call is answered by the log-space calibration instead: eagerly
when the arguments are concrete, through ``lax.cond`` when traced.

Memory cap: the oracle refuses (:class:`CliqueTooLargeError`, before anything is allocated or
compiled) a junction tree any of whose cliques would hold more than a cap of bytes as a float64
table; the error names the clique, its cells and bytes, and points to the approximate oracle
(``prox_pgm(..., oracle="convex_gbp")``, region graphs of the network's own cliques). The cap
is :data:`DEFAULT_MAX_CLIQUE_BYTES` (1 GiB, 134,217,728 cells), overridden by the environment
variable ``NUMPYRO_DPGM_MAX_CLIQUE_BYTES`` (bytes, read at each check) or, within a block, by
:func:`clique_memory_cap`; :func:`check_memory` applies it to a tree (with an explicit cap as an
argument). Building a tree (:func:`build_junction_tree`, e.g. to measure its size) is never
refused.

Out-of-model marginals (attribute sets no clique holds) come from the calibrated tree without
re-triangulating: over the smallest subtree of cliques that covers the query
(:meth:`JunctionTree.covering_subtree`), with top clique ``r``, the joint of its attributes is
``μ_{S_r} · Φ / Σ_{U∖S_r} Φ``, ``Φ`` being the product of the potentials placed in the subtree
and the upward messages entering it from outside. :func:`marginal` takes the messages from the
same compiled program as :func:`marginals` (which returns them beside the marginals) and
contracts on the host in NumPy (batched matrix products in an opt_einsum order), so a new
attribute set compiles nothing; under ``jit``/``vmap``/``grad`` it is traced instead, from the
clique marginals (:func:`query_marginal`).

The structure (:class:`JunctionTree`) is computed once per network and cached. Under ``jit``,
``vmap`` or ``grad`` everything that touches θ is traced JAX, so :func:`log_partition`,
:func:`marginals`, :func:`marginal` and :func:`sample` can be jit-ed, vmap-ed and
differentiated over θ; with concrete arguments they run compiled programs (one per network
and method) and :func:`marginal` finishes on the host.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import opt_einsum
from networkx.algorithms.approximation import treewidth_min_fill_in

from .._precision import warn_if_float32
from ..domain import Clique, Domain
from ..network import MarkovNetwork
from ..tables import CliqueTables, project_table

__all__ = [
    "DEFAULT_MAX_CLIQUE_BYTES",
    "MAX_CLIQUE_BYTES_ENV",
    "CliqueTooLargeError",
    "check_memory",
    "clique_memory_cap",
    "max_clique_bytes",
    "JunctionTree",
    "Calibrated",
    "TreeMarginals",
    "build_junction_tree",
    "calibrate",
    "calibrate_marginals",
    "query_marginal",
    "log_partition",
    "marginals",
    "marginal",
    "sample",
]

Array = Any


# ------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JunctionTree:
    """Static structure of a junction tree over a domain.

    Attributes
    ----------
    domain : Domain
    cliques : tuple of cliques
        Maximal cliques of the triangulated graph, attributes in domain order. Clique 0 is the
        root.
    parent : tuple of int
        ``parent[i]`` is the index of clique ``i``'s parent (``-1`` for the root).
    order : tuple of int
        A topological order (root first, every parent before its children).
    separators : tuple of cliques
        ``separators[i] = cliques[i] ∩ cliques[parent[i]]`` in domain order (empty for the root
        and between disconnected parts).
    """

    domain: Domain
    cliques: tuple[Clique, ...]
    parent: tuple[int, ...]
    order: tuple[int, ...]
    separators: tuple[Clique, ...]

    @property
    def num_cells(self) -> int:
        """Total number of cells of all clique tables (the memory the oracle needs)."""
        return sum(self.domain.size(c) for c in self.cliques)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.cliques]
        for i in self.order:
            if self.parent[i] >= 0:
                kids[self.parent[i]].append(i)
        return tuple(tuple(k) for k in kids)

    def containing(self, attrs: Clique) -> int | None:
        """Index of the smallest clique that contains ``attrs`` (``None`` if none does)."""
        s = set(attrs)
        best = [i for i, c in enumerate(self.cliques) if s <= set(c)]
        return min(best, key=lambda i: self.domain.size(self.cliques[i])) if best else None

    def covering_subtree(self, attrs: Clique) -> tuple[int, ...]:
        """A smallest connected set of cliques whose union holds ``attrs``, in topological order.

        Starting from the whole tree, leaves are pruned (largest table first) while the
        attributes of ``attrs`` they hold are also held by their one remaining neighbour. The
        first clique of the result is its top (its parent, if any, is outside the subtree);
        every other clique's parent is inside it.

        Parameters
        ----------
        attrs : tuple of str
            Attributes of the domain.

        Returns
        -------
        tuple of int
            Clique indices; a single one when a clique holds all of ``attrs``.
        """
        query = set(attrs)
        nbrs: list[set[int]] = [set() for _ in self.cliques]
        for i, p in enumerate(self.parent):
            if p >= 0:
                nbrs[i].add(p)
                nbrs[p].add(i)
        alive = set(range(len(self.cliques)))
        by_size = sorted(alive, key=lambda i: (-self.domain.size(self.cliques[i]), i))
        changed = True
        while changed and len(alive) > 1:
            changed = False
            for i in by_size:
                if i not in alive or len(alive) == 1:
                    continue
                live = nbrs[i] & alive
                if len(live) == 1 and query & set(self.cliques[i]) <= set(
                    self.cliques[next(iter(live))]
                ):
                    alive.discard(i)
                    changed = True
        return tuple(i for i in self.order if i in alive)

    def has_running_intersection(self) -> bool:
        """Check that for every attribute the cliques holding it form a connected subtree."""
        g = nx.Graph()
        g.add_nodes_from(range(len(self.cliques)))
        g.add_edges_from((i, p) for i, p in enumerate(self.parent) if p >= 0)
        for a in self.domain.attrs:
            holders = [i for i, c in enumerate(self.cliques) if a in c]
            if holders and not nx.is_connected(g.subgraph(holders)):
                return False
        return True

    # -- helpers for broadcasting sub-tables into a clique --------------------------------------
    def broadcast_shape(self, i: int, attrs: Clique) -> tuple[int, ...]:
        """Shape that lets a table over ``attrs`` (domain order) broadcast against clique ``i``."""
        s = set(attrs)
        return tuple(self.domain[a] if a in s else 1 for a in self.cliques[i])

    def reduce_axes(self, i: int, attrs: Clique) -> tuple[int, ...]:
        """Axes of clique ``i`` to sum out to keep ``attrs``."""
        s = set(attrs)
        return tuple(k for k, a in enumerate(self.cliques[i]) if a not in s)


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


class CliqueTooLargeError(MemoryError):
    """A junction-tree clique would exceed the exact oracle's memory cap."""


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
    """Refuse a junction tree whose largest clique table would exceed ``max_bytes``.

    Parameters
    ----------
    tree : JunctionTree
    max_bytes : int, optional
        Bytes one float64 clique table may take; default :func:`max_clique_bytes`.

    Raises
    ------
    CliqueTooLargeError
        Naming the largest clique, its cells and bytes, the cap, and the approximate oracle.
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
            f"${MAX_CLIQUE_BYTES_ENV} or junction_tree.clique_memory_cap(bytes)"
        )


def _elimination_cliques_min_size(graph: nx.Graph, domain: Domain) -> list[frozenset[str]]:
    """Greedy elimination choosing the variable whose new clique has the fewest cells.

    At each step the variable ``v`` minimising ``∏_{u ∈ {v} ∪ N(v)} |dom(u)|`` is eliminated
    (ties broken by domain order), its neighbourhood is made complete, and ``{v} ∪ N(v)`` is
    recorded. This is the default order of Private-PGM.
    """
    g = {v: set(graph.neighbors(v)) for v in graph.nodes}
    rank = {a: i for i, a in enumerate(domain.attrs)}
    cliques = []
    while g:
        v = min(g, key=lambda u: (math.prod(domain[w] for w in g[u] | {u}), rank[u]))
        nbrs = g.pop(v)
        cliques.append(frozenset(nbrs | {v}))
        for u in nbrs:
            g[u].discard(v)
            g[u] |= nbrs - {u}
    return cliques


def _elimination_cliques_min_fill(graph: nx.Graph) -> list[frozenset[str]]:
    """Bags of networkx's min-fill-in tree decomposition."""
    _, decomposition = treewidth_min_fill_in(graph)
    return list(decomposition.nodes)


def build_junction_tree(network: MarkovNetwork, method: str = "min_fill") -> JunctionTree:
    """Triangulate ``network`` and join its maximal cliques into a junction tree (cached).

    Parameters
    ----------
    network : MarkovNetwork
    method : {"min_fill", "min_size"}
        Elimination heuristic: networkx's min-fill-in, or the greedy smallest-new-clique order.

    Returns
    -------
    JunctionTree
        The same object for equal networks and the same ``method``.
    """
    return _build_junction_tree(network, method)


@functools.lru_cache(maxsize=256)
def _build_junction_tree(network: MarkovNetwork, method: str) -> JunctionTree:
    domain = network.domain
    graph = network.graph
    if method == "min_fill":
        bags = _elimination_cliques_min_fill(graph)
    elif method == "min_size":
        bags = _elimination_cliques_min_size(graph, domain)
    else:
        raise ValueError(f"unknown triangulation method {method!r}; use 'min_fill' or 'min_size'")
    # keep the maximal bags, attributes in domain order, deterministic clique order
    bags = list(dict.fromkeys(bags))
    maximal = [b for b in bags if not any(b < o for o in bags)]
    cliques = sorted((domain.sorted(b) for b in maximal),
                     key=lambda c: (-domain.size(c), [domain.index(a) for a in c]))
    # maximum-weight spanning tree of the clique graph; zero weights join disconnected parts
    cg = nx.Graph()
    cg.add_nodes_from(range(len(cliques)))
    for i in range(len(cliques)):
        for j in range(i + 1, len(cliques)):
            cg.add_edge(i, j, weight=len(set(cliques[i]) & set(cliques[j])))
    tree = nx.maximum_spanning_tree(cg, algorithm="kruskal")
    order = [0] + [v for _, v in nx.bfs_edges(tree, 0)]
    parent = [-1] * len(cliques)
    for u, v in nx.bfs_edges(tree, 0):
        parent[v] = u
    separators = tuple(
        () if p < 0 else domain.sorted(set(cliques[i]) & set(cliques[p]))
        for i, p in enumerate(parent)
    )
    return JunctionTree(domain, tuple(cliques), tuple(parent), tuple(order), separators)


# ------------------------------------------------------------------------------------------------
# Calibration (pure JAX)
# ------------------------------------------------------------------------------------------------
class Calibrated(NamedTuple):
    """Result of sum-product calibration in log space.

    Attributes
    ----------
    log_z : scalar
        ``A(θ) = log Σ_x exp(θ·φ(x))``.
    log_beliefs : tuple of arrays
        Unnormalised log-beliefs of the junction-tree cliques; ``exp(b_i − log_z)`` is the
        marginal of clique ``i``.
    """

    log_z: Array
    log_beliefs: tuple[Array, ...]


class TreeMarginals(NamedTuple):
    """Result of sum-product calibration in probability space.

    Attributes
    ----------
    log_z : scalar
        ``A(θ) = log Σ_x exp(θ·φ(x))``.
    marginals : tuple of arrays
        Normalised marginal of every junction-tree clique (axes in the clique's attribute
        order, which is domain order); each sums to one.
    """

    log_z: Array
    marginals: tuple[Array, ...]


def _embed(tree: JunctionTree, i: int, table: Array, attrs: Clique) -> Array:
    """Table over ``attrs`` (any order) broadcast into clique ``i``'s axes."""
    return _embed_into(tree.domain, tree.cliques[i], table, attrs)


def _embed_into(
    domain: Domain, scope: Clique, table: Array, attrs: Clique, xp: Any = jnp
) -> Array:
    """Table over ``attrs`` (any order) broadcast against a table over ``scope`` (domain order).

    ``xp`` is ``jax.numpy`` or ``numpy`` (for the host-side query path).
    """
    ordered = domain.sorted(attrs)
    perm = tuple(attrs.index(a) for a in ordered)
    if perm != tuple(range(len(perm))):
        table = xp.transpose(table, perm)
    kept = set(attrs)
    return xp.reshape(table, tuple(domain[a] if a in kept else 1 for a in scope))


def clique_log_potentials(tree: JunctionTree, network: MarkovNetwork, theta: Array) -> list[Array]:
    """Sum each network clique's log-potential into a junction-tree clique containing it.

    Parameters
    ----------
    tree : JunctionTree
        A junction tree of ``network`` (every network clique is inside one of its cliques).
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``
        Log-potentials in the network's layout.

    Returns
    -------
    list of arrays
        One log-potential table per junction-tree clique.
    """
    check_memory(tree)
    tables = network.unflatten(theta)
    dtype = jnp.result_type(theta)
    psi = [jnp.zeros(tree.domain.shape_of(c), dtype=dtype) for c in tree.cliques]
    for c in network.cliques:
        i = tree.containing(c)
        if i is None:  # pragma: no cover - the triangulation always covers every clique
            raise RuntimeError(f"junction tree misses clique {c}")
        psi[i] = psi[i] + _embed(tree, i, tables[c], c)
    return psi


def _safe_log(x: Array) -> Array:
    """``log x`` with ``log 0 = -inf`` and finite gradients everywhere."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), -jnp.inf)


class _Upward(NamedTuple):
    log_z: Array
    partial: list[Array]  # ψ_i plus the messages of i's children
    exps: list[Array]  # exp(partial_i − shift), shift = max over C_i∖S_i (all axes at a root)
    sums: list[Array]  # Σ_{C_i∖S_i} exps_i, size-1 axes where summed
    logsums: list[Array]  # log Σ_{C_i∖S_i} exp(partial_i): the message to the parent


def _upward(tree: JunctionTree, log_psi: list[Array]) -> _Upward:
    """Leaves-to-root pass in log space (see the module notes)."""
    n = len(tree.cliques)
    partial = list(log_psi)
    exps: list[Array] = [None] * n  # type: ignore[list-item]
    sums: list[Array] = [None] * n  # type: ignore[list-item]
    logsums: list[Array] = [None] * n  # type: ignore[list-item]
    lowest = jnp.finfo(jnp.result_type(*log_psi) if log_psi else float).min
    log_z: Any = 0.0
    for i in reversed(tree.order):
        p = tree.parent[i]
        x = partial[i]
        axes = tuple(range(x.ndim)) if p < 0 else tree.reduce_axes(i, tree.separators[i])
        # the max shift keeps every row's sum in [1, row length]; clamping a row that is -inf
        # throughout to the lowest float gives it zero exponentials and a -inf message
        shift = jax.lax.stop_gradient(jnp.maximum(jnp.max(x, axis=axes, keepdims=True), lowest))
        exps[i] = jnp.exp(x - shift)
        sums[i] = jnp.sum(exps[i], axis=axes, keepdims=True)
        logsums[i] = shift + jnp.log(sums[i])
        if p < 0:
            log_z = log_z + jnp.reshape(logsums[i], ())
        else:
            partial[p] = partial[p] + jnp.reshape(logsums[i],
                                                  tree.broadcast_shape(p, tree.separators[i]))
    return _Upward(log_z, partial, exps, sums, logsums)


class _Known:
    """Marginals known after calibration, by attribute set.

    Any other marginal is summed out of the smallest known superset (all are projections of
    one joint, so any superset will do). A *source* is a clique whose table is never built:
    it computes the marginal of any subset of its attributes on demand (by contraction).
    """

    def __init__(self, domain: Domain):
        self.domain = domain
        self.tables: dict[frozenset[str], tuple[Clique, Array]] = {}
        self.sources: dict[frozenset[str], Callable[[Clique], Array]] = {}

    def add(self, attrs: Clique, table: Array) -> None:
        self.tables.setdefault(frozenset(attrs), (attrs, table))

    def add_source(self, attrs: Clique, fn: Callable[[Clique], Array]) -> None:
        self.sources.setdefault(frozenset(attrs), fn)

    def get(self, attrs: Iterable[str]) -> tuple[Clique, Array]:
        """``(attrs in domain order, marginal table)``, computed and remembered if new."""
        key = frozenset(attrs)
        if key not in self.tables:
            size = self.domain.size
            target = self.domain.sorted(key)
            table = min((k for k in self.tables if key <= k), key=size, default=None)
            source = min((k for k in self.sources if key <= k), key=size, default=None)
            if table is not None and (source is None or size(table) <= size(source)):
                src_attrs, src = self.tables[table]
                self.tables[key] = (target, project_table(src, src_attrs, target))
            elif source is not None:
                self.tables[key] = (target, self.sources[source](target))
            else:  # pragma: no cover - callers only ask for subsets of cliques
                raise KeyError(f"no known marginal holds {target}")
        return self.tables[key]


def _downward(
    tree: JunctionTree,
    upward: _Upward,
    requests: list[list[Clique]] | None = None,
    total: Any = 1.0,
) -> tuple[list[Array], _Known]:
    """Root-to-leaves pass in probability space.

    Clique ``i``'s marginal is ``exps_i · μ_{S_i} / sums_i``; the separator marginal ``μ_{S_i}``
    comes from the parent's side. After clique ``i``'s marginal, the marginals its children
    need and those in ``requests[i]`` are summed out of it, largest first, each from the
    smallest table known by then. Every marginal is scaled to sum to ``total``.

    Returns
    -------
    probs : list of arrays
        Marginal of every junction-tree clique.
    known : _Known
        Every marginal computed on the way (cliques, separators, requests).
    """
    known = _Known(tree.domain)
    n = len(tree.cliques)
    probs: list[Array] = [None] * n  # type: ignore[list-item]
    children = tree.children
    for i in tree.order:  # parents are final before their children
        p = tree.parent[i]
        s = upward.sums[i]
        s = jnp.where(s > 0, s, 1.0)  # a zero sum has zero exponentials: its cells stay 0
        if p < 0:
            scale = total / s
        else:
            sep = tree.separators[i]
            scale = jnp.reshape(known.get(sep)[1], tree.broadcast_shape(i, sep)) / s
        probs[i] = upward.exps[i] * scale
        known.add(tree.cliques[i], probs[i])
        wanted = [tree.separators[k] for k in children[i]]
        if requests is not None:
            wanted += requests[i]
        for attrs in sorted(wanted, key=lambda c: -tree.domain.size(c)):
            known.get(attrs)
    return probs, known


def calibrate_marginals(tree: JunctionTree, log_psi: list[Array]) -> TreeMarginals:
    """Calibrate the junction tree and return ``log Z`` and every clique's marginal.

    Parameters
    ----------
    tree : JunctionTree
    log_psi : list of arrays
        Log-potential of every junction-tree clique (e.g. from :func:`clique_log_potentials`).

    Returns
    -------
    TreeMarginals
        Each clique table is exponentiated once (upward pass, see the module notes); the
        downward pass multiplies by separator marginals.
    """
    upward = _upward(tree, log_psi)
    probs, _ = _downward(tree, upward)
    return TreeMarginals(upward.log_z, tuple(probs))


def calibrate(tree: JunctionTree, log_psi: list[Array]) -> Calibrated:
    """Sum-product calibration of the junction tree, returning log-beliefs.

    Upward messages ``m_{i→p}(s) = log Σ_{C_i∖S_i} exp[ψ_i + Σ_{k∈ch(i)} m_{k→i}]``; the
    downward message into ``i`` is ``log μ_{S_i} + log Z − m_{i→p}``, where the separator
    marginal ``μ_{S_i}`` is summed out of the parent's marginal (see
    :func:`calibrate_marginals`). Returns the clique beliefs ``b_i = ψ_i + Σ_{k∈nb(i)} m_{k→i}``.

    Parameters
    ----------
    tree : JunctionTree
    log_psi : list of arrays
        Log-potential of every junction-tree clique (e.g. from :func:`clique_log_potentials`).

    Returns
    -------
    Calibrated
    """
    upward = _upward(tree, log_psi)
    _, known = _downward(tree, upward)
    beliefs = []
    for i, p in enumerate(tree.parent):
        if p < 0:
            beliefs.append(upward.partial[i] + (upward.log_z - upward.logsums[i]))
        else:
            sep = tree.separators[i]
            mu = jnp.reshape(known.get(sep)[1], tree.broadcast_shape(i, sep))
            beliefs.append(upward.partial[i] + (_safe_log(mu) + upward.log_z - upward.logsums[i]))
    return Calibrated(upward.log_z, tuple(beliefs))


# ------------------------------------------------------------------------------------------------
# Queries on a calibrated tree
# ------------------------------------------------------------------------------------------------
class _QueryPlan(NamedTuple):
    nodes: tuple[int, ...]  # covering subtree, its top first
    subscripts: str  # einsum over the nodes' tables -> the query
    path: tuple[tuple[int, ...], ...]  # opt_einsum contraction order


@functools.lru_cache(maxsize=1024)
def _query_plan(tree: JunctionTree, attrs: Clique) -> _QueryPlan:
    nodes = tree.covering_subtree(attrs)
    union = tree.domain.sorted({a for i in nodes for a in tree.cliques[i]})
    symbol = {a: opt_einsum.get_symbol(k) for k, a in enumerate(union)}
    inputs = ",".join("".join(symbol[a] for a in tree.cliques[i]) for i in nodes)
    subscripts = inputs + "->" + "".join(symbol[a] for a in attrs)
    shapes = [tree.domain.shape_of(tree.cliques[i]) for i in nodes]
    path, _ = opt_einsum.contract_path(subscripts, *shapes, shapes=True, optimize="auto")
    return _QueryPlan(nodes, subscripts, tuple(tuple(step) for step in path))


def _is_traced(values: Any) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def query_marginal(tree: JunctionTree, calibrated: TreeMarginals, attrs: Clique) -> Array:
    """Marginal over any attribute set from a calibrated junction tree.

    Parameters
    ----------
    tree : JunctionTree
    calibrated : TreeMarginals
        Output of :func:`calibrate_marginals` on ``tree``.
    attrs : tuple of str
        The query, axes in the order given.

    Returns
    -------
    array, shape ``domain.shape_of(attrs)``
        Sums to one.

    Notes
    -----
    A query inside a clique is summed out of that clique's marginal. Otherwise the joint of
    the attributes of the query's covering subtree (:meth:`JunctionTree.covering_subtree`) is
    ``μ_top · ∏_i p(x_{C_i∖S_i} | x_{S_i})``, and the query is its contraction, in the order
    opt_einsum finds (cached per tree and query). With concrete arrays the contraction runs
    eagerly in NumPy, so a new query compiles nothing; under ``jit``/``vmap``/``grad`` it is
    traced with ``jnp.einsum``.
    """
    attrs = tree.domain.check_clique(attrs)
    traced = _is_traced(calibrated.marginals)
    xp: Any = jnp if traced else np

    def probs(j: int) -> Any:  # only the tables a query reads are brought to the host
        return calibrated.marginals[j] if traced else np.asarray(calibrated.marginals[j])

    i = tree.containing(attrs)
    if i is not None:
        out = project_table(probs(i), tree.cliques[i], attrs)
    else:
        plan = _query_plan(tree, attrs)
        operands = [probs(plan.nodes[0])]
        for j in plan.nodes[1:]:
            b = probs(j)
            mu = xp.sum(b, axis=tree.reduce_axes(j, tree.separators[j]), keepdims=True)
            operands.append(b / xp.where(mu > 0, mu, 1.0))
        if traced:
            out = jnp.einsum(plan.subscripts, *operands, optimize=list(plan.path),
                             precision=jax.lax.Precision.HIGHEST)
        else:
            out = _numpy_contract(plan.subscripts, operands, plan.path)
    return out if traced else jnp.asarray(out)


def _numpy_contract(
    subscripts: str, operands: list[np.ndarray], path: tuple[tuple[int, ...], ...]
) -> np.ndarray:
    """``einsum(subscripts, *operands)`` in NumPy along an opt_einsum ``path``.

    Every pairwise step is one batched matrix product (``np.matmul``, i.e. BLAS): indices in
    both operands and still needed are the batch, those in both and no longer needed are
    contracted, and indices only one operand has and nothing needs are summed out first.
    """
    inputs, output = subscripts.split("->")
    terms = [(s, np.asarray(t)) for s, t in zip(inputs.split(","), operands, strict=True)]
    for step in path:
        picked = [terms[k] for k in step]
        terms = [t for k, t in enumerate(terms) if k not in step]
        needed = set(output).union(*(s for s, _ in terms))
        while len(picked) > 1:
            (sx, x), (sy, y) = picked[0], picked[1]
            keep = needed.union(*(s for s, _ in picked[2:]))
            picked = [_matmul_pair(sx, x, sy, y, keep)] + picked[2:]
        s, t = picked[0]
        gone = [k for k, c in enumerate(s) if c not in needed]
        if gone:
            t, s = t.sum(axis=tuple(gone)), "".join(c for c in s if c in needed)
        terms.append((s, t))
    (s, t), = terms
    return np.transpose(t, [s.index(c) for c in output]) if s != output else t


def _matmul_pair(
    sx: str, x: np.ndarray, sy: str, y: np.ndarray, keep: set[str]
) -> tuple[str, np.ndarray]:
    """Contract two labelled tables as one batched matrix product; keep the labels in ``keep``."""
    sum_x = [k for k, c in enumerate(sx) if c not in sy and c not in keep]
    if sum_x:
        x, sx = x.sum(axis=tuple(sum_x)), "".join(c for c in sx if c in sy or c in keep)
    sum_y = [k for k, c in enumerate(sy) if c not in sx and c not in keep]
    if sum_y:
        y, sy = y.sum(axis=tuple(sum_y)), "".join(c for c in sy if c in sx or c in keep)
    batch = [c for c in sx if c in sy and c in keep]
    inner = [c for c in sx if c in sy and c not in keep]
    left = [c for c in sx if c not in sy]
    right = [c for c in sy if c not in sx]
    size = dict(zip(sx, x.shape, strict=True)) | dict(zip(sy, y.shape, strict=True))
    nb, ni = math.prod(size[c] for c in batch), math.prod(size[c] for c in inner)
    nl, nr = math.prod(size[c] for c in left), math.prod(size[c] for c in right)
    xm = np.transpose(x, [sx.index(c) for c in batch + left + inner]).reshape(nb, nl, ni)
    ym = np.transpose(y, [sy.index(c) for c in batch + inner + right]).reshape(nb, ni, nr)
    out = np.matmul(xm, ym).reshape([size[c] for c in batch + left + right])
    return "".join(batch + left + right), out


# ------------------------------------------------------------------------------------------------
# Public oracle functions
# ------------------------------------------------------------------------------------------------
def _as_vector(network: MarkovNetwork, theta: Array | CliqueTables) -> Array:
    if isinstance(theta, CliqueTables):
        theta = network.flatten(theta)
    theta = jnp.asarray(theta)
    if theta.shape != (network.num_params,):
        raise ValueError(
            f"theta has shape {theta.shape}; the network expects ({network.num_params},). "
            "Use jax.vmap for a batch of parameter vectors."
        )
    if theta.dtype == jnp.float32:
        warn_if_float32("junction-tree oracle")
    return theta


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _network_marginals(
    network: MarkovNetwork, theta: Array, total: Array, method: str
) -> tuple[tuple[Array, ...], Array]:
    """Marginal of every network clique, times ``total``, and the packed messages.

    Each marginal is summed out of the smallest marginal known at that point of the downward
    pass (a junction-tree clique, a separator or a larger network clique). The messages
    (:func:`_pack_messages`) let :func:`marginal` answer any query without a program of its
    own.
    """
    theta = _as_vector(network, theta)
    tree = build_junction_tree(network, method)
    upward = _upward(tree, clique_log_potentials(tree, network, theta))
    _, known = _downward(tree, upward, _network_requests(tree, network), total)
    up = [None if p < 0 else jnp.reshape(m, tree.domain.shape_of(tree.separators[i]))
          for i, (p, m) in enumerate(zip(tree.parent, upward.logsums, strict=True))]
    return (tuple(project_table(known.get(c)[1], tree.domain.sorted(c), c)
                  for c in network.cliques), _pack_messages(tree, up, known, theta.dtype))


def _pack_messages(
    tree: JunctionTree, up: list[Array | None], known: _Known, dtype: Any
) -> Array:
    """One vector holding, for every non-root clique ``i`` in index order, its upward
    log-message over ``S_i`` then the separator marginal ``μ_{S_i}`` (both raveled)."""
    parts = []
    for i, p in enumerate(tree.parent):
        if p >= 0:
            parts += [jnp.ravel(up[i]), jnp.ravel(known.get(tree.separators[i])[1])]
    return jnp.concatenate(parts) if parts else jnp.zeros(0, dtype)


def _unpack_messages(
    tree: JunctionTree, packed: np.ndarray
) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """Inverse of :func:`_pack_messages` (NumPy views): upward log-messages, separator marginals."""
    up: list[np.ndarray | None] = [None] * len(tree.cliques)
    sep_marginals: list[np.ndarray | None] = [None] * len(tree.cliques)
    offset = 0
    for i, p in enumerate(tree.parent):
        if p >= 0:
            shape = tree.domain.shape_of(tree.separators[i])
            size = math.prod(shape)
            up[i] = packed[offset : offset + size].reshape(shape)
            sep_marginals[i] = packed[offset + size : offset + 2 * size].reshape(shape)
            offset += 2 * size
    return up, sep_marginals


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _tree_marginals(network: MarkovNetwork, theta: Array, method: str) -> TreeMarginals:
    """The calibrated junction tree of ``network`` (the program behind :func:`marginal`)."""
    theta = _as_vector(network, theta)
    tree = build_junction_tree(network, method)
    return calibrate_marginals(tree, clique_log_potentials(tree, network, theta))


def _network_requests(tree: JunctionTree, network: MarkovNetwork) -> list[list[Clique]]:
    """Network cliques, each listed under the smallest junction-tree clique that holds it."""
    requests: list[list[Clique]] = [[] for _ in tree.cliques]
    for c in network.cliques:
        requests[tree.containing(c)].append(c)
    return requests

# ------------------------------------------------------------------------------------------------
# Factored calibration for marginals(): large cliques made by triangulation are contracted
# ------------------------------------------------------------------------------------------------
#: A junction-tree clique of at least this many cells is *factored* when its factors (the
#: network potentials placed in it, the messages of its children and its separator) hold at
#: most ``1 / _FACTOR_RATIO`` of its cells: its table is never built, and the marginals it
#: serves are contracted from the factors in probability space.
_FACTOR_MIN_CELLS = 2048
_FACTOR_RATIO = 4
#: A factored contraction is trusted only where its result is at least this large (factors are
#: scaled to a maximum of one, so no term that could matter underflowed); otherwise the whole
#: call falls back to the log-space calibration.
_UNDERFLOW_GUARD = 1e-200


class _Plan(NamedTuple):
    home: tuple[tuple[Clique, ...], ...]  # network cliques placed in each junction-tree clique
    factored: tuple[bool, ...]


@functools.lru_cache(maxsize=256)
def _plan(network: MarkovNetwork, method: str) -> _Plan:
    tree = build_junction_tree(network, method)
    size = tree.domain.size
    home: list[list[Clique]] = [[] for _ in tree.cliques]
    for c in network.cliques:
        home[tree.containing(c)].append(c)
    children = tree.children
    factored = []
    for i, clique in enumerate(tree.cliques):
        inputs = (sum(size(c) for c in home[i]) + sum(size(tree.separators[k]) for k in children[i])
                  + size(tree.separators[i]))
        factored.append(size(clique) >= _FACTOR_MIN_CELLS
                        and inputs * _FACTOR_RATIO <= size(clique))
    return _Plan(tuple(tuple(h) for h in home), tuple(factored))


def _subscripts(domain: Domain, scopes: list[Clique], target: Clique) -> str:
    names = domain.sorted({a for attrs in scopes for a in attrs} | set(target))
    symbol = {a: opt_einsum.get_symbol(k) for k, a in enumerate(names)}
    return (",".join("".join(symbol[a] for a in attrs) for attrs in scopes) + "->"
            + "".join(symbol[a] for a in target))


@functools.lru_cache(maxsize=4096)
def _contraction_path(
    subscripts: str, shapes: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, ...], ...]:
    path, _ = opt_einsum.contract_path(subscripts, *shapes, shapes=True, optimize="auto")
    return tuple(tuple(step) for step in path)


def _contract(domain: Domain, factors: list[tuple[Clique, Array]], target: Clique) -> Array:
    """``Σ ∏ factors`` over the attributes not in ``target`` (axes in ``target``'s order).

    Traced with ``jnp.einsum``; NumPy tables are contracted on the host by
    :func:`_numpy_contract`. Either way along an opt_einsum order.
    """
    subscripts = _subscripts(domain, [attrs for attrs, _ in factors], target)
    tables = [t for _, t in factors]
    path = _contraction_path(subscripts, tuple(tuple(np.shape(t)) for t in tables))
    if all(isinstance(t, np.ndarray) for t in tables):
        return _numpy_contract(subscripts, tables, path)
    return jnp.einsum(subscripts, *tables, optimize=list(path),
                      precision=jax.lax.Precision.HIGHEST)


def _merge_factors(
    domain: Domain, factors: list[tuple[Clique, Array]], xp: Any = jnp
) -> list[tuple[Clique, Array]]:
    """Add log-factors into as few tables as possible: each factor, largest first, joins the
    smallest table so far whose attributes hold its own (or starts one), so fewer tables are
    exponentiated and contracted."""
    merged: list[tuple[Clique, Array]] = []
    for attrs, t in sorted(factors, key=lambda f: -domain.size(f[0])):
        fits = [k for k, (scope, _) in enumerate(merged) if set(attrs) <= set(scope)]
        if fits:
            k = min(fits, key=lambda k: domain.size(merged[k][0]))
            scope, table = merged[k]
            merged[k] = (scope, table + _embed_into(domain, scope, t, attrs, xp))
        else:
            scope = domain.sorted(attrs)
            merged.append((scope, _embed_into(domain, scope, t, attrs, xp)))
    return merged


def _contraction_source(
    domain: Domain, factors: list[tuple[Clique, Array]], sep: Clique, weight: Array
) -> Callable[[Clique], Array]:
    """Marginals of a factored clique: its factors times ``weight`` (over ``sep``), contracted."""
    if sep:
        given = factors + [(sep, weight)]
        return lambda target: _contract(domain, given, target)
    return lambda target: _contract(domain, factors, target) * jnp.reshape(weight, ())


class _FactoredUpward(NamedTuple):
    log_z: Array
    log_msg: list[Array]  # upward log-message of every non-root clique, over S_i
    factors: list[list[tuple[Clique, Array]]]  # factored cliques: factors scaled to max 1
    sums: list[Array]  # Σ over C_i∖S_i: over S_i (factored), size-1 axes kept (explicit)
    exps: list[Array | None]  # explicit cliques: exp(partial_i − row max)
    ok: Array  # false when a contraction came too close to underflow


def _factored_upward(network: MarkovNetwork, theta: Array, method: str) -> _FactoredUpward:
    """Leaves-to-root pass with the factored cliques of :func:`_plan` contracted.

    An explicit clique sums its potentials and children's messages into its table and
    proceeds as :func:`_upward`; a factored one merges them into a few small log-factors
    (:func:`_merge_factors`), exponentiates each shifted by its maximum, and contracts them
    down to its separator (the shifts add up to the message's log-scale).
    """
    tree = build_junction_tree(network, method)
    check_memory(tree)
    plan = _plan(network, method)
    domain = tree.domain
    tables = network.unflatten(theta)
    lowest = jnp.finfo(theta.dtype).min
    n = len(tree.cliques)
    children = tree.children
    log_msg: list[Array] = [None] * n  # type: ignore[list-item]  # over S_i, domain order
    factors: list[list[tuple[Clique, Array]]] = [[] for _ in range(n)]
    sums: list[Array] = [None] * n  # type: ignore[list-item]
    exps: list[Array | None] = [None] * n
    checks = []
    log_z: Any = 0.0
    for i in reversed(tree.order):
        p = tree.parent[i]
        clique, sep = tree.cliques[i], tree.separators[i]
        if plan.factored[i]:
            shift: Any = 0.0
            inputs = ([(c, tables[c]) for c in plan.home[i]]
                      + [(tree.separators[k], log_msg[k]) for k in children[i]])
            for attrs, t in _merge_factors(domain, inputs):
                m = jax.lax.stop_gradient(jnp.maximum(jnp.max(t), lowest))
                shift = shift + m
                if attrs:
                    factors[i].append((attrs, jnp.exp(t - m)))
            covered = {a for attrs, _ in factors[i] for a in attrs}
            factors[i] += [((a,), jnp.ones(domain[a], theta.dtype))
                           for a in clique if a not in covered]
            sums[i] = _contract(domain, factors[i], sep)
            checks.append(jnp.all(sums[i] >= _UNDERFLOW_GUARD))
            msg = shift + jnp.log(sums[i])
        else:
            x = jnp.zeros(domain.shape_of(clique), theta.dtype)
            for c in plan.home[i]:
                x = x + _embed(tree, i, tables[c], c)
            for k in children[i]:
                x = x + jnp.reshape(log_msg[k], tree.broadcast_shape(i, tree.separators[k]))
            axes = tuple(range(x.ndim)) if p < 0 else tree.reduce_axes(i, sep)
            m = jax.lax.stop_gradient(jnp.maximum(jnp.max(x, axis=axes, keepdims=True), lowest))
            exps[i] = jnp.exp(x - m)
            sums[i] = jnp.sum(exps[i], axis=axes, keepdims=True)
            msg = jnp.reshape(m + jnp.log(sums[i]), domain.shape_of(sep))
        if p < 0:
            log_z = log_z + jnp.reshape(msg, ())
        else:
            log_msg[i] = msg
    ok = jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)
    return _FactoredUpward(log_z, log_msg, factors, sums, exps, ok)


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _factored_network_marginals(
    network: MarkovNetwork, theta: Array, total: Array, method: str
) -> tuple[tuple[Array, ...], Array, Array]:
    """Network marginals (times ``total``) with the factored cliques contracted, the packed
    messages (as :func:`_network_marginals`) and the flag of :func:`_factored_upward` (false:
    do not trust them, see ``_UNDERFLOW_GUARD``).

    The downward pass follows :func:`_downward`; a factored clique never builds its table but
    serves the marginals asked of it by contracting its factors with ``μ_{S_i} / sums_i``.
    """
    theta = _as_vector(network, theta)
    tree = build_junction_tree(network, method)
    plan = _plan(network, method)
    domain = tree.domain
    upward = _factored_upward(network, theta, method)
    known = _Known(domain)
    requests = _network_requests(tree, network)
    children = tree.children
    for i in tree.order:
        p = tree.parent[i]
        clique, sep = tree.cliques[i], tree.separators[i]
        sums = upward.sums[i]
        s = jnp.where(sums > 0, sums, 1.0)
        weight = total / s if p < 0 else known.get(sep)[1] / jnp.reshape(s, domain.shape_of(sep))
        if plan.factored[i]:
            known.add_source(clique, _contraction_source(domain, upward.factors[i], sep, weight))
        else:
            known.add(clique, upward.exps[i] * jnp.reshape(weight, tree.broadcast_shape(i, sep)))
        wanted = [tree.separators[k] for k in children[i]] + requests[i]
        for attrs in sorted(wanted, key=lambda c: -domain.size(c)):
            known.get(attrs)
    tables = tuple(project_table(known.get(c)[1], domain.sorted(c), c) for c in network.cliques)
    return tables, _pack_messages(tree, upward.log_msg, known, theta.dtype), upward.ok


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _checked_network_marginals(
    network: MarkovNetwork, theta: Array, total: Array, method: str
) -> tuple[tuple[Array, ...], Array]:
    """:func:`_factored_network_marginals`, or the log-space program where its flag is false."""
    tables, messages, ok = _factored_network_marginals(network, theta, total, method)
    return jax.lax.cond(ok, lambda: (tables, messages),
                        lambda: _network_marginals(network, theta, total, method))


def _network_program(
    network: MarkovNetwork, theta: Array, total: Any, method: str
) -> tuple[tuple[Array, ...], Array]:
    """Network marginals and packed messages by the fastest exact program (:func:`marginals`)."""
    if not any(_plan(network, method).factored):
        return _network_marginals(network, theta, total, method)
    if _is_traced((theta, total)):
        return _checked_network_marginals(network, theta, total, method)
    tables, messages, ok = _factored_network_marginals(network, theta, total, method)
    if not bool(ok):  # concrete: the log-space program runs only when asked for
        return _network_marginals(network, theta, total, method)
    return tables, messages


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _factored_log_partition(
    network: MarkovNetwork, theta: Array, method: str
) -> tuple[Array, Array]:
    """``(log Z, flag)`` from :func:`_factored_upward`."""
    upward = _factored_upward(network, _as_vector(network, theta), method)
    return upward.log_z, upward.ok


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _log_partition(network: MarkovNetwork, theta: Array, method: str) -> Array:
    """``log Z`` by the log-space upward pass alone."""
    theta = _as_vector(network, theta)
    tree = build_junction_tree(network, method)
    return _upward(tree, clique_log_potentials(tree, network, theta)).log_z


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _checked_log_partition(network: MarkovNetwork, theta: Array, method: str) -> Array:
    """:func:`_factored_log_partition`, or the log-space program where its flag is false."""
    log_z, ok = _factored_log_partition(network, theta, method)
    return jax.lax.cond(ok, lambda: log_z, lambda: _log_partition(network, theta, method))


def _as_total(total: Any) -> Any:
    # Python numbers enter as a weakly typed float, so that 1, 1.0 and N share one trace
    return float(total) if isinstance(total, int | float) else total


def log_partition(network: MarkovNetwork, theta: Array, method: str = "min_fill") -> Array:
    """Log-partition function ``A(θ)`` of ``network`` with log-potentials ``theta``.

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    scalar array
        Only the upward pass runs; ``jax.grad`` of it is the vector of marginals. Works under
        ``jit``, ``vmap`` and ``grad`` (see :func:`marginals` for the factored cliques).

    Raises
    ------
    CliqueTooLargeError
        If a junction-tree clique exceeds the memory cap (module notes).
    """
    check_memory(build_junction_tree(network, method))
    if not any(_plan(network, method).factored):
        return _log_partition(network, theta, method)
    if _is_traced(theta):
        return _checked_log_partition(network, theta, method)
    log_z, ok = _factored_log_partition(network, theta, method)
    return log_z if bool(ok) else _log_partition(network, theta, method)


def marginals(
    network: MarkovNetwork, theta: Array, total: Array = 1.0, method: str = "min_fill"
) -> CliqueTables:
    """Marginal of every clique of ``network``, scaled to sum to ``total``.

    ``μ(θ) = ∇A(θ)`` (seed 002, §2): returned as :class:`CliqueTables` in the network's clique
    order; ``network.flatten`` gives the vector in the parameter layout.

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    total : float or scalar array
        Sum of every returned table (1 gives probabilities, N expected counts).
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    CliqueTables

    Notes
    -----
    One compiled program per network and method, with large triangulation cliques factored
    (module notes). With concrete arguments its underflow check is read on the host, and in
    the rare case it fails the log-space program runs (compiled then); under ``jit``, ``vmap``
    or ``grad`` both are traced and ``lax.cond`` picks one (under ``vmap`` both run).
    """
    check_memory(build_junction_tree(network, method))
    tables, _ = _network_program(network, theta, _as_total(total), method)
    # the tables come from the network's own layout: skip CliqueTables' input checks
    return CliqueTables.tree_unflatten(network.cliques, tables)


def marginal(
    network: MarkovNetwork, theta: Array, attrs: Clique, method: str = "min_fill"
) -> Array:
    """Marginal distribution over any attribute set ``attrs`` (in the order given).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    attrs : tuple of str
        Any non-empty set of distinct attributes of the domain.
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    array, shape ``network.domain.shape_of(attrs)``

    Notes
    -----
    With a concrete ``theta`` the call runs the compiled program of :func:`marginals` (the
    same one, so nothing new is compiled for any attribute set) and answers on the host: a set
    inside a network clique is summed out of that clique's marginal; any other set, including
    an out-of-model one (Problem 4 of seed 003), is contracted exactly over the subtree of
    cliques that covers it from the potentials placed there and the messages entering it
    (module notes). If that contraction comes too close to underflow, the marginal is read
    from the calibrated clique marginals instead (a second program, compiled then). Under
    ``jit``, ``vmap`` or ``grad`` the calibrated clique marginals are traced and
    :func:`query_marginal` answers.
    """
    attrs = network.domain.check_clique(attrs)
    tree = build_junction_tree(network, method)
    check_memory(tree)
    if _is_traced(theta):
        return query_marginal(tree, _tree_marginals(network, theta, method), attrs)
    tables, messages = _network_program(network, theta, 1.0, method)
    holders = [k for k, c in enumerate(network.cliques) if set(attrs) <= set(c)]
    if holders:
        k = min(holders, key=lambda k: network.sizes[k])
        return jnp.asarray(project_table(np.asarray(tables[k]), network.cliques[k], attrs))
    out = _host_query(network, method, theta, np.asarray(messages), attrs)
    if out is None:  # a contraction came too close to underflow: read the calibrated tree
        return query_marginal(tree, _tree_marginals(network, theta, method), attrs)
    return jnp.asarray(out.astype(np.asarray(messages).dtype, copy=False))


def _theta_tables(network: MarkovNetwork, theta: Any) -> dict[Clique, np.ndarray]:
    """The log-potential tables of ``theta`` (a vector or CliqueTables) as NumPy arrays."""
    if isinstance(theta, CliqueTables):
        return {c: np.asarray(theta[c]) for c in network.cliques}
    vector = np.asarray(theta)
    return {c: vector[o : o + n].reshape(shape) for c, o, n, shape in
            zip(network.cliques, network.offsets, network.sizes, network.shapes, strict=True)}


def _host_query(
    network: MarkovNetwork, method: str, theta: Any, messages: np.ndarray, attrs: Clique
) -> np.ndarray | None:
    """Marginal of ``attrs`` on the host from θ and the packed messages of the network program.

    Over the query's covering subtree ``T`` (top clique ``r``), the joint of its attributes is
    ``μ_{S_r}(x_{S_r}) · Φ(x) / Σ_{U_T∖S_r} Φ``, where ``Φ`` is the product of the potentials
    placed in ``T`` and the upward messages into ``T`` from outside it. ``Φ``'s log-factors are
    merged, exponentiated shifted by their maxima (constants cancel in the ratio) and
    contracted in NumPy. Returns ``None`` when the normaliser comes below the underflow guard.
    """
    tree = build_junction_tree(network, method)
    plan = _plan(network, method)
    domain = tree.domain
    up, sep_marginals = _unpack_messages(tree, messages)
    nodes = tree.covering_subtree(attrs)
    inside = set(nodes)
    children = tree.children
    potentials = _theta_tables(network, theta)
    logs: list[tuple[Clique, Any]] = []
    for i in nodes:
        logs += [(c, potentials[c]) for c in plan.home[i]]
        logs += [(tree.separators[k], up[k]) for k in children[i] if k not in inside]
    factors = [(scope, np.exp(t - np.max(t))) for scope, t in _merge_factors(domain, logs, np)
               if scope]
    covered = {a for scope, _ in factors for a in scope}
    union = domain.sorted({a for i in nodes for a in tree.cliques[i]})
    factors += [((a,), np.ones(domain[a])) for a in union if a not in covered]
    top = nodes[0]
    sep = tree.separators[top] if tree.parent[top] >= 0 else ()
    rows = _contract(domain, factors, sep)
    if not np.all(rows >= _UNDERFLOW_GUARD):
        return None
    if sep:
        return _contract(domain, factors + [(sep, sep_marginals[top] / rows)], attrs)
    return _contract(domain, factors, attrs) / rows


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def sample(
    network: MarkovNetwork, theta: Array, key: Array, num_samples: int, method: str = "min_fill"
) -> Array:
    """Exact forward sampling of records from ``p_θ`` on the calibrated junction tree.

    The root clique is drawn from its marginal; every other clique ``C_i`` draws its new
    attributes ``C_i ∖ S_i`` from ``p(x_{C_i∖S_i} | x_{S_i})``, which the upward pass alone
    provides (in log space).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    key : PRNG key
    num_samples : int
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    int array, shape ``(num_samples, num_attrs)``
        Codes in domain order.
    """
    theta = _as_vector(network, theta)
    tree = build_junction_tree(network, method)
    upward = _upward(tree, clique_log_potentials(tree, network, theta))
    domain = tree.domain
    out: list[Array | None] = [None] * len(domain)
    keys = jax.random.split(key, len(tree.cliques))
    for i in tree.order:
        clique, sep = tree.cliques[i], tree.separators[i]
        new = tuple(a for a in clique if a not in sep)
        perm = tuple(clique.index(a) for a in sep + new)
        # log p(x_new | x_sep): the upward pass leaves it as partial_i − (its log row sums)
        log_cond = upward.partial[i] - upward.logsums[i]
        logits = jnp.reshape(jnp.transpose(log_cond, perm), (domain.size(sep), domain.size(new)))
        if sep:
            row = jnp.ravel_multi_index(
                tuple(out[domain.index(a)] for a in sep), domain.shape_of(sep), mode="clip")
        else:
            row = jnp.zeros(num_samples, dtype=jnp.int32)
        cell = _inverse_cdf(keys[i], logits, row)
        if new:
            for a, v in zip(new, jnp.unravel_index(cell, domain.shape_of(new)), strict=True):
                out[domain.index(a)] = v
    return jnp.stack(out, axis=-1)


def _inverse_cdf(key: Array, logits: Array, row: Array) -> Array:
    """One draw per record from the categorical ``softmax(logits[row])`` by inverse CDF.

    The rows' CDFs are laid end to end, row ``r`` on ``(r, r + 1]``, so one ``searchsorted`` of
    ``r + u`` (``u ~ U[0, 1)``) finds every record's cell: memory is linear in the number of
    records plus the table, never records × cells (gathering each record's row of logits needs
    ``num_records · |cells|`` numbers: gigabytes for a table of 10⁴ cells and 10⁵ records).
    A cell of zero probability is never drawn (its CDF equals its predecessor's). In float32
    the offsets ``r + u`` would lose the CDF's precision, so there each record's row is gathered
    and drawn with ``jax.random.categorical`` instead.
    """
    rows, cells = logits.shape
    if logits.dtype != jnp.float64:
        return jax.random.categorical(key, logits[row], axis=-1)
    prob = jnp.exp(logits - jnp.max(logits, axis=1, keepdims=True))
    cdf = jnp.cumsum(prob, axis=1)
    cdf = cdf / cdf[:, -1:]
    flat = jnp.ravel(jnp.arange(rows, dtype=cdf.dtype)[:, None] + cdf)
    u = jax.random.uniform(key, row.shape, dtype=cdf.dtype)
    pos = jnp.searchsorted(flat, row.astype(cdf.dtype) + u, side="right")
    return jnp.clip(pos - row * cells, 0, cells - 1)
