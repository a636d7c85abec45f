"""Exact marginal oracle: the public functions of the junction-tree oracle.

Given the log-potentials ``θ`` of a :class:`~numpyro_dpgm.network.MarkovNetwork`, the oracle
returns ``log Z = A(θ)`` and the clique marginals ``μ(θ) = ∇A(θ)`` (seed 003, §2 "marginal
oracle"; seed 002, §2). The work is shared out by job:

1. structure (:mod:`~numpyro_dpgm.oracles.triangulation`): the primal graph is triangulated
   and its maximal cliques joined into a junction tree (:class:`JunctionTree`,
   :func:`build_junction_tree`, re-exported here);
2. memory cap (:mod:`~numpyro_dpgm.oracles.memory`): trees with too large a clique are
   refused before anything is allocated;
3. calibration (:mod:`~numpyro_dpgm.oracles.calibration`): messages are passed
   leaves -> root -> leaves;
4. factored calibration (:mod:`~numpyro_dpgm.oracles.factored`): large cliques made by
   triangulation are contracted from their factors;
5. queries (:mod:`~numpyro_dpgm.oracles.queries`): out-of-model marginals from a calibrated
   tree.

:func:`marginal` and :func:`marginals_of` run one compiled program per network (the calibrated
tree, or where a clique is factored the program of :func:`marginals`, which returns the
messages beside the marginals) and answer on the host in NumPy, so a new attribute set
compiles nothing; under ``jit``/``vmap``/``grad`` it is traced instead, from the clique
marginals (:func:`~numpyro_dpgm.oracles.queries.query_marginal`).

Under ``jit``, ``vmap`` or ``grad`` everything that touches θ is traced JAX, so
:func:`log_partition`, :func:`marginals`, :func:`marginal` and :func:`sample` can be jit-ed,
vmap-ed and differentiated over θ; with concrete arguments they run compiled programs (one per
network and method) and :func:`marginal` finishes on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import device_array, jit_modes
from ..domain import Clique
from ..network import MarkovNetwork
from ..tables import CliqueTables, project_table
from .calibration import (
    TreeMarginals,
    as_vector,
    clique_log_potentials,
    tree_marginals,
    unpack_messages,
    upward_pass,
)
from .factored import (
    UNDERFLOW_GUARD,
    checked_log_partition,
    contract,
    factored_log_partition,
    factored_plan,
    logspace_log_partition,
    merge_factors,
    network_program,
)
from .memory import check_memory
from .queries import is_traced, query_marginal
from .triangulation import DEFAULT_METHOD, JunctionTree, build_junction_tree

__all__ = [
    "JunctionTree",
    "build_junction_tree",
    "log_partition",
    "marginals",
    "marginal",
    "marginals_of",
    "host_calibration",
    "sample",
]

Array = Any


def _as_total(total: Any) -> Any:
    # Python numbers enter as a weakly typed float, so that 1, 1.0 and N share one trace
    return float(total) if isinstance(total, int | float) else total


def log_partition(network: MarkovNetwork, theta: Array, method: str = DEFAULT_METHOD) -> Array:
    """Log-partition function ``A(θ)`` of ``network`` with log-potentials ``theta``.

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.oracles.build_junction_tree`).

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
    check_memory(build_junction_tree(network, method), network=network)
    if not any(factored_plan(network, method).factored):
        return logspace_log_partition(network, theta, method)
    if is_traced(theta):
        return checked_log_partition(network, theta, method)
    log_z, ok = factored_log_partition(network, theta, method)
    return log_z if bool(ok) else logspace_log_partition(network, theta, method)


def marginals(
    network: MarkovNetwork, theta: Array, total: Array = 1.0, method: str = DEFAULT_METHOD
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
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.oracles.build_junction_tree`).

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
    check_memory(build_junction_tree(network, method), network=network)
    tables, _ = network_program(network, theta, _as_total(total), method)
    # the tables come from the network's own layout: skip CliqueTables' input checks
    return CliqueTables.tree_unflatten(network.cliques, tables)


