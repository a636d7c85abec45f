r"""Laplace noise as a scale mixture of normals, and the draws of its variances.

``e ∼ Laplace(0, b)`` is ``e ∣ v ∼ N(0, v)`` with ``v ∼ Exp(1/(2b²))``; given ``e``
(Park & Casella 2008)

.. math:: 1/v \mid e \sim \mathrm{InverseGaussian}\big(1/(b\,|e|),\ 1/b^2\big),          \tag{1}

drawn by the transformation with multiple roots of Michael, Schucany & Haas (1976). The
collapsed sampler (:mod:`.collapse`) draws ``v`` this way, so that the release given ``θ, v``
is Gaussian.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["FLOOR", "inverse_gaussian", "noise_variances"]

Array = Any


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
    """Draws of the Laplace mixture's variances ``v`` given the errors ``e``, by (1).

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
