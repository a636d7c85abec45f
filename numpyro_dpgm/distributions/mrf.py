"""The Markov random field as a NumPyro distribution over records."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints
from numpyro.distributions.batch_util import vmap_over
from numpyro.distributions.distribution import Distribution

from .._precision import warn_if_float32
from ..domain import Clique
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.triangulation import DEFAULT_METHOD, check_method
from ..tables import CliqueTables

__all__ = ["MarkovRandomField"]


def validated_theta(network: MarkovNetwork, theta: Any) -> jax.Array:
    """``theta`` (array or CliqueTables) as an array ``(..., num_params)``; clear errors else."""
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    if isinstance(theta, CliqueTables):
        theta = network.flatten(theta)
    # a concrete theta stays concrete inside jit (as NumPyro's own distributions keep NumPy
    # arguments), so that validate_args can check it there; a traced one stays traced
    with jax.ensure_compile_time_eval():
        theta = jnp.asarray(theta)
    if theta.ndim < 1 or theta.shape[-1] != network.num_params:
        raise ValueError(
            f"theta has shape {theta.shape}; this network needs (..., {network.num_params})"
        )
    return theta


class MarkovRandomField(Distribution):
    """Log-linear model ``p_θ(x) = exp(θ·φ(x) − A(θ))`` over the records of a network's domain.

    Parameters
    ----------
    network : MarkovNetwork
        Domain and cliques; ``φ(x)`` is the indicator of the cell ``x`` falls in, per clique.
    theta : array, shape ``batch_shape + (network.num_params,)``, or CliqueTables
        Log-potentials in the network's layout.
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic of the junction tree used for exact inference; the default,
        ``"auto"``, keeps the tree with fewer cells of the two
        (:func:`~numpyro_dpgm.oracles.build_junction_tree`).

    Notes
    -----
    Event shape is ``(num_attrs,)``: a record of integer codes in domain order. ``log_prob``,
    ``sample`` (exact forward sampling), :meth:`marginal`, :meth:`marginals` and
    :meth:`log_partition` all run on the junction tree, which is built once per network.

    Examples
    --------
    >>> import jax, numpyro
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    >>> mrf = MarkovRandomField(net, jax.numpy.log(jax.numpy.array([0.1, 0.2, 0.3, 0.4])))
    >>> round(float(mrf.marginal(("b",))[1]), 6)
    0.6
    >>> mrf.sample(jax.random.key(0), (5,)).shape
    (5, 2)
    """

    arg_constraints = {"theta": constraints.real_vector}
    pytree_data_fields = ("theta",)
    pytree_aux_fields = ("network", "method")

    def __init__(
        self,
        network: MarkovNetwork,
        theta: Any,
        *,
        method: str = DEFAULT_METHOD,
        validate_args: bool | None = None,
    ):
        theta = validated_theta(network, theta)
        if not jnp.issubdtype(theta.dtype, jnp.floating):
            with jax.ensure_compile_time_eval():
                theta = theta.astype(jnp.result_type(float))
        if theta.dtype == jnp.float32:
            warn_if_float32("MarkovRandomField")
        self.network = network
        self.theta = theta
        self.method = check_method(method)
        super().__init__(theta.shape[:-1], (len(network.domain),), validate_args=validate_args)

    @classmethod
    def infer_shapes(cls, network: Any = None, theta: tuple[int, ...] = (), *args: Any,
                     **kwargs: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(batch_shape, event_shape)`` for a ``theta`` of shape ``theta``.

        The event shape, one code per attribute, is the network's (structural, not a tensor):
        pass the MarkovNetwork itself.
        """
        if not isinstance(network, MarkovNetwork):
            raise TypeError(
                "MarkovRandomField's event shape is the number of the network's attributes: "
                "infer_shapes needs the MarkovNetwork itself")
        return tuple(theta)[:-1], (len(network.domain),)

    def validate_args(self, strict: bool = True) -> None:
        """NumPyro's check of ``theta`` (every entry finite); a concrete ``theta`` is checked
        on the host, where JAX would compile a small program for every network's size."""
        if isinstance(self.theta, jax.core.Tracer):
            super().validate_args(strict)
        elif not np.all(np.isfinite(np.asarray(self.theta))):
            raise ValueError("MarkovRandomField distribution got invalid theta parameter: "
                             "every log-potential must be finite")

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self) -> constraints.Constraint:
        upper = np.asarray(self.network.domain.shape) - 1
        return constraints.independent(constraints.integer_interval(0, upper), 1)

    # -- helpers -------------------------------------------------------------------------------
    def _over_batch(self, fn, *args):
        """Apply ``fn(theta, *args)`` to every batch element; outputs get ``batch_shape`` dims."""
        if not self.batch_shape:
            return fn(self.theta, *args)
        flat = jnp.reshape(self.theta, (-1, self.network.num_params))
        out = jax.vmap(fn)(flat, *args)
        return jax.tree.map(lambda v: jnp.reshape(v, self.batch_shape + v.shape[1:]), out)

    # -- distribution contract -----------------------------------------------------------------
    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        n = math.prod(sample_shape)
        d = len(self.network.domain)
        if not self.batch_shape:
            x = jt.sample(self.network, self.theta, key, n, self.method)
            return jnp.reshape(x, sample_shape + (d,))
        keys = jax.random.split(key, math.prod(self.batch_shape))
        x = self._over_batch(
            lambda t, k: jt.sample(self.network, t, k, n, self.method), keys
        )  # batch + (n, d)
        nb = len(self.batch_shape)
        x = jnp.moveaxis(x, nb, 0)  # (n,) + batch + (d,)
        return jnp.reshape(x, sample_shape + self.batch_shape + (d,))

    def log_prob(self, value: Any) -> jax.Array:
        """``θ·φ(x) − A(θ)`` for records ``x`` of shape ``(..., num_attrs)``.

        An array's last axis is in domain order; a pandas DataFrame's columns are found by name
        (their order does not matter, extra columns are ignored).
        """
        value = self._by_name(value)
        if not isinstance(value, jax.Array | np.ndarray):
            value = np.asarray(value)
        num_attrs = len(self.network.domain)
        if jnp.ndim(value) < 1 or jnp.shape(value)[-1] != num_attrs:
            raise ValueError(
                f"records have shape {jnp.shape(value)}; expected (..., {num_attrs}), one code "
                f"per attribute in domain order {list(self.network.domain)}"
            )
        if self._validate_args:  # on the values as given: concrete ones warn inside jit too
            self._validate_sample(value)
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"records must be integer codes, got dtype {value.dtype}")
        # a record outside the domain has probability zero (its cell index would be garbage)
        inside = jnp.all((value >= 0) & (value < jnp.asarray(self.network.domain.shape)),
                         axis=-1)
        value = jnp.where(inside[..., None], value, 0)
        idx = self.network.cell_indices(value)  # (..., num_cliques)
        if not self.batch_shape:
            energy = jnp.sum(self.theta[idx], axis=-1)
        else:
            shape = jnp.broadcast_shapes(value.shape[:-1], self.batch_shape)
            theta = jnp.broadcast_to(self.theta, shape + self.theta.shape[-1:])
            idx = jnp.broadcast_to(idx, shape + idx.shape[-1:])
            energy = jnp.sum(jnp.take_along_axis(theta, idx, axis=-1), axis=-1)
        return jnp.where(inside, energy - self.log_partition(), -jnp.inf)

    def _by_name(self, value: Any) -> Any:
        """A DataFrame's columns in domain order (missing ones are an error); else ``value``."""
        if type(value).__module__.partition(".")[0] != "pandas" or not hasattr(value, "columns"):
            return value
        attrs = list(self.network.domain)
        missing = [a for a in attrs if a not in value.columns]
        if missing:
            raise ValueError(f"records lack column(s) {missing} of the domain {attrs}")
        return value[attrs].to_numpy()

    # -- inference -----------------------------------------------------------------------------
    def log_partition(self) -> jax.Array:
        """``A(θ)``, shape ``batch_shape``."""
        return self._over_batch(lambda t: jt.log_partition(self.network, t, self.method))

    def marginals(self, total: float = 1.0) -> CliqueTables:
        """Marginals of the network's cliques (scaled to ``total``), leaves ``batch + table``."""
        return self._over_batch(lambda t: jt.marginals(self.network, t, total, self.method))

    def marginal(self, attrs: Clique | str) -> jax.Array:
        """Marginal over any attribute set, axes in the order of ``attrs``."""
        attrs = self.network.domain.check_clique(attrs)
        return self._over_batch(lambda t: jt.marginal(self.network, t, attrs, self.method))

    @property
    def mean(self) -> jax.Array:
        """Expected code of every attribute."""
        means = [
            jnp.sum(self.marginal((a,)) * jnp.arange(k), axis=-1)
            for a, k in self.network.domain.items()
        ]
        return jnp.stack(means, axis=-1)


@vmap_over.register
def _vmap_over_mrf(d: MarkovRandomField, theta: Any = None) -> Any:
    """Axes of a MarkovRandomField under ``jax.vmap`` over ``theta``."""
    return vmap_over.dispatch(Distribution)(d, theta=theta)