def marginal(
    network: MarkovNetwork, theta: Array, attrs: Clique, method: str = DEFAULT_METHOD
) -> Array:
    """Marginal distribution over any attribute set ``attrs`` (in the order given).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    attrs : tuple of str
        Any non-empty set of distinct attributes of the domain.
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.oracles.build_junction_tree`).

    Returns
    -------
    array, shape ``network.domain.shape_of(attrs)``

    Notes
    -----
    With a concrete ``theta`` the call is :func:`marginals_of` of one query: one compiled
    program per network (nothing new is compiled for any attribute set), answered on the host.
    Where the tree has a factored clique, that program is the one of :func:`marginals`: a set
    inside a network clique is summed out of that clique's marginal; any other set, including
    an out-of-model one (Problem 4 of seed 003), is contracted exactly over the subtree of
    cliques that covers it from the potentials placed there and the messages entering it
    (module notes). If that contraction comes too close to underflow, or where no clique is
    factored, the marginal is read from the calibrated clique marginals. Under
    ``jit``, ``vmap`` or ``grad`` the calibrated clique marginals are traced and
    :func:`query_marginal` answers.
    """
    attrs = network.domain.check_clique(attrs)
    if is_traced(theta):
        tree = build_junction_tree(network, method)
        check_memory(tree, network=network)
        return query_marginal(tree, tree_marginals(network, theta, method), attrs)
    return device_array(marginals_of(network, theta, [attrs], method)[0])


def marginals_of(
    network: MarkovNetwork, theta: Array, queries: Sequence[Clique],
    method: str = DEFAULT_METHOD,
) -> list[np.ndarray]:
    """Marginal distributions of many attribute sets from one run of the network's program.

    Parameters
    ----------
    network : MarkovNetwork
    theta : array, shape ``(num_params,)``, or CliqueTables
        Concrete log-potentials in the network's layout (under ``jit``, use :func:`marginal`).
    queries : sequence of tuples of str
        Attribute sets, each answered in the order given (out-of-model ones included).
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic, as for :func:`marginal`.

    Returns
    -------
    list of NumPy arrays
        One per query, shaped ``network.domain.shape_of(query)``.

    Notes
    -----
    One compiled program runs once and every query is answered on the host, so new queries
    compile nothing. Where no junction-tree clique is factored, that program is the calibrated
    tree (every clique's marginal; :func:`host_calibration`, the program that also starts
    Prox-PGM's fits) and each query is read from it
    (:func:`~numpyro_dpgm.oracles.queries.query_marginal`). Otherwise it is the program of
    :func:`marginals` and the queries are contracted as in :func:`marginal`, the calibrated
    tree being computed once for those whose contraction comes too close to underflow.
    """
    queries = [network.domain.check_clique(q) for q in queries]
    tree = build_junction_tree(network, method)
    check_memory(tree, network=network)
    calibrated = host_calibration(network, theta, method)
    if calibrated is not None:
        return [np.asarray(query_marginal(tree, calibrated, q)) for q in queries]
    tables, messages = network_program(network, theta, 1.0, method)
    messages = np.asarray(messages)
    calibrated = None
    out = []
    for attrs in queries:
        holders = [k for k, c in enumerate(network.cliques) if set(attrs) <= set(c)]
        if holders:
            k = min(holders, key=lambda k: network.sizes[k])
            out.append(project_table(np.asarray(tables[k]), network.cliques[k], attrs))
            continue
        answer = _host_query(network, method, theta, messages, attrs)
        if answer is None:  # a contraction came too close to underflow: the calibrated tree
            if calibrated is None:
                calibrated = _on_host(tree_marginals(network, theta, method))
            answer = np.asarray(query_marginal(tree, calibrated, attrs))
        out.append(answer.astype(messages.dtype, copy=False))
    return out


