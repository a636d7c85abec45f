r"""The linear algebra of the collapsed sampler (:mod:`.collapsed`): the release given ``θ, v``.

Under the normal relaxation of the CGM (:mod:`numpyro_dpgm.distributions.normal_cgm`) the clique
tables are linear in standard normal coordinates ``z``: ``n = Nμ(θ) + L(θ) z`` with
``L Lᵀ = NΣ(θ)``, the CGM's covariance. The released answers are ``y = Q n + e`` (``Q`` the
measurements' read-outs, :meth:`~.model.NoisyMarginalsModel.predict`) with independent noise
``e_i ∼ N(0, v_i)``, so with ``P = Q L`` and ``m = Q Nμ``

.. math::

    y \mid θ, v \sim \mathcal N\big(m(θ),\; P(θ) P(θ)^⊤ + V\big), \qquad V = \operatorname{diag} v,
    \tag{1}

and, given ``y``, the coordinates have the Gaussian posterior

.. math::

    z \mid θ, v, y \sim \mathcal N\big(H^{-1} P^⊤ V^{-1} r,\; H^{-1}\big), \qquad
    H = I + P^⊤ V^{-1} P, \quad r = y − m.                                      \tag{2}

(2) draws the tables from their exact conditional without ever forming the singular ``NΣ``
(tables sum to ``N`` and share margins): ``H ⪰ I``, so no jitter and no reduced coordinates are
needed. The log density of (1) uses the same factor ``H = R Rᵀ`` (Woodbury, matrix determinant
lemma):

.. math::

    \log p(y) = −\tfrac12\Big(\tilde r^⊤\tilde r − u^⊤u + \sum_i \log v_i + 2\sum_j \log R_{jj}
    + k \log 2π\Big), \quad \tilde r = V^{-1/2} r,\ u = R^{-1} P^⊤ V^{-1} r,    \tag{3}

and its gradient is written by hand (``C = PPᵀ + V``, ``α = C⁻¹ r = V⁻¹(r − P H⁻¹ Pᵀ V⁻¹ r)``,
``C⁻¹ P = V⁻¹ P H⁻¹``):

.. math::

    \frac{∂ \log p}{∂ r} = −α, \qquad \frac{∂ \log p}{∂ P} = α (P^⊤ α)^⊤ − V^{-1} P H^{-1},
    \qquad \frac{∂ \log p}{∂ v_i} = \tfrac12\big(α_i^2 − (C^{-1})_{ii}\big).          \tag{4}

Laplace noise enters as a scale mixture, ``e_i ∣ v_i ∼ N(0, v_i)``, ``v_i ∼ Exp(1/(2b²))``;
given ``e_i`` (Park & Casella 2008)

.. math:: 1/v_i \mid e_i \sim \mathrm{InverseGaussian}\big(1/(b\,|e_i|),\ 1/b^2\big),   \tag{5}

drawn by the transformation with multiple roots of Michael, Schucany & Haas (1976).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.linalg import cho_solve, solve_triangular
from numpyro.distributions import constraints

__all__ = ["ReleaseNormal", "answer_moments", "conditional_coordinates", "inverse_gaussian",
           "log_likelihood", "noise_variances"]

Array = Any


def answer_moments(tables: Callable[[Array], Array], predict: Callable[[Array], Array],
                   dim: int) -> tuple[Array, Array]:
    """``m`` and ``P`` of (1): the answers' mean and covariance factor.

    Parameters
    ----------
    tables : callable
        ``z ↦ n``, affine (the normal relaxation's tables at ``θ``,
        :func:`~numpyro_dpgm.distributions.normal_cgm.normal_tables`).
    predict : callable
        ``n ↦ Q n``, linear.
    dim : int
        Size of ``z``.

    Returns
    -------
    loc : array ``(k,)``
    factor : array ``(k, dim)``
    """
    loc, jvp = jax.linearize(lambda z: predict(tables(z)), jnp.zeros(dim))
    return loc, jax.vmap(jvp, out_axes=1)(jnp.eye(dim, dtype=loc.dtype))


@jax.jit
def _capacitance(factor: Array, variance: Array) -> tuple[Array, Array]:
    """``V^{-1/2} P`` and the lower Cholesky factor ``R`` of ``H = I + Pᵀ V⁻¹ P`` (2)."""
    scaled = factor / jnp.sqrt(variance)[:, None]
    h = jnp.eye(factor.shape[1], dtype=factor.dtype) + scaled.T @ scaled
    return scaled, jnp.linalg.cholesky(h)


@jax.jit
def _log_likelihood(residual: Array, factor: Array, variance: Array) -> tuple[Array, tuple]:
    """(3), and what its gradient (4) needs."""
    scaled, chol = _capacitance(factor, variance)
    rt = residual / jnp.sqrt(variance)
    u = solve_triangular(chol, scaled.T @ rt, lower=True)
    value = -0.5 * (rt @ rt - u @ u + jnp.sum(jnp.log(variance))
                    + 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
                    + residual.shape[-1] * math.log(2.0 * math.pi))
    return value, (residual, factor, variance, scaled, chol, u)


@jax.custom_vjp
def log_likelihood(residual: Array, factor: Array, variance: Array) -> Array:
    """``log N(r; 0, PPᵀ + diag v)`` (3), with the hand-written gradient (4).

    Parameters
    ----------
    residual : array ``(k,)``
        ``r = y − m``.
    factor : array ``(k, d)``
        ``P``.
    variance : array ``(k,)``
        ``v`` (positive).

    Returns
    -------
    scalar array
    """
    return _log_likelihood(residual, factor, variance)[0]


def _fwd(residual: Array, factor: Array, variance: Array) -> tuple[Array, tuple]:
    return _log_likelihood(residual, factor, variance)


@jax.jit
def _bwd(saved: tuple, g: Array) -> tuple[Array, Array, Array]:
    residual, factor, variance, scaled, chol, u = saved
    sd = jnp.sqrt(variance)
    s = solve_triangular(chol.T, u, lower=False)  # H⁻¹ Pᵀ V⁻¹ r
    alpha = (residual - factor @ s) / variance  # C⁻¹ r
    c_inv_p = cho_solve((chol, True), scaled.T).T / sd[:, None]  # C⁻¹ P = V⁻¹ P H⁻¹
    d_factor = jnp.outer(alpha, factor.T @ alpha) - c_inv_p
    c_inv_diag = 1.0 / variance - jnp.sum(c_inv_p * factor, axis=1) / variance
    d_variance = 0.5 * (alpha**2 - c_inv_diag)
    return -g * alpha, g * d_factor, g * d_variance


log_likelihood.defvjp(_fwd, _bwd)


@jax.jit
def conditional_coordinates(key: Array, residual: Array, factor: Array,
                            variance: Array) -> Array:
    """A draw of ``z`` from (2): ``H⁻¹ Pᵀ V⁻¹ r + R⁻ᵀ ξ``, ``ξ ∼ N(0, I)``.

    Parameters
    ----------
    key : JAX PRNG key, or an array ``(d,)``
        The key of ``ξ``, or ``ξ`` itself (standard normal draws).
    residual, factor, variance :
        As :func:`log_likelihood`.

    Returns
    -------
    array ``(d,)``
    """
    scaled, chol = _capacitance(factor, variance)
    xi = (key if jnp.issubdtype(jnp.asarray(key).dtype, jnp.floating)
          else jax.random.normal(key, (factor.shape[1],), factor.dtype))
    u = solve_triangular(chol, scaled.T @ (residual / jnp.sqrt(variance)), lower=True)
    return solve_triangular(chol.T, u + xi, lower=False)


@jax.jit
def inverse_gaussian(key: Array, mean: Array, shape: Array) -> Array:
    """Draws of ``InverseGaussian(mean, shape)`` (Michael, Schucany & Haas 1976).

    With ``ν ∼ χ²₁`` and ``a = mean ν / (2 shape)``, the smaller root of the transformation is
    ``x = mean / (1 + a + √(a (2 + a)))`` (this form has no cancellation); it is kept with
    probability ``mean / (mean + x)``, else ``mean² / x = mean (1 + a + √(a (2 + a)))``.
    Mean ``mean``, variance ``mean³ / shape``.

    Parameters
    ----------
    key : JAX PRNG key
    mean, shape : arrays (broadcast together)
        Positive.

    Returns
    -------
    array
    """
    mean, shape = jnp.broadcast_arrays(jnp.asarray(mean), jnp.asarray(shape))
    k_nu, k_u = jax.random.split(key)
    nu = jax.random.normal(k_nu, mean.shape, mean.dtype) ** 2
    a = mean * nu / (2.0 * shape)
    big = a > 1.0  # √(a (2 + a)) without overflow
    root = 1.0 + a + jnp.where(big, a * jnp.sqrt(1.0 + 2.0 / jnp.where(big, a, 1.0)),
                               jnp.sqrt(a * (2.0 + a)))
    u = jax.random.uniform(k_u, mean.shape, mean.dtype)
    # x = mean / root is kept with probability mean / (mean + x) = root / (root + 1)
    return jnp.where(u * (root + 1.0) <= root, mean / root, mean * root)


#: Errors below ``FLOOR · b`` in size are taken as ``FLOOR · b`` by :func:`noise_variances`.
FLOOR = 1e-100


@jax.jit
def noise_variances(key: Array, error: Array, scale: Array) -> Array:
    """Draws of the Laplace mixture's variances ``v`` given the errors ``e``, by (5).

    Parameters
    ----------
    key : JAX PRNG key
    error : array ``(k,)``
        ``e = y − Q n`` (sizes below ``FLOOR · b`` count as ``FLOOR · b``).
    scale : array ``(k,)``
        The Laplace scales ``b``.

    Returns
    -------
    array ``(k,)``
    """
    floor = FLOOR * scale  # below it the law of 1/v is its limit as e → 0, λ / χ²₁
    inv = inverse_gaussian(key, 1.0 / (scale * jnp.maximum(jnp.abs(error), floor)),
                           1.0 / scale**2)
    return 1.0 / inv


class ReleaseNormal(dist.Distribution):
    """The answers' law (1): ``N(loc, P Pᵀ + diag v)``, log density (3) with gradient (4).

    Parameters
    ----------
    loc : array ``(k,)``
    factor : array ``(k, d)``
    cov_diag : array ``(k,)``
        The noise variances ``v``.
    """

    arg_constraints = {"loc": constraints.real_vector, "factor": constraints.real,
                       "cov_diag": constraints.positive}
    support = constraints.real_vector
    reparametrized_params = ["loc", "factor", "cov_diag"]

    def __init__(self, loc: Array, factor: Array, cov_diag: Array, *,
                 validate_args: bool | None = None):
        self.loc, self.factor, self.cov_diag = loc, factor, cov_diag
        super().__init__(batch_shape=(), event_shape=jnp.shape(loc)[-1:],
                         validate_args=validate_args)

    def sample(self, key: Array, sample_shape: tuple = ()) -> Array:
        k_z, k_e = jax.random.split(key)
        k, d = self.factor.shape
        z = jax.random.normal(k_z, tuple(sample_shape) + (d,), self.factor.dtype)
        e = jax.random.normal(k_e, tuple(sample_shape) + (k,), self.factor.dtype)
        return self.loc + z @ self.factor.T + e * jnp.sqrt(self.cov_diag)

    def log_prob(self, value: Array) -> Array:
        return log_likelihood(value - self.loc, self.factor, self.cov_diag)

    @property
    def mean(self) -> Array:
        return self.loc
