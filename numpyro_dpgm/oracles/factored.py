"""Factored calibration: large cliques made by triangulation are contracted, never built.

Cliques made large by triangulation, whose own factors (network potentials placed in them,
children's messages, separator) are small, are *factored* in
:func:`~numpyro_dpgm.oracles.junction_tree.marginals` and
:func:`~numpyro_dpgm.oracles.junction_tree.log_partition`: their table is never built. Their
log-factors are merged into a few tables, each exponentiated shifted by its maximum (so every
factor is at most one), and the message or marginal is their contraction (``jnp.einsum`` with an
opt_einsum order), e.g. a sum over a 3-way clique of two-way factors is a matrix product rather
than an exponential per cell. Scaled this way no term can overflow, and a contraction is exact
to rounding wherever its result is at least ``1e-200`` (whatever underflowed is then below
``1e-90`` of it). Every such result is checked; if one is smaller (potentials spanning hundreds
of nats, or ``-inf`` structural zeros) the call is answered by the log-space calibration
instead: eagerly when the arguments are concrete, through ``lax.cond`` when traced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import opt_einsum

from ..domain import Clique, Domain
from ..network import MarkovNetwork
from ..tables import project_table
from .calibration import (
    Known,
    as_vector,
    clique_log_potentials,
    embed,
    embed_into,
    network_marginals,
    network_requests,
    pack_messages,
    upward_pass,
)
from .memory import check_memory
from .queries import is_traced, numpy_contract
from .triangulation import build_junction_tree

Array = Any

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
UNDERFLOW_GUARD = 1e-200


class _Plan(NamedTuple):
    home: tuple[tuple[Clique, ...], ...]  # network cliques placed in each junction-tree clique
    factored: tuple[bool, ...]


@functools.lru_cache(maxsize=256)
def factored_plan(network: MarkovNetwork, method: str) -> _Plan:
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


def contract(domain: Domain, factors: list[tuple[Clique, Array]], target: Clique) -> Array:
    """``Σ ∏ factors`` over the attributes not in ``target`` (axes in ``target``'s order).

    Traced with ``jnp.einsum``; NumPy tables are contracted on the host by
    :func:`numpy_contract`. Either way along an opt_einsum order.
    """
    subscripts = _subscripts(domain, [attrs for attrs, _ in factors], target)
    tables = [t for _, t in factors]
    path = _contraction_path(subscripts, tuple(tuple(np.shape(t)) for t in tables))
    if all(isinstance(t, np.ndarray) for t in tables):
        return numpy_contract(subscripts, tables, path)
    return jnp.einsum(subscripts, *tables, optimize=list(path),
                      precision=jax.lax.Precision.HIGHEST)


def merge_factors(
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
            merged[k] = (scope, table + embed_into(domain, scope, t, attrs, xp))
        else:
            scope = domain.sorted(attrs)
            merged.append((scope, embed_into(domain, scope, t, attrs, xp)))
    return merged


def _contraction_source(
    domain: Domain, factors: list[tuple[Clique, Array]], sep: Clique, weight: Array
) -> Callable[[Clique], Array]:
    """Marginals of a factored clique: its factors times ``weight`` (over ``sep``), contracted."""
    if sep:
        given = factors + [(sep, weight)]
        return lambda target: contract(domain, given, target)
    return lambda target: contract(domain, factors, target) * jnp.reshape(weight, ())


class _FactoredUpward(NamedTuple):
    log_z: Array
    log_msg: list[Array]  # upward log-message of every non-root clique, over S_i
    factors: list[list[tuple[Clique, Array]]]  # factored cliques: factors scaled to max 1
    sums: list[Array]  # Σ over C_i∖S_i: over S_i (factored), size-1 axes kept (explicit)
    exps: list[Array | None]  # explicit cliques: exp(partial_i − row max)
    ok: Array  # false when a contraction came too close to underflow


def _factored_upward(network: MarkovNetwork, theta: Array, method: str) -> _FactoredUpward:
    """Leaves-to-root pass with the factored cliques of :func:`factored_plan` contracted.

    An explicit clique sums its potentials and children's messages into its table and
    proceeds as :func:`upward_pass`; a factored one merges them into a few small log-factors
    (:func:`merge_factors`), exponentiates each shifted by its maximum, and contracts them
    down to its separator (the shifts add up to the message's log-scale).
    """
    tree = build_junction_tree(network, method)
    check_memory(tree, network=network)
    plan = factored_plan(network, method)
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
            for attrs, t in merge_factors(domain, inputs):
                m = jax.lax.stop_gradient(jnp.maximum(jnp.max(t), lowest))
                shift = shift + m
                if attrs:
                    factors[i].append((attrs, jnp.exp(t - m)))
            covered = {a for attrs, _ in factors[i] for a in attrs}
            factors[i] += [((a,), jnp.ones(domain[a], theta.dtype))
                           for a in clique if a not in covered]
            sums[i] = contract(domain, factors[i], sep)
            trusted = sums[i] >= UNDERFLOW_GUARD
            checks.append(jnp.all(trusted))
            # an untrusted call is answered by the fallback; its log is kept finite so that
            # its gradient, multiplied by the zero cotangent the fallback leaves, stays zero
            msg = shift + jnp.log(jnp.where(trusted, sums[i], 1.0))
        else:
            x = jnp.zeros(domain.shape_of(clique), theta.dtype)
            for c in plan.home[i]:
                x = x + embed(tree, i, tables[c], c)
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
    messages (as :func:`network_marginals`) and the flag of :func:`_factored_upward` (false:
    do not trust them, see ``UNDERFLOW_GUARD``).

    The downward pass follows :func:`_downward`; a factored clique never builds its table but
    serves the marginals asked of it by contracting its factors with ``μ_{S_i} / sums_i``.
    """
    theta = as_vector(network, theta)
    tree = build_junction_tree(network, method)
    plan = factored_plan(network, method)
    domain = tree.domain
    upward = _factored_upward(network, theta, method)
    known = Known(domain)
    requests = network_requests(tree, network)
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
    return tables, pack_messages(tree, upward.log_msg, known, theta.dtype), upward.ok


@functools.partial(jax.jit, static_argnames=("network", "method"))
def _checked_network_marginals(
    network: MarkovNetwork, theta: Array, total: Array, method: str
) -> tuple[tuple[Array, ...], Array]:
    """:func:`_factored_network_marginals`, or the log-space program where its flag is false."""
    tables, messages, ok = _factored_network_marginals(network, theta, total, method)
    return jax.lax.cond(ok, lambda: (tables, messages),
                        lambda: network_marginals(network, theta, total, method))


def network_program(
    network: MarkovNetwork, theta: Array, total: Any, method: str
) -> tuple[tuple[Array, ...], Array]:
    """Network marginals and packed messages by the fastest exact program (:func:`marginals`)."""
    if not any(factored_plan(network, method).factored):
        return network_marginals(network, theta, total, method)
    if is_traced((theta, total)):
        return _checked_network_marginals(network, theta, total, method)
    tables, messages, ok = _factored_network_marginals(network, theta, total, method)
    if not bool(ok):  # concrete: the log-space program runs only when asked for
        return network_marginals(network, theta, total, method)
    return tables, messages


@functools.partial(jax.jit, static_argnames=("network", "method"))
def factored_log_partition(
    network: MarkovNetwork, theta: Array, method: str
) -> tuple[Array, Array]:
    """``(log Z, flag)`` from :func:`_factored_upward`."""
    upward = _factored_upward(network, as_vector(network, theta), method)
    return upward.log_z, upward.ok


@functools.partial(jax.jit, static_argnames=("network", "method"))
def logspace_log_partition(network: MarkovNetwork, theta: Array, method: str) -> Array:
    """``log Z`` by the log-space upward pass alone."""
    theta = as_vector(network, theta)
    tree = build_junction_tree(network, method)
    return upward_pass(tree, clique_log_potentials(tree, network, theta)).log_z


@functools.partial(jax.jit, static_argnames=("network", "method"))
def checked_log_partition(network: MarkovNetwork, theta: Array, method: str) -> Array:
    """:func:`factored_log_partition`, or the log-space program where its flag is false."""
    log_z, ok = factored_log_partition(network, theta, method)
    return jax.lax.cond(ok, lambda: log_z, lambda: logspace_log_partition(network, theta, method))

