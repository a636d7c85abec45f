r"""NUTS through a map fitted to a pilot run's draws: a sinh-arcsinh map per whitened coordinate.

On the collapsed path of a large Laplace release, the log odds of nearly empty cells have a
posterior that the curvature at the mode (the Laplace metric, :mod:`.laplace_metric`) fits
badly: bounded by the release on one side, a tail of the prior on the other, 2–4 times wider
than the metric says. A wider linear metric does not help (the step size falls as the
trajectories lengthen). The map here bends each coordinate instead. In the coordinates
``w = L⁻¹(z − ẑ)`` that the Laplace approximation ``N(ẑ, L Lᵀ)`` whitens, each ``w_i`` gets
its own sinh-arcsinh transform of a standard normal ``u_i`` (Jones and Pewsey 2009):

.. math::

    w_i = a_i + s_i \sinh\big(δ_i \operatorname{arsinh}(u_i) − ε_i\big),\qquad
    z = ẑ + L w,                                                                          \tag{1}

whose location ``a_i``, scale ``s_i``, skew ``ε_i`` and tail weight ``δ_i`` match the
quantiles of the pilot's draws of ``w_i`` (:func:`fit_sinh_arcsinh`; the quantiles of a
sample, a forward fit, follow its tails where a variational fit, which minimises the reverse
divergence, keeps them light). NUTS then runs on ``u``, whose target
``p(z(u)) |∂z/∂u|`` is close to a standard normal where the map fits, under the
:class:`sinh_arcsinh_map` effect handler: the mapped sites become deterministic functions of
one site :data:`MAPPED_SITE`, as under NumPyro's ``NeuTraReparam``. Any fixed bijection leaves
the posterior of the model's sites unchanged; a poor map only slows the chain.

>>> import jax, jax.numpy as jnp, numpyro
>>> numpyro.enable_x64()
>>> draws = jax.random.gamma(jax.random.key(0), 3.0, (4000, 1))  # skewed to the right
>>> fitted = fit_sinh_arcsinh(draws, jnp.zeros(1), jnp.eye(1))
>>> tuple(round(float(map_forward(fitted, jnp.full(1, t))[0].item()), 1)
...       for t in (-1.645, 0, 1.645))
(0.9, 2.6, 6.3)
>>> tuple(round(float(q), 1) for q in jnp.quantile(draws, jnp.array([0.05, 0.5, 0.95])))
(0.9, 2.7, 6.3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import biject_to
from numpyro.primitives import Messenger
from scipy.optimize import least_squares
from scipy.stats import norm

from .extend import ProgramData

__all__ = ["MAPPED_SITE", "PROBABILITIES", "SinhArcsinh", "fit_sinh_arcsinh", "linear_map",
           "map_forward", "map_inverse", "sinh_arcsinh_map"]

Array = Any

#: The site NUTS moves under :class:`sinh_arcsinh_map`: ``u`` of (1), standard normal a priori.
MAPPED_SITE = "_mapped_u"

#: The quantiles the fit matches. The outermost are the 3rd and 97th percentiles: a pilot of a
#: few hundred correlated draws does not place the 1st and 99th well.
PROBABILITIES = (0.03, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97)

#: Bounds of the fit: the scale within ``[0.3, e³]`` of the Laplace approximation's, the skew
#: ``|ε| ≤ 1``, the tail weight ``δ`` within ``e^{±0.5}``: the map stays near the normal
#: approximation, so that a noisy pilot cannot bend a coordinate into a needle. With wider
#: bounds (``|ε| ≤ 3``, ``δ`` within ``e^{±1.5}``, scale from 0.007) on Adult's 842-cell tree
#: three coordinates fitted at the bounds mixed worse than under the plain metric (smallest
#: bulk ESS 22 against 46 of 600 draws, by hand; docs/measurements.md).
BOUNDS = ((np.log(0.3), -1.0, -0.5), (3.0, 1.0, 0.5))


class SinhArcsinh(NamedTuple):
    """The map (1): ``z = loc + chol · w(u)``.

    Attributes
    ----------
    loc : array (D,)
        ``ẑ``.
    chol : array (D, D)
        ``L``, lower triangular.
    shift, log_scale, skew, log_tail : arrays (D,)
        ``a``, ``log s``, ``ε``, ``log δ`` per whitened coordinate.
    """

    loc: Array
    chol: Array
    shift: Array
    log_scale: Array
    skew: Array
    log_tail: Array


def linear_map(loc: Array, chol: Array) -> SinhArcsinh:
    """The map (1) that bends nothing (``a = 0``, ``s = 1``, ``ε = 0``, ``δ = 1``):
    ``z = loc + chol · u``. NUTS with the unit metric on ``u`` is NUTS on ``z`` with the inverse
    mass matrix ``chol · cholᵀ``, so under it a pilot run with the Laplace metric and the run
    with the fitted map are runs of one kernel (one compiled program), the map its data."""
    loc, chol = jnp.asarray(loc), jnp.asarray(chol)
    zero = jnp.zeros_like(loc)
    return SinhArcsinh(loc, chol, zero, zero, zero, zero)


def _quantiles(params: np.ndarray, z: np.ndarray) -> np.ndarray:
    a, log_s, eps, log_d = params
    return a + np.exp(log_s) * np.sinh(np.exp(log_d) * np.arcsinh(z) - eps)


def fit_sinh_arcsinh(draws: Array, loc: Array, chol: Array) -> SinhArcsinh:
    """The map (1) whose quantiles at :data:`PROBABILITIES` are nearest (least squares) to
    those of ``draws`` per whitened coordinate.

    Parameters
    ----------
    draws : array (S, D)
        Pilot draws of the unconstrained sites, flattened (all chains together).
    loc, chol : arrays (D,), (D, D)
        ``ẑ`` and ``L`` of the normal approximation that whitens them.
    """
    draws = np.asarray(draws, dtype=float)
    if draws.ndim != 2 or draws.shape[0] < len(PROBABILITIES):
        raise ValueError(f"draws must be (S, D) with S >= {len(PROBABILITIES)}, got shape "
                         f"{draws.shape}")
    loc, chol = np.asarray(loc, dtype=float), np.asarray(chol, dtype=float)
    w = np.linalg.solve(chol, (draws - loc).T).T
    z = norm.ppf(PROBABILITIES)
    lower, upper = BOUNDS
    median = PROBABILITIES.index(0.5)
    fitted = np.empty((w.shape[1], 4))
    for i, col in enumerate(w.T):
        q = np.quantile(col, PROBABILITIES)
        spread = np.log(np.clip((q[-2] - q[1]) / (z[-2] - z[1]), np.exp(lower[0]),
                                np.exp(upper[0])))
        fit = least_squares(lambda p, q=q: _quantiles(p, z) - q,
                            np.array([q[median], spread, 0.0, 0.0]),
                            bounds=([-np.inf, *lower], [np.inf, *upper]))
        fitted[i] = fit.x
    return SinhArcsinh(jnp.asarray(loc), jnp.asarray(chol),
                       *(jnp.asarray(fitted[:, k]) for k in range(4)))


def map_forward(sas: SinhArcsinh, u: Array) -> tuple[Array, Array]:
    """``(z, log |det ∂z/∂u|)`` of (1) at ``u`` (D,)."""
    tail = jnp.exp(sas.log_tail)
    inner = tail * jnp.arcsinh(u) - sas.skew
    w = sas.shift + jnp.exp(sas.log_scale) * jnp.sinh(inner)
    log_det = (jnp.sum(sas.log_scale + sas.log_tail + jnp.log(jnp.cosh(inner))
                       - 0.5 * jnp.log1p(u * u))
               + jnp.sum(jnp.log(jnp.abs(jnp.diagonal(sas.chol)))))
    return sas.loc + sas.chol @ w, log_det


def map_inverse(sas: SinhArcsinh, z: Array) -> Array:
    """``u`` with ``map_forward(sas, u)[0] == z``."""
    w = solve_triangular(sas.chol, z - sas.loc, lower=True)
    return jnp.sinh((jnp.arcsinh((w - sas.shift) * jnp.exp(-sas.log_scale)) + sas.skew)
                    * jnp.exp(-sas.log_tail))


class sinh_arcsinh_map(Messenger):
    """Sample the sites of ``mode`` (a pytree of their unconstrained values, the order of
    :func:`jax.flatten_util.ravel_pytree`) as the map ``sas`` (1) of one standard normal site
    :data:`MAPPED_SITE`: each becomes deterministic, its density and the Jacobians of the map
    and of its support's bijection a factor, as in NumPyro's ``NeuTraReparam``. ``sas`` may be
    a :class:`~.extend.ProgramData` holding the map, read each time the model runs (a kernel
    with it as its ``program_data`` takes the map as an argument of its compiled program).

    >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
    >>> from numpyro import handlers
    >>> def model():
    ...     numpyro.sample("s", dist.HalfNormal(1.0))
    >>> sas = SinhArcsinh(jnp.zeros(1), jnp.eye(1), *(jnp.zeros(1),) * 4)
    >>> mapped = sinh_arcsinh_map(model, sas, {"s": jnp.zeros(())})
    >>> tr = handlers.trace(handlers.seed(mapped, 0)).get_trace()
    >>> site = tr["s"]
    >>> site["type"], MAPPED_SITE in tr
    ('deterministic', True)
    """

    def __init__(self, fn: Callable | None = None, sas: SinhArcsinh | None = None,
                 mode: Mapping[str, Array] | None = None):
        if sas is None or mode is None:
            raise ValueError("sinh_arcsinh_map needs the map (sas) and the sites' mode")
        flat, self._unravel = ravel_pytree(dict(mode))
        size = (sas.value if isinstance(sas, ProgramData) else sas).loc.size
        if flat.size != size:
            raise ValueError(f"the map has {size} coordinates, the sites {flat.size}")
        self.sas, self.sites = sas, frozenset(mode)
        self._values: dict | None = None
        super().__init__(fn)

    def __enter__(self) -> Any:
        self._values = None  # one u per run of the model
        return super().__enter__()

    def process_message(self, msg: dict) -> None:
        if (msg["type"] != "sample" or msg["name"] not in self.sites
                or msg["is_observed"]):
            return
        if self._values is None:
            sas = self.sas.value if isinstance(self.sas, ProgramData) else self.sas
            d = sas.loc.size
            u = numpyro.sample(MAPPED_SITE, dist.Normal(jnp.zeros(d), 1.0).to_event(1)
                               .mask(False))
            z, log_det = map_forward(sas, u)
            numpyro.factor(f"{MAPPED_SITE}_log_det", log_det)
            self._values = self._unravel(z)
        fn, name = msg["fn"], msg["name"]
        unconstrained = self._values[name]
        bijection = biject_to(fn.support)
        value = bijection(unconstrained)
        log_density = (jnp.sum(fn.log_prob(value))
                       + jnp.sum(bijection.log_abs_det_jacobian(unconstrained, value)))
        numpyro.factor(f"_{name}_log_prob", log_density)
        for key in list(msg):
            if key not in ("type", "name", "value", "cond_indep_stack"):
                del msg[key]
        msg["type"], msg["value"] = "deterministic", value
