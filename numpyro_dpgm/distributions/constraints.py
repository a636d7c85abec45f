"""Supports of the collective graphical model: count tables and the scaled marginal polytope."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from numpyro.distributions import constraints

from ..network import MarkovNetwork
from ..tables import project_table

__all__ = ["count_tables", "scaled_marginal_polytope", "consistency_residual"]


def consistency_residual(network: MarkovNetwork, n: Any, total: Any) -> Any:
    """Largest violation of the (local) marginal-polytope constraints of ``n``.

    ``max(|Σ n_C − N|, max_{C,D} |proj_{C∩D} n_C − proj_{C∩D} n_D|, max(−n))`` over the network's
    cliques, for ``n`` of shape ``(..., num_params)``. Zero on ``N·M``. On a network that is not
    decomposable, zero is necessary but not sufficient (the local polytope contains ``N·M``).
    """
    tables = network.unflatten(jnp.asarray(n))
    nb = jnp.ndim(n) - 1
    worst = [jnp.max(-jnp.asarray(n), axis=-1)]
    for c in network.cliques:
        t = tables[c]
        worst.append(jnp.abs(jnp.sum(t, axis=tuple(range(nb, nb + len(c)))) - total))
    cliques = network.cliques
    for i, c in enumerate(cliques):
        for d in cliques[i + 1 :]:
            shared = tuple(a for a in c if a in d)
            if not shared:
                continue
            pc = _project_batched(tables[c], c, shared, nb)
            pd = _project_batched(tables[d], d, shared, nb)
            worst.append(jnp.max(jnp.abs(pc - pd).reshape(pc.shape[:nb] + (-1,)), axis=-1))
    return jnp.max(jnp.stack(jnp.broadcast_arrays(*worst), axis=-1), axis=-1)


def _project_batched(table: Any, clique: tuple, target: tuple, nb: int) -> Any:
    if nb == 0:
        return project_table(table, clique, target)
    batch = (f"__batch{i}" for i in range(nb))
    full = tuple(batch) + clique
    return project_table(table, full, full[:nb] + target)


class _CountTables(constraints.Constraint):
    """Integer, non-negative, consistent clique count tables of ``N`` records."""

    is_discrete = True
    event_dim = 1

    def __init__(self, network: MarkovNetwork, total_count: Any, atol: float = 0.0):
        self.network = network
        self.total_count = total_count
        self.atol = atol

    def __call__(self, x: Any) -> Any:
        x = jnp.asarray(x)
        integer = jnp.all(jnp.equal(jnp.mod(x, 1), 0), axis=-1)
        return integer & (consistency_residual(self.network, x, self.total_count) <= self.atol)

    def feasible_like(self, prototype: Any) -> Any:
        # all records in cell 0 of every table: consistent for any network
        first = jnp.concatenate([
            jnp.zeros(s).at[0].set(1.0) for s in self.network.sizes
        ])
        return jnp.broadcast_to(first * self.total_count, jnp.shape(prototype))

    def tree_flatten(self):
        return (self.total_count,), (("total_count",), {"network": self.network,
                                                         "atol": self.atol})

    def __repr__(self) -> str:
        return f"CountTables(cliques={list(self.network.cliques)}, N={self.total_count})"


class _ScaledMarginalPolytope(_CountTables):
    """``N·M``: non-negative, consistent real tables summing to ``N`` (relaxed CGM support)."""

    is_discrete = False

    def __init__(self, network: MarkovNetwork, total_count: Any, atol: float = 1e-6):
        super().__init__(network, total_count, atol)

    def __call__(self, x: Any) -> Any:
        tol = self.atol * jnp.maximum(1.0, self.total_count)
        return consistency_residual(self.network, jnp.asarray(x), self.total_count) <= tol

    def feasible_like(self, prototype: Any) -> Any:
        uniform = jnp.concatenate([jnp.full(s, 1.0 / s) for s in self.network.sizes])
        return jnp.broadcast_to(uniform * self.total_count, jnp.shape(prototype))

    def __repr__(self) -> str:
        return f"ScaledMarginalPolytope(cliques={list(self.network.cliques)}, N={self.total_count})"


def count_tables(network: MarkovNetwork, total_count: Any) -> constraints.Constraint:
    """Support of the exact CGM: integer consistent count tables of ``total_count`` records."""
    return _CountTables(network, total_count)


def scaled_marginal_polytope(
    network: MarkovNetwork, total_count: Any, atol: float = 1e-6
) -> constraints.Constraint:
    """Support of the relaxed CGM: the marginal polytope scaled by ``total_count``.

    ``atol`` is the tolerance of the consistency check, relative to ``max(1, N)``.
    """
    return _ScaledMarginalPolytope(network, total_count, atol)
