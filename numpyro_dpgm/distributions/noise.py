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

import copy
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.batch_util import vmap_over
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
    """All integers.

    Values may be stored in a float dtype (the discrete noise classes draw, and take, integer
    values in the dtype of ``loc``, so that a real ``loc`` of the relaxed CGM and the released
    values share one dtype); :meth:`feasible_like` returns an integer dtype.
    """

    is_discrete = True

    def __call__(self, x: Any) -> Any:
        xp = jnp if isinstance(x, jax.Array) else np
        return xp.isfinite(x) & (xp.floor(x) == x)

    def feasible_like(self, prototype: Any) -> Any:
        """Zeros of ``prototype``'s shape, integer dtype."""
        return jnp.zeros(jnp.shape(prototype), dtype=jnp.result_type(int))


#: The constraint "an integer" (NumPyro ships only bounded integer constraints).
integer = _Integer()


# ---------------------------------------------------------------------------------------------
# discrete noise: samplers and univariate lattice distributions
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


def _laplace_log_norm(f: Any, b: Any) -> Any:
    """``log Σ_k e^{−|k − loc|/b}`` with ``f = loc − ⌊loc⌋``: ``log((q^f + q^{1−f})/(1 − q))``."""
    return jnp.logaddexp(-f / b, -(1 - f) / b) - jnp.log(-jnp.expm1(-1 / b))


@jax.jit
def _discrete_laplace_log_prob(value: Any, loc: Any, b: Any) -> Any:
    f = loc - jnp.floor(loc)
    return -jnp.abs(value - loc) / b - _laplace_log_norm(f, b)


@jax.jit
def _discrete_laplace_entropy(loc: Any, b: Any) -> Any:
    """``H = log Z + E|y − loc|/b`` in closed form.

    The lattice points right of ``loc`` are at distances ``1 − f + j`` and those left of it at
    ``f + j`` (``j ≥ 0``), so ``E|y − loc| = s·f + (1 − s)(1 − f) + q/(1 − q)`` with
    ``s = q^f/(q^f + q^{1−f}) = sigmoid((1 − 2f)/b)`` the mass left of ``loc``.
    """
    loc, b = jnp.broadcast_arrays(loc, b)
    f = loc - jnp.floor(loc)
    s = jax.nn.sigmoid((1 - 2 * f) / b)
    mean_abs = s * f + (1 - s) * (1 - f) + 1 / jnp.expm1(1 / b)
    return _laplace_log_norm(f, b) + mean_abs / b


#: Lattice points summed on each side for the discrete Gaussian normaliser when σ < 1
#: (the first term left out is below e^{−(_DIRECT_TERMS)²/2} ≈ 1e-22 of the largest).
_DIRECT_TERMS = 10
#: Poisson-summation terms m = 1.._POISSON_TERMS when σ ≥ 1 (m = 4 is below e^{−32π²}).
_POISSON_TERMS = 3


def _gaussian_log_norm_and_second_moment(f: Any, sigma: Any) -> tuple[Any, Any]:
    """``log Z`` and ``E(y − loc)²`` of the discrete Gaussian at ``f = loc − ⌊loc⌋``.

    Summed directly for ``σ < 1``; for ``σ ≥ 1`` by Poisson summation, with the Fourier
    transform of ``x² e^{−x²/(2σ²)}``, ``σ√(2π) e^{−2π²σ²ξ²}(σ² − 4π²σ⁴ξ²)``, for the moment.
    """
    f, sigma = jnp.broadcast_arrays(f, sigma)
    k = jnp.arange(-_DIRECT_TERMS, _DIRECT_TERMS + 1, dtype=f.dtype)
    r = k - f[..., None]
    logw = -0.5 * (r / sigma[..., None]) ** 2
    direct = jax.nn.logsumexp(logw, axis=-1)
    direct_m2 = jnp.sum(jnp.exp(logw - direct[..., None]) * r**2, axis=-1)
    sig = jnp.maximum(sigma, 1.0)  # the Poisson branch is only used where σ ≥ 1
    m = jnp.arange(1, _POISSON_TERMS + 1, dtype=f.dtype)
    damp = jnp.exp(-2 * math.pi**2 * sig[..., None] ** 2 * m**2)
    wave = jnp.cos(2 * math.pi * m * f[..., None])
    series = jnp.sum(damp * wave, axis=-1)
    moment = jnp.sum(damp * (1 - 4 * math.pi**2 * sig[..., None] ** 2 * m**2) * wave, axis=-1)
    poisson = jnp.log(sig * math.sqrt(2 * math.pi)) + jnp.log1p(2 * series)
    poisson_m2 = sig**2 * (1 + 2 * moment) / (1 + 2 * series)
    small = sigma < 1.0
    return jnp.where(small, direct, poisson), jnp.where(small, direct_m2, poisson_m2)


@jax.jit
def _discrete_gaussian_log_prob(value: Any, loc: Any, sigma: Any) -> Any:
    loc, sigma = jnp.broadcast_arrays(loc, sigma)
    log_norm, _ = _gaussian_log_norm_and_second_moment(loc - jnp.floor(loc), sigma)
    return -0.5 * ((value - loc) / sigma) ** 2 - log_norm


