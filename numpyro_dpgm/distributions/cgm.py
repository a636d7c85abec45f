"""The collective graphical model: the distribution of the clique count tables of N records."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from numpyro.distributions import constraints
from numpyro.distributions.batch_util import vmap_over
from numpyro.distributions.distribution import Distribution

from .._precision import warn_if_float32
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..tables import project_table
from .constraints import (
    DecomposableLayout,
    count_tables,
    decomposable_layout,
    scaled_marginal_polytope,
)
from .mrf import validated_theta

__all__ = ["CollectiveGraphicalModel", "DecomposableLayout", "decomposable_layout"]


#: The relaxed densities on ``N·M``.
RELAXATIONS = ("lgamma",)

_STIRLING_ERROR = (
    "relaxation='stirling' is not a normalised density: its normaliser depends on θ, which "
    "biases inference of θ; use 'lgamma' or 'normal'"
)


def _log_base_measure(layout: DecomposableLayout, n: Any, total: Any) -> Any:
    """``log h(n) = log N! + Σ_S Σ log n_S! − Σ_C Σ log n_C!`` (seed 002, §3.2), with
    ``log n! = log Γ(n + 1)`` at real tables."""
    tables = layout.covered.unflatten(n)

    def term(t: Any) -> Any:
        return jnp.sum(gammaln(t + 1.0))

    out = -sum(term(tables[c]) for c in layout.tree_cliques)
    out = out + sum(term(project_table(tables[c], c, s)) for c, s in layout.separators)
    return out + gammaln(total + 1.0)


def _largest(total_count: Any) -> int | None:
    """The largest entry of a concrete ``total_count``; ``None`` when it is traced."""
    if isinstance(total_count, jax.core.Tracer):
        return None
    return int(np.max(np.asarray(total_count), initial=0))


def _checked_max(total_count: Any, total_count_max: int | None) -> int | None:
    """``total_count_max`` as an int, checked against a concrete ``total_count``."""
    if total_count_max is None:
        return None
    bound, largest = int(total_count_max), _largest(total_count)
    if bound < 0 or (largest is not None and largest > bound):
        raise ValueError(f"total_count_max = {total_count_max} is below the largest "
                         f"total_count, {largest}")
    return bound


@functools.partial(jax.jit, static_argnums=(0, 1))
def _draw_tables(net: MarkovNetwork, m: int, thetas: Any, totals: Any, keys: Any) -> Any:
    """Per row, the tables of the first ``totals[i]`` of ``m`` records drawn from ``p_θ``.

    One compiled program per network and ``m`` (equal networks share it): outside a compiled
    program (NumPyro's prototype traces of a model) the draws ran op by op, 1.6 s a call on
    Adult's 842-cell tree at ``N = 48,842``."""
    dtype = jnp.result_type(float)
    p = net.num_params

    def one(t: Any, n: Any, k: Any) -> Any:
        idx = net.cell_indices(jt.sample(net, t, k, m))  # (m, num_cliques)
        keep = jnp.broadcast_to((jnp.arange(m) < n)[:, None], idx.shape).astype(dtype)
        return jnp.zeros(p, dtype).at[jnp.reshape(idx, (-1,))].add(jnp.reshape(keep, (-1,)))

    return jax.vmap(one)(thetas, totals, keys)


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
    relaxation : {"lgamma"}
        Relaxed density: ``"lgamma"`` replaces ``n!`` by ``Γ(n+1)`` in the exact pmf (equal to it
        at integer tables; its mass on ``N·M`` is close to, not exactly, one: see
        :mod:`.relaxation`). ``"stirling"`` (``θ·n + N·H(n/N) − N·A(θ)``, seed 002, Eq. 5) is
        refused with a ValueError: its normaliser depends on θ (≈ √(2πN p(1−p)) for one binary
        attribute, 5.06 at p = 0.3, N = 20), which biases inference of θ.
    normalized : bool
        ``theta`` is already normalised, ``A(θ) = 0`` (the log conditionals of
        :class:`~numpyro_dpgm.infer.bayes.conditional.ConditionalCoding`): the densities skip
        computing it. Giving it for a ``theta`` that is not normalised gives wrong densities.
    total_count_max : int, optional
        A static upper bound on ``total_count`` (as in NumPyro's ``Multinomial``): the number
        of records a draw takes. Needed by ``sample`` only where ``total_count`` is traced
        (under ``jit`` or ``vmap`` over it); else a draw takes the largest concrete
        ``total_count``. (It is static, part of the pytree's structure: left unset, CGMs with
        different ``total_count`` share compiled programs.)

    Notes
    -----
    Event shape ``(num_params,)`` in the network's layout: every clique's table, including cliques
    contained in others (their tables are projections). ``sample`` draws ``max N`` (or
    ``total_count_max``) records per batch element by junction-tree forward sampling and counts
    the first ``N_b`` of them (exact draws of the CGM with that element's own total ``N_b``),
    also when ``relaxed``: the samples are then exact CGM tables (points of ``N·M``), not draws
    from the relaxed density. A concrete ``total_count`` is checked (a non-negative integer)
    whether or not arguments are validated.
    """

    arg_constraints = {"theta": constraints.real_vector,
                       "total_count": constraints.nonnegative_integer}
    pytree_data_fields = ("theta", "total_count")
    pytree_aux_fields = ("network", "relaxed", "relaxation", "normalized", "total_count_max")

    def __init__(
        self,
        network: MarkovNetwork,
        theta: Any,
        total_count: Any,
        relaxed: bool = False,
        *,
        relaxation: str = "lgamma",
        normalized: bool = False,
        total_count_max: int | None = None,
        validate_args: bool | None = None,
    ):
        theta = validated_theta(network, theta)
        if relaxation == "stirling":
            raise ValueError(_STIRLING_ERROR)
        if relaxation not in RELAXATIONS:
            raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {relaxation!r}")
        if not isinstance(total_count, jax.core.Tracer):  # concrete: check
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
        self.total_count_max = _checked_max(total_count, total_count_max)
        batch = jnp.broadcast_shapes(theta.shape[:-1], jnp.shape(total_count))
        super().__init__(batch, (network.num_params,), validate_args=validate_args)

    @classmethod
    def infer_shapes(cls, network: Any = None, theta: tuple[int, ...] = (),
                     total_count: tuple[int, ...] = (), *args: Any, **kwargs: Any
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(batch_shape, event_shape)`` for ``theta`` and ``total_count`` of these shapes.

        ``network`` is structural, not a tensor: given as a MarkovNetwork it fixes the event
        shape, else (a shape, ignored) the event shape is ``theta``'s last axis.
        """
        theta = tuple(theta)
        event = (network.num_params,) if isinstance(network, MarkovNetwork) else theta[-1:]
        return jax.lax.broadcast_shapes(theta[:-1], tuple(total_count)), event

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
        layout = decomposable_layout(self.network)
        shape = jnp.broadcast_shapes(value.shape[:-1], jnp.shape(self.total_count))
        n_flat = jnp.reshape(jnp.broadcast_to(value, shape + value.shape[-1:]),
                             (-1, self.network.num_params))
        total = jnp.broadcast_to(self.total_count, shape).reshape(-1)
        base = jax.vmap(lambda n, N: _log_base_measure(layout, n, N))(n_flat, total)
        base = base.reshape(shape)
        energy = jnp.sum(self.theta * value, axis=-1)
        return energy - self.total_count * self._log_partition() + base

    def complete_log_likelihood(self, value: Any) -> Any:
        """``θ·n − N·A(θ)``: the part of ``log p(n; θ)`` that depends on θ (EM's M-step
        objective, seed 002, Algorithm 2), defined on any network and any real ``n``."""
        return jnp.sum(self.theta * jnp.asarray(value), axis=-1) - (
            self.total_count * self._log_partition())

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> Any:
        """Exact CGM draws: per batch element, the tables of ``N_b`` records drawn from
        ``p_θ``.

        Every element draws the same static number of records, ``total_count_max`` or else
        the largest concrete ``N``, and counts the first ``N_b`` of them, which are ``N_b``
        independent records.
        """
        m = self.total_count_max
        if m is None:
            m = _largest(self.total_count)
        if m is None:
            raise TypeError(
                "sampling needs a concrete integer total_count, or total_count_max (a static "
                "bound on it) where total_count is traced: it draws that many records"
            )
        shape = tuple(sample_shape) + self.batch_shape
        net = self.network
        p = net.num_params
        size = math.prod(shape)
        thetas = jnp.reshape(jnp.broadcast_to(self.theta, shape + (p,)), (size, p))
        totals = jnp.reshape(jnp.broadcast_to(jnp.asarray(self.total_count), shape), (size,))
        keys = jax.random.split(key, max(size, 1))[:size]
        counts = _draw_tables(net, int(m), thetas, totals, keys)
        return jnp.reshape(counts, shape + (p,))

    @property
    def mean(self) -> Any:
        """``E[n] = N·μ(θ)``."""
        net = self.network
        fn = lambda t: net.flatten(jt.marginals(net, t))  # noqa: E731
        mu = fn(self.theta) if self.theta.ndim == 1 else jax.vmap(fn)(
            jnp.reshape(self.theta, (-1, net.num_params))
        ).reshape(self.theta.shape)
        return jnp.asarray(self.total_count)[..., None] * mu


@vmap_over.register
def _vmap_over_cgm(d: CollectiveGraphicalModel, theta: Any = None,
                   total_count: Any = None) -> Any:
    """Axes of a CGM under ``jax.vmap`` over ``theta`` and/or ``total_count``."""
    return vmap_over.dispatch(Distribution)(d, theta=theta, total_count=total_count)