def host_calibration(
    network: MarkovNetwork, theta: Array, method: str = DEFAULT_METHOD
) -> TreeMarginals | None:
    """The calibrated junction tree at a concrete ``theta``, its tables on the host; ``None``
    where a clique of the tree is factored (its table is never built).

    One compiled program per network and method (shared by :func:`marginals_of` and the
    start of :class:`~numpyro_dpgm.oracles.protocol.ExactOracle`'s fits).
    """
    if any(factored_plan(network, method).factored):
        return None
    return _on_host(tree_marginals(network, theta, method))


def _on_host(cal: TreeMarginals) -> TreeMarginals:
    """``cal`` with NumPy arrays (queries then run in NumPy: nothing compiled per query)."""
    return TreeMarginals(np.asarray(cal.log_z), tuple(np.asarray(m) for m in cal.marginals))


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
    plan = factored_plan(network, method)
    domain = tree.domain
    up, sep_marginals = unpack_messages(tree, messages)
    nodes = tree.covering_subtree(attrs)
    inside = set(nodes)
    children = tree.children
    potentials = _theta_tables(network, theta)
    logs: list[tuple[Clique, Any]] = []
    for i in nodes:
        logs += [(c, potentials[c]) for c in plan.home[i]]
        logs += [(tree.separators[k], up[k]) for k in children[i] if k not in inside]
    factors = [(scope, np.exp(t - np.max(t))) for scope, t in merge_factors(domain, logs, np)
               if scope]
    covered = {a for scope, _ in factors for a in scope}
    union = domain.sorted({a for i in nodes for a in tree.cliques[i]})
    factors += [((a,), np.ones(domain[a])) for a in union if a not in covered]
    top = nodes[0]
    sep = tree.separators[top] if tree.parent[top] >= 0 else ()
    rows = contract(domain, factors, sep)
    if not np.all(rows >= UNDERFLOW_GUARD):
        return None
    if sep:
        return contract(domain, factors + [(sep, sep_marginals[top] / rows)], attrs)
    return contract(domain, factors, attrs) / rows


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def sample(
    network: MarkovNetwork, theta: Array, rng_key: Array, num_samples: int,
    method: str = DEFAULT_METHOD,
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
    rng_key : PRNG key
    num_samples : int
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.oracles.build_junction_tree`).

    Returns
    -------
    int array, shape ``(num_samples, num_attrs)``
        Codes in domain order.
    """
    tree = build_junction_tree(network, method)
    domain = tree.domain
    out: list[Array | None] = [None] * len(domain)
    keys = jax.random.split(rng_key, len(tree.cliques))
    for i, logits in zip(tree.order, _conditional_logits(network, theta, method), strict=True):
        sep, new = tree.separators[i], tree.new_attributes(i)
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


def _conditional_logits(network: MarkovNetwork, theta: Array, method: str) -> list[Array]:
    """``log p(x_new | x_sep)`` of every junction-tree clique, in the tree's order.

    Clique ``C_i`` with separator ``S_i`` and new attributes ``N_i = C_i ∖ S_i``
    (:meth:`JunctionTree.new_attributes`) gives a table of shape ``(|S_i| cells, |N_i| cells)``,
    rows and columns raveled in the order of ``S_i`` and of ``N_i``. The upward pass alone
    provides it (in log space): ``partial_i`` minus its log row sums.
    """
    theta = as_vector(network, theta)
    tree = build_junction_tree(network, method)
    upward = upward_pass(tree, clique_log_potentials(tree, network, theta))
    domain = tree.domain
    out = []
    for i in tree.order:
        clique, sep, new = tree.cliques[i], tree.separators[i], tree.new_attributes(i)
        perm = tuple(clique.index(a) for a in sep + new)
        log_cond = upward.partial[i] - upward.logsums[i]
        out.append(jnp.reshape(jnp.transpose(log_cond, perm),
                               (domain.size(sep), domain.size(new))))
    return out


#: :func:`_conditional_logits` compiled once per network and method (for the host's rounding).
conditional_logits = jit_modes(_conditional_logits, static_argnums=(0, 2))


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
