r"""Observation models of released tables: independent noise on every cell (event dim 1).

Continuous releases are modelled by :class:`LaplaceNoise` and :class:`GaussianNoise`; integer
releases (``privacy.release(..., mechanism="discrete_laplace" | "discrete_gaussian")``, OpenDP's
samplers on integer counts) by :class:`DiscreteLaplaceNoise` and :class:`DiscreteGaussianNoise`,
whose support is the integers. :func:`noise_model` picks the one that matches a
:data:`~numpyro_dpgm.measurements.NoiseSpec`.

Discrete noise around a real ``loc``
------------------------------------
The released value is ``y = n + z`` with integer counts ``n`` and integer noise ``z``. In the
relaxed CGM ``n`` is real, so the discrete observation models accept a real ``loc`` and define
``p(y | loc)`` for integer ``y`` as the lattice distribution centred at ``loc``:

.. math:: p(y \mid \ell) = \frac{w(y - \ell)}{\sum_{k \in \mathbb{Z}} w(k - \ell)},
          \qquad w(r) = e^{-|r|/b} \text{ (discrete Laplace)},\;
          w(r) = e^{-r^2/(2σ^2)} \text{ (discrete Gaussian)}.

At integer ``loc`` this is exactly the pmf of ``loc + z`` with ``z`` the released noise
(``P(z) = \frac{1-q}{1+q} q^{|z|}``, ``q = e^{-1/b}``, for the discrete Laplace of Ghosh,
Roughgarden & Sundararajan 2012; ``P(z) ∝ e^{-z²/(2σ²)}`` for the discrete Gaussian of Canonne,
Kamath & Steinke 2020); for every real ``loc`` it is a proper distribution over the integers,
so ``log_prob`` and ``sample`` agree everywhere. With ``f = loc − ⌊loc⌋`` the discrete Laplace
normaliser is ``(q^f + q^{1−f})/(1 − q)`` in closed form; the discrete Gaussian normaliser is a
theta function, summed directly for ``σ < 1`` and by Poisson summation
``σ√(2π) Σ_m e^{−2π²σ²m²} cos(2πmf)`` for ``σ ≥ 1`` (both to double precision). The
normaliser depends on ``loc`` only through ``f`` (a ripple of amplitude
``log((1+q)/(2√q)) ≈ 1/(8b²)`` nats for the discrete Laplace), and it is not differentiable at
integer ``loc``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.util import promote_shapes, validate_sample

from ..measurements import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace, NoiseSpec

__all__ = [
    "LaplaceNoise",
    "GaussianNoise",
    "DiscreteLaplaceNoise",
    "DiscreteGaussianNoise",
    "integer",
    "noise_model",
]


class _Integer(constraints.ParameterFreeConstraint):
    """All integers (values may be stored in a float dtype)."""

    is_discrete = True

    def __call__(self, x: Any) -> Any:
        xp = jnp if isinstance(x, jax.Array) else np
        return xp.isfinite(x) & (xp.floor(x) == x)

    def feasible_like(self, prototype: Any) -> Any:
        return jnp.zeros_like(prototype)


#: The constraint "an integer" (NumPyro ships only bounded integer constraints).
integer = _Integer()


class LaplaceNoise(dist.Independent):
    """``y_i = loc_i + Laplace(0, scale)`` independently for every cell.

    ``loc`` is typically the latent count vector ``n`` (or a linear query of it), so that
    ``log p(y | n) = −||y − n||₁ / b − m log(2b)`` (seed 002, Eq. 3).

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        The Laplace scale ``b`` (sensitivity / ε for the Laplace mechanism).
    """

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = jnp.asarray(loc)
        if loc.ndim < 1:
            raise ValueError("LaplaceNoise needs a vector loc (one entry per released cell)")
        super().__init__(dist.Laplace(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale

    def smoothed_log_prob(self, value: Any, width: float) -> Any:
        """Log density with the kink of ``|r|`` replaced by a Huber function of width ``width``.

        ``ρ_δ(r) = r²/(2δ)`` for ``|r| ≤ δ`` and ``|r| − δ/2`` beyond, so the gradient
        ``clip(r/δ, −1, 1)/b`` is continuous (seed 002's NLBP with a smoothed evidence term;
        ``width → 0`` recovers the Laplace log density up to a constant).
        """
        r = jnp.abs(value - self.base_dist.loc)
        huber = jnp.where(r <= width, r**2 / (2 * width), r - width / 2)
        b = self.base_dist.scale
        return jnp.sum(-huber / b - jnp.log(2 * b), axis=-1)


class GaussianNoise(dist.Independent):
    """``y_i = loc_i + Normal(0, scale)`` independently for every cell."""

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = jnp.asarray(loc)
        if loc.ndim < 1:
            raise ValueError("GaussianNoise needs a vector loc (one entry per released cell)")
        super().__init__(dist.Normal(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale


# ---------------------------------------------------------------------------------------------
# discrete noise
# ---------------------------------------------------------------------------------------------
def _vector_loc(loc: Any, name: str) -> Any:
    loc = jnp.asarray(loc)
    if loc.ndim < 1:
        raise ValueError(f"{name} needs a vector loc (one entry per released cell)")
    if not jnp.issubdtype(loc.dtype, jnp.floating):
        loc = loc.astype(jnp.result_type(float))
    return loc


@partial(jax.jit, static_argnums=3)
def discrete_laplace_draw(key: Any, loc: Any, scale: Any, shape: tuple[int, ...]) -> Any:
    """Exact draw from ``p(y) ∝ e^{−|y − loc|/b}`` on the integers, any real ``loc``.

    With ``f = loc − ⌊loc⌋`` the mass left of ``loc`` (``y ≤ ⌊loc⌋``) is
    ``q^f/(q^f + q^{1−f}) = sigmoid((1 − 2f)/b)``; on either side the distance to the nearest
    lattice point beyond ``loc`` is geometric, ``G = ⌊b·E⌋`` with ``E ~ Exp(1)``
    (``P(G ≥ j) = e^{−j/b}``).
    """
    loc, scale = jnp.broadcast_to(loc, shape), jnp.broadcast_to(scale, shape)
    k_side, k_geo = jax.random.split(key)
    base = jnp.floor(loc)
    f = loc - base
    left = jax.random.uniform(k_side, shape, dtype=base.dtype) < jax.nn.sigmoid((1 - 2 * f) / scale)
    g = jnp.floor(scale * jax.random.exponential(k_geo, shape, dtype=base.dtype))
    return jnp.where(left, base - g, base + 1 + g)


@partial(jax.jit, static_argnums=3)
def discrete_gaussian_draw(key: Any, loc: Any, sigma: Any, shape: tuple[int, ...]) -> Any:
    """Rejection from the discrete Laplace with scale ``t = ⌊σ⌋ + 1`` centred at ``loc``.

    Canonne, Kamath & Steinke (2020), Alg. 3, with the proposal centred at a real ``loc``:
    accept ``y`` with probability ``exp(−(|y − loc| − σ²/t)²/(2σ²))``, the target/proposal
    weight ratio divided by its maximum ``e^{σ²/(2t²)}``; repeated per cell until accepted.
    """
    loc, sigma = jnp.broadcast_to(loc, shape), jnp.broadcast_to(sigma, shape)
    t = jnp.floor(sigma) + 1.0

    def body(state: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        key, out, done = state
        key, k_prop, k_acc = jax.random.split(key, 3)
        y = discrete_laplace_draw(k_prop, loc, t, shape)
        a = jnp.abs(y - loc) - sigma**2 / t
        u = jax.random.uniform(k_acc, shape, dtype=loc.dtype)
        accept = u < jnp.exp(-(a**2) / (2 * sigma**2))
        return key, jnp.where(~done & accept, y, out), done | accept

    init = (key, jnp.zeros(shape, loc.dtype), jnp.zeros(shape, bool))
    return jax.lax.while_loop(lambda s: ~jnp.all(s[2]), body, init)[1]


@jax.jit
def _discrete_laplace_log_prob(value: Any, loc: Any, b: Any) -> Any:
    f = loc - jnp.floor(loc)
    log_norm = jnp.logaddexp(-f / b, -(1 - f) / b) - jnp.log(-jnp.expm1(-1 / b))
    return -jnp.abs(value - loc) / b - log_norm


#: Lattice points summed on each side for the discrete Gaussian normaliser when σ < 1
#: (the first term left out is below e^{−(_DIRECT_TERMS)²/2} ≈ 1e-22 of the largest).
_DIRECT_TERMS = 10
#: Poisson-summation terms m = 1.._POISSON_TERMS when σ ≥ 1 (m = 4 is below e^{−32π²}).
_POISSON_TERMS = 3


@jax.jit
def _discrete_gaussian_log_prob(value: Any, loc: Any, sigma: Any) -> Any:
    loc, sigma = jnp.broadcast_arrays(loc, sigma)
    f = loc - jnp.floor(loc)
    k = jnp.arange(-_DIRECT_TERMS, _DIRECT_TERMS + 1, dtype=f.dtype)
    direct = jax.nn.logsumexp(-0.5 * ((k - f[..., None]) / sigma[..., None]) ** 2, axis=-1)
    sig = jnp.maximum(sigma, 1.0)  # the Poisson branch is only used where σ ≥ 1
    m = jnp.arange(1, _POISSON_TERMS + 1, dtype=f.dtype)
    series = jnp.sum(
        jnp.exp(-2 * math.pi**2 * sig[..., None] ** 2 * m**2)
        * jnp.cos(2 * math.pi * m * f[..., None]),
        axis=-1,
    )
    poisson = jnp.log(sig * math.sqrt(2 * math.pi)) + jnp.log1p(2 * series)
    log_norm = jnp.where(sigma < 1.0, direct, poisson)
    return -0.5 * ((value - loc) / sigma) ** 2 - log_norm


class _Lattice(dist.Distribution):
    """Univariate lattice distribution ``p(y) ∝ w(y − loc)`` on the integers (module docstring).

    Subclasses set ``_log_prob(value, loc, scale)`` and ``_draw(key, loc, scale, shape)``.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = integer
    pytree_data_fields = ("loc", "scale")
    _log_prob: Any
    _draw: Any

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        self.loc, self.scale = promote_shapes(loc, scale)
        batch_shape = jax.lax.broadcast_shapes(jnp.shape(loc), jnp.shape(scale))
        super().__init__(batch_shape, validate_args=validate_args)

    @validate_sample
    def log_prob(self, value: Any) -> Any:
        return type(self)._log_prob(value, self.loc, self.scale)

    def sample(self, key: Any, sample_shape: tuple[int, ...] = ()) -> Any:
        shape = tuple(sample_shape) + self.batch_shape
        return type(self)._draw(key, self.loc, self.scale, shape)


