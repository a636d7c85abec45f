"""The collective graphical model: the distribution of the clique count tables of N records."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, xlogy
from numpyro.distributions import constraints
from numpyro.distributions.distribution import Distribution

from .._precision import warn_if_float32
from ..inference import junction_tree as jt
from ..network import MarkovNetwork
from ..tables import project_table
from .constraints import (
    DecomposableLayout,
    count_tables,
    decomposable_layout,
    scaled_marginal_polytope,
)
from .mrf import validated_theta

__all__ = ["CollectiveGraphicalModel", "DecomposableLayout", "decomposable_layout"]


def _log_base_measure(layout: DecomposableLayout, n: Any, total: Any, lgamma: bool = True) -> Any:
    """``log h(n) = log N! + Σ_S Σ log n_S! − Σ_C Σ log n_C!`` (seed 002, §3.2), or its Stirling
    form ``N·H_JT(n/N)`` when ``lgamma`` is false."""
    tables = layout.covered.unflatten(n)

    def term(t: Any) -> Any:
        # log n! ≈ n log n − n; the −n terms cancel (every table sums to N)
        return jnp.sum(gammaln(t + 1.0)) if lgamma else jnp.sum(xlogy(t, t))

    out = -sum(term(tables[c]) for c in layout.tree_cliques)
    out = out + sum(term(project_table(tables[c], c, s)) for c, s in layout.separators)
    if lgamma:
        return out + gammaln(total + 1.0)
    # Stirling: Σ_C H(n_C) − Σ_S H(n_S) with H(t) = −Σ t log(t/N) = −Σ t log t + N log N
    n_edges = len(layout.separators)
    return out + (len(layout.tree_cliques) - n_edges) * xlogy(total, total)


class CollectiveGraphicalModel(Distribution):
    """Distribution of the clique count tables ``n = Σ_i φ(x_i)`` of ``N`` i.i.d. records.

    Parameters
    ----------
    network : MarkovNetwork
    theta : array ``batch + (num_params,)`` or CliqueTables
        Log-potentials of the record-level model ``p_θ``.
    total_count : int or array
        ``N``, the number of records (public in this model).
    relaxed : bool
        ``False``: the exact CGM on integer consistent tables (seed 002, §3.2; Liu et al. 2014),
        ``log p(n) = θ·n − N A(θ) + log h(n)`` with the junction-tree base measure ``h``; exact
        only on decomposable networks (a clear error otherwise). ``True``: a density on the
        scaled marginal polytope ``N·M``.
    relaxation : {"lgamma", "stirling"}
        Relaxed density: ``"lgamma"`` replaces ``n!`` by ``Γ(n+1)`` in the exact pmf (equal to it
        at integer tables); ``"stirling"`` is ``θ·n + N·H(n/N) − N·A(θ)`` (seed 002, Eq. 5).
    normalized : bool
        ``theta`` is already normalised, ``A(θ) = 0`` (the log conditionals of
        :class:`~numpyro_dpgm.infer.bayes.conditional.ConditionalCoding`): the densities skip
        computing it. Giving it for a ``theta`` that is not normalised gives wrong densities.

    Notes
    -----
    Event shape ``(num_params,)`` in the network's layout: every clique's table, including cliques
    contained in others (their tables are projections). ``sample`` draws ``N`` records by
    junction-tree forward sampling and counts them, so ``total_count`` must be a concrete integer
    there.
    """

    arg_constraints = {"theta": constraints.real_vector}
    pytree_data_fields = ("theta", "total_count")
    pytree_aux_fields = ("network", "relaxed", "relaxation", "normalized")

    def __init__(
        self,
        network: MarkovNetwork,
        theta: Any,
        total_count: Any,
        relaxed: bool = False,
        *,
        relaxation: str = "lgamma",
        normalized: bool = False,
        validate_args: bool | None = None,
    ):
        theta = validated_theta(network, theta)
        if relaxation not in ("lgamma", "stirling"):
            raise ValueError(f"relaxation must be 'lgamma' or 'stirling', got {relaxation!r}")
        if isinstance(total_count, int | float | np.number | np.ndarray):  # concrete: check
            n_arr = np.asarray(total_count, dtype=float)
            if np.any(n_arr < 0) or np.any(n_arr != np.floor(n_arr)):
                raise ValueError(f"total_count must be a non-negative integer, got {total_count}")
        if theta.dtype == jnp.float32:
            warn_if_float32("CollectiveGraphicalModel")
        self.network = network
        self.theta = theta
        self.total_count = total_count
        self.relaxed = bool(relaxed)
        self.relaxation = relaxation
        self.normalized = bool(normalized)
        batch = jnp.broadcast_shapes(theta.shape[:-1], jnp.shape(total_count))
        super().__init__(batch, (network.num_params,), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=1)
    def support(self) -> constraints.Constraint:
        if self.relaxed:
            return scaled_marginal_polytope(self.network, self.total_count)
        return count_tables(self.network, self.total_count)

    @property
    def is_discrete(self) -> bool:
        return not self.relaxed

    def _log_partition(self) -> Any:
        """``A(θ)`` over the attributes the cliques cover, shape ``batch`` (0 when
        ``normalized``)."""
        if self.normalized:
            return jnp.zeros(self.theta.shape[:-1], self.theta.dtype)
        layout_net = self._covered()
        fn = lambda t: jt.log_partition(layout_net, t)  # noqa: E731
        if self.theta.ndim == 1:
            return fn(self.theta)
        flat = jnp.reshape(self.theta, (-1, self.network.num_params))
        return jnp.reshape(jax.vmap(fn)(flat), self.theta.shape[:-1])

    def _covered(self) -> MarkovNetwork:
        attrs = [a for a in self.network.domain.attrs
                 if any(a in c for c in self.network.cliques)]
        return MarkovNetwork(self.network.domain.project(attrs), self.network.cliques)

    def log_prob(self, value: Any) -> Any:
        """Exact (``relaxed=False``) or relaxed log density of count tables ``value``."""
        if self._validate_args:
            self._validate_sample(value)
        value = jnp.asarray(value)
        relaxed_stirling = self.relaxed and self.relaxation == "stirling"
        layout = decomposable_layout(self.network)
        n_flat = jnp.reshape(value, (-1, self.network.num_params))
        total = jnp.broadcast_to(self.total_count, value.shape[:-1]).reshape(-1)
        base = jax.vmap(
            lambda n, N: _log_base_measure(layout, n, N, lgamma=not relaxed_stirling)
        )(n_flat, total).reshape(value.shape[:-1])
        energy = jnp.sum(self.theta * value, axis=-1)
        return energy - self.total_count * self._log_partition() + base

    def complete_log_likelihood(self, value: Any) -> Any:
        """``θ·n − N·A(θ)``: the part of ``log p(n; θ)`` that depends on θ (EM's M-step
        objective, seed 002, Algorithm 2), defined on any network and any real ``n``."""
        return jnp.sum(self.theta * jnp.asarray(value), axis=-1) - (
            self.total_count * self._log_partition())

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> Any:
        """Draw ``N`` records from ``p_θ`` and count them (exact CGM draws)."""
        try:
            n = int(self.total_count)
        except TypeError:
            raise TypeError(
                "sampling needs a concrete integer total_count (it draws that many records)"
            ) from None
        shape = sample_shape + self.batch_shape
        thetas = jnp.broadcast_to(self.theta, shape + self.theta.shape[-1:])
        keys = jax.random.split(key, max(math.prod(shape), 1))
        flat = jnp.reshape(thetas, (-1, self.network.num_params))
        net = self.network

        def one(t: Any, k: Any) -> Any:
            return net.features(jt.sample(net, t, k, n))

        counts = jax.vmap(one)(flat, keys[: flat.shape[0]])
        return jnp.reshape(counts, shape + (net.num_params,))

    @property
    def mean(self) -> Any:
        """``E[n] = N·μ(θ)``."""
        net = self.network
        fn = lambda t: net.flatten(jt.marginals(net, t))  # noqa: E731
        mu = fn(self.theta) if self.theta.ndim == 1 else jax.vmap(fn)(
            jnp.reshape(self.theta, (-1, net.num_params))
        ).reshape(self.theta.shape)
        return jnp.asarray(self.total_count)[..., None] * mu