@jax.jit
def _discrete_gaussian_entropy(loc: Any, sigma: Any) -> Any:
    """``H = log Z + E(y − loc)²/(2σ²)``."""
    loc, sigma = jnp.broadcast_arrays(loc, sigma)
    log_norm, m2 = _gaussian_log_norm_and_second_moment(loc - jnp.floor(loc), sigma)
    return log_norm + m2 / (2 * sigma**2)


class _Lattice(dist.Distribution):
    """Univariate lattice distribution ``p(y) ∝ w(y − loc)`` on the integers (module docstring).

    Subclasses set ``_log_prob(value, loc, scale)``, ``_draw(key, loc, scale, shape)`` and
    ``_entropy(loc, scale)``.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = integer
    pytree_data_fields = ("loc", "scale")
    _log_prob: Any
    _draw: Any
    _entropy: Any

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

    def entropy(self) -> Any:
        """``−Σ_y p(y) log p(y)`` over the integers (closed form), shape ``batch_shape``."""
        return jnp.broadcast_to(type(self)._entropy(self.loc, self.scale), self.batch_shape)


class DiscreteLaplace1(_Lattice):
    _log_prob = _discrete_laplace_log_prob
    _draw = discrete_laplace_draw
    _entropy = _discrete_laplace_entropy


class DiscreteGaussian1(_Lattice):
    _log_prob = _discrete_gaussian_log_prob
    _draw = discrete_gaussian_draw
    _entropy = _discrete_gaussian_entropy


# ---------------------------------------------------------------------------------------------
# the observation models: independent noise on every cell (event dim 1)
# ---------------------------------------------------------------------------------------------
class _CellNoise(dist.Independent):
    """``y_i ∼ base(loc_i, scale_i)`` independently for every cell, as one event of dim 1.

    A subclass sets ``_base``, the univariate distribution class. The arguments are those of
    the subclass, not ``Independent``'s: ``loc`` a real vector, ``scale`` positive (a scalar or
    an array broadcastable to ``loc``); ``validate_args=True`` checks them, and ``infer_shapes``,
    ``vmap_over`` and ``promote_batch_shape`` know them.
    """

    arg_constraints = {"loc": constraints.real_vector, "scale": constraints.positive}
    # the data of the pytree is Independent's base_dist (loc and scale are its attributes)
    pytree_data_fields = ()
    support: constraints.Constraint = constraints.real_vector
    _base: Any

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        # the arguments are checked here, under this class's name; the base then checks values
        # against the support in log_prob exactly when this distribution validates. Concrete
        # arguments stay concrete inside jit, so that validate_args can check them there.
        with jax.ensure_compile_time_eval():
            loc = _vector_loc(loc, type(self).__name__)
            base = type(self)._base(loc, scale, validate_args=False)
        super().__init__(base, 1, validate_args=validate_args)
        base._validate_args = self._validate_args

    @property
    def loc(self) -> Any:
        return self.base_dist.loc

    @property
    def scale(self) -> Any:
        return self.base_dist.scale

    @classmethod
    def infer_shapes(cls, loc: tuple[int, ...] = (), scale: tuple[int, ...] = ()
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(batch_shape, event_shape)`` for ``loc`` and ``scale`` of these shapes."""
        shape = jax.lax.broadcast_shapes(tuple(loc), tuple(scale))
        if len(shape) < 1 or len(loc) < 1:
            raise ValueError(f"{cls.__name__} needs a vector loc (one entry per released cell)")
        return shape[:-1], shape[-1:]

    def entropy(self) -> Any:
        """Sum over the cells of every cell's entropy, shape ``batch_shape``."""
        cells = jnp.broadcast_to(self.base_dist.entropy(), self.base_dist.batch_shape)
        return jnp.sum(cells, axis=-1)


@vmap_over.register
def _vmap_over_cell_noise(d: _CellNoise, loc: Any = None, scale: Any = None) -> Any:
    """Axes of a noise distribution under ``jax.vmap`` over ``loc`` and/or ``scale``."""
    axes = copy.copy(d)
    axes.base_dist = vmap_over(d.base_dist, loc=loc, scale=scale)
    return axes


class LaplaceNoise(_CellNoise):
    """``y_i = loc_i + Laplace(0, scale)`` independently for every cell.

    ``loc`` is typically the latent count vector ``n`` (or a linear query of it), so that
    ``log p(y | n) = −||y − n||₁ / b − m log(2b)`` (seed 002, Eq. 3).

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        The Laplace scale ``b`` (sensitivity / ε for the Laplace mechanism).
    """

    _base = dist.Laplace

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


class GaussianNoise(_CellNoise):
    """``y_i = loc_i + Normal(0, scale)`` independently for every cell.

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        The standard deviation ``σ``.
    """

    _base = dist.Normal


class DiscreteLaplaceNoise(_CellNoise):
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

    support = constraints.independent(integer, 1)
    _base = DiscreteLaplace1


class DiscreteGaussianNoise(_CellNoise):
    """``y_i ∈ ℤ``, ``p(y_i | loc_i) ∝ exp(−(y_i − loc_i)²/(2σ²))`` independently for every cell.

    The observation model of a discrete Gaussian release (``mechanism="discrete_gaussian"``,
    OpenDP's ``make_gaussian`` on integer counts); real ``loc`` as in the module docstring.

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        ``σ``, the ``sigma`` of the release's ``DiscreteGaussian`` NoiseSpec.
    """

    support = constraints.independent(integer, 1)
    _base = DiscreteGaussian1


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
