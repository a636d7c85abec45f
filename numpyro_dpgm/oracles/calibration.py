"""Sum-product calibration of a junction tree (pure JAX): log Z, clique marginals, messages.

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

Besides the calibration functions on a tree, this module holds the compiled log-space programs
over a network (one per network and method) behind
:func:`~numpyro_dpgm.oracles.junction_tree.marginals` and
:func:`~numpyro_dpgm.oracles.junction_tree.marginal`, and the packing of their messages.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import jit_modes
from .._precision import warn_if_float32
from ..domain import Clique, Domain
from ..network import MarkovNetwork
from ..tables import CliqueTables, project_table
from .memory import check_memory
from .triangulation import JunctionTree, build_junction_tree

__all__ = [
    "Calibrated",
    "TreeMarginals",
    "calibrate",
    "calibrate_marginals",
    "clique_log_potentials",
]

Array = Any

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


def embed(tree: JunctionTree, i: int, table: Array, attrs: Clique) -> Array:
    """Table over ``attrs`` (any order) broadcast into clique ``i``'s axes."""
    return embed_into(tree.domain, tree.cliques[i], table, attrs)


def embed_into(
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
    check_memory(tree, network=network)
    tables = network.unflatten(theta)
    dtype = jnp.result_type(theta)
    psi = [jnp.zeros(tree.domain.shape_of(c), dtype=dtype) for c in tree.cliques]
    for c in network.cliques:
        i = tree.containing(c)
        if i is None:  # pragma: no cover - the triangulation always covers every clique
            raise RuntimeError(f"junction tree misses clique {c}")
        psi[i] = psi[i] + embed(tree, i, tables[c], c)
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


def upward_pass(tree: JunctionTree, log_psi: list[Array]) -> _Upward:
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


class Known:
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
) -> tuple[list[Array], Known]:
    """Root-to-leaves pass in probability space.

    Clique ``i``'s marginal is ``exps_i · μ_{S_i} / sums_i``; the separator marginal ``μ_{S_i}``
    comes from the parent's side. After clique ``i``'s marginal, the marginals its children
    need and those in ``requests[i]`` are summed out of it, largest first, each from the
    smallest table known by then. Every marginal is scaled to sum to ``total``.

    Returns
    -------
    probs : list of arrays
        Marginal of every junction-tree clique.
    known : Known
        Every marginal computed on the way (cliques, separators, requests).
    """
    known = Known(tree.domain)
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
    upward = upward_pass(tree, log_psi)
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
    upward = upward_pass(tree, log_psi)
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
# Public oracle functions
# ------------------------------------------------------------------------------------------------
def as_vector(network: MarkovNetwork, theta: Array | CliqueTables) -> Array:
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


@functools.partial(jit_modes, static_argnames=("network", "method"))
def network_marginals(
    network: MarkovNetwork, theta: Array, total: Array, method: str
) -> tuple[tuple[Array, ...], Array]:
    """Marginal of every network clique, times ``total``, and the packed messages.

    Each marginal is summed out of the smallest marginal known at that point of the downward
    pass (a junction-tree clique, a separator or a larger network clique). The messages
    (:func:`pack_messages`) let :func:`marginal` answer any query without a program of its
    own.
    """
    theta = as_vector(network, theta)
    tree = build_junction_tree(network, method)
    upward = upward_pass(tree, clique_log_potentials(tree, network, theta))
    _, known = _downward(tree, upward, network_requests(tree, network), total)
    up = [None if p < 0 else jnp.reshape(m, tree.domain.shape_of(tree.separators[i]))
          for i, (p, m) in enumerate(zip(tree.parent, upward.logsums, strict=True))]
    return (tuple(project_table(known.get(c)[1], tree.domain.sorted(c), c)
                  for c in network.cliques), pack_messages(tree, up, known, theta.dtype))


def pack_messages(
    tree: JunctionTree, up: list[Array | None], known: Known, dtype: Any
) -> Array:
    """One vector holding, for every non-root clique ``i`` in index order, its upward
    log-message over ``S_i`` then the separator marginal ``μ_{S_i}`` (both raveled)."""
    parts = []
    for i, p in enumerate(tree.parent):
        if p >= 0:
            parts += [jnp.ravel(up[i]), jnp.ravel(known.get(tree.separators[i])[1])]
    return jnp.concatenate(parts) if parts else jnp.zeros(0, dtype)


def unpack_messages(
    tree: JunctionTree, packed: np.ndarray
) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """Inverse of :func:`pack_messages` (NumPy views): upward log-messages, separator marginals."""
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


@functools.partial(jit_modes, static_argnames=("network", "method"))
def tree_marginals(network: MarkovNetwork, theta: Array, method: str) -> TreeMarginals:
    """The calibrated junction tree of ``network`` (the program behind :func:`marginal`)."""
    theta = as_vector(network, theta)
    tree = build_junction_tree(network, method)
    return calibrate_marginals(tree, clique_log_potentials(tree, network, theta))


def network_requests(tree: JunctionTree, network: MarkovNetwork) -> list[list[Clique]]:
    """Network cliques, each listed under the smallest junction-tree clique that holds it."""
    requests: list[list[Clique]] = [[] for _ in tree.cliques]
    for c in network.cliques:
        requests[tree.containing(c)].append(c)
    return requests