class _DiscreteLaplace1(_Lattice):
    _log_prob = _discrete_laplace_log_prob
    _draw = discrete_laplace_draw


class _DiscreteGaussian1(_Lattice):
    _log_prob = _discrete_gaussian_log_prob
    _draw = discrete_gaussian_draw


class DiscreteLaplaceNoise(dist.Independent):
    """``y_i ∈ ℤ``, ``p(y_i | loc_i) ∝ exp(−|y_i − loc_i|/scale)`` independently for every cell.

    The observation model of a discrete Laplace release (``privacy.release(...,
    mechanism="discrete_laplace")``, OpenDP's ``make_laplace`` on integer counts): at integer
    ``loc`` it is the pmf ``(1−q)/(1+q)·q^{|y − loc|}``, ``q = e^{−1/scale}``; at real ``loc``
    (the relaxed CGM) the lattice distribution of the module docstring.

    Parameters
    ----------
    loc : array ``(..., m)``
        The true counts ``n`` (or a linear query of them).
    scale : float or array broadcastable to ``loc``
        ``b = Δ₁/ε``, the ``scale`` of the release's ``DiscreteLaplace`` NoiseSpec.
    """

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = _vector_loc(loc, "DiscreteLaplaceNoise")
        super().__init__(_DiscreteLaplace1(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale


class DiscreteGaussianNoise(dist.Independent):
    """``y_i ∈ ℤ``, ``p(y_i | loc_i) ∝ exp(−(y_i − loc_i)²/(2σ²))`` independently for every cell.

    The observation model of a discrete Gaussian release (``mechanism="discrete_gaussian"``,
    OpenDP's ``make_gaussian`` on integer counts); real ``loc`` as in the module docstring.

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        ``σ``, the ``sigma`` of the release's ``DiscreteGaussian`` NoiseSpec.
    """

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = _vector_loc(loc, "DiscreteGaussianNoise")
        super().__init__(_DiscreteGaussian1(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale


def noise_model(noise: NoiseSpec, loc: Any, *, validate_args: bool | None = None) -> Any:
    """The observation distribution of a release with noise ``noise`` around ``loc``.

    ``Laplace(b)`` → :class:`LaplaceNoise`, ``Gaussian(σ)`` → :class:`GaussianNoise`,
    ``DiscreteLaplace(b)`` → :class:`DiscreteLaplaceNoise`, ``DiscreteGaussian(σ)`` →
    :class:`DiscreteGaussianNoise`, so that ``numpyro.sample("y", noise_model(m.noise, Q @ n),
    obs=m.values)`` models exactly what the release of measurement ``m`` drew.
    """
    if isinstance(noise, Laplace):
        return LaplaceNoise(loc, noise.scale, validate_args=validate_args)
    if isinstance(noise, Gaussian):
        return GaussianNoise(loc, noise.sigma, validate_args=validate_args)
    if isinstance(noise, DiscreteLaplace):
        return DiscreteLaplaceNoise(loc, noise.scale, validate_args=validate_args)
    if isinstance(noise, DiscreteGaussian):
        return DiscreteGaussianNoise(loc, noise.sigma, validate_args=validate_args)
    raise TypeError(f"noise must be a NoiseSpec, got {type(noise).__name__}")
