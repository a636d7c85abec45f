"""Seed 002's synthetic models (§4.1): the graphs, Dirichlet log-potentials, exact sampling, and
the true model's exact KL to batches of fits."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.oracles import junction_tree as jt

__all__ = ["ER_P", "ER_SEED", "ExactSampler", "Truth", "dirichlet_theta", "model_edges",
           "synthetic_network"]

Array = Any

#: Erdős–Rényi edge probability and the seed of the graph (resampled until connected).
ER_P, ER_SEED = 0.3, 10_000


def model_edges(kind: str, num_nodes: int = 10) -> list[tuple[str, str]]:
    """Edges of seed 002's synthetic graphs: ``"chain3"`` (``1 ≤ |i−j| ≤ 3``) or ``"er"``."""
    names = [f"x{i}" for i in range(num_nodes)]
    if kind == "chain3":
        return [(names[i], names[j]) for i in range(num_nodes)
                for j in range(i + 1, num_nodes) if j - i <= 3]
    if kind == "er":
        rng = np.random.default_rng(ER_SEED)
        while True:
            g = nx.gnp_random_graph(num_nodes, ER_P, seed=int(rng.integers(2**31)))
            if nx.is_connected(g):
                return [(names[u], names[v]) for u, v in sorted(g.edges)]
    raise ValueError(f"unknown model {kind!r}; use 'chain3' or 'er'")


def synthetic_network(kind: str, k: int = 10, num_nodes: int = 10) -> MarkovNetwork:
    """The pairwise network of :func:`model_edges` with ``k`` values per node."""
    return MarkovNetwork({f"x{i}": k for i in range(num_nodes)}, model_edges(kind, num_nodes))


def dirichlet_theta(network: MarkovNetwork, rng: np.random.Generator) -> np.ndarray:
    """``θ_C = log w_C``, ``w_C ~ Dirichlet(1)`` over each clique's cells (seed 002, §4.1)."""
    return np.concatenate([np.log(rng.dirichlet(np.ones(s))) for s in network.sizes])


class ExactSampler:
    """Exact i.i.d. records by sequential conditionals ``p(x_i | x_{B_i})``.

    For the order of the domain, ``B_i`` is the set of earlier attributes adjacent to the
    connected component of ``x_i`` among ``x_i, …, x_d`` (they separate ``x_i`` from the other
    earlier attributes), so ``p(x_i | x_{<i}) = p(x_i | x_{B_i})``; each conditional comes from
    one junction-tree marginal of ``{x_i} ∪ B_i``. Sampling ``n`` records is then ``O(n·d)``.
    """

    def __init__(self, model: MarkovRandomField):
        net = model.network
        attrs = net.domain.attrs
        g = net.graph
        self.parents: list[list[int]] = []
        self.cdfs: list[np.ndarray] = []
        for i, a in enumerate(attrs):
            later = g.subgraph(attrs[i:])
            comp = nx.node_connected_component(later, a)
            bound = sorted({attrs.index(b) for c in comp for b in g[c]
                            if attrs.index(b) < i})
            table = np.asarray(jt.marginal(net, model.theta,
                                           tuple(attrs[j] for j in bound) + (a,)))
            table = np.maximum(table, 0.0)
            cond = table / table.sum(axis=-1, keepdims=True)
            cdf = np.cumsum(cond, axis=-1)
            cdf[..., -1] = 1.0
            self.parents.append(bound)
            self.cdfs.append(cdf)

    def __call__(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = np.zeros((n, len(self.parents)), dtype=np.int64)
        for i, (par, cdf) in enumerate(zip(self.parents, self.cdfs, strict=True)):
            rows = cdf[tuple(x[:, j] for j in par)] if par else np.broadcast_to(cdf, (n,) +
                                                                                 cdf.shape)
            u = rng.random(n)[:, None]
            x[:, i] = np.minimum(np.sum(rows < u, axis=1), cdf.shape[-1] - 1)
        return x

@functools.partial(jax.jit, static_argnums=0)
def _log_partitions(net: MarkovNetwork, thetas: Array) -> Array:
    return jax.vmap(lambda t: jt.log_partition(net, t))(thetas)


class Truth:
    """The true model with ``μ(θ)`` and ``A(θ)`` cached for batched exact KL."""

    def __init__(self, net: MarkovNetwork, theta: np.ndarray):
        self.net = net
        self.theta = jnp.asarray(theta)
        self.model = MarkovRandomField(net, self.theta)
        self.mu = net.flatten(jt.marginals(net, self.theta))
        self.log_z = jt.log_partition(net, self.theta)

    def kl(self, phis: Array) -> np.ndarray:
        """``KL(p_θ ‖ p_φ)`` for a batch ``(B, num_params)`` of fitted log-potentials."""
        phis = jnp.atleast_2d(phis)
        val = ((self.theta[None] - phis) @ self.mu - self.log_z
               + _log_partitions(self.net, phis))
        return np.asarray(val)
