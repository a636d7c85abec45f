"""Noise back ends of a release: OpenDP's vetted samplers and a seeded JAX sampler.

Noise back ends (``sampler=``):

* ``"opendp"`` (default, for real releases): OpenDP's vetted samplers. ``make_laplace`` and
  ``make_gaussian`` on ``Vec<i64>`` draw the discrete Laplace and the discrete Gaussian exactly
  (Canonne, Kamath & Steinke 2020); on ``Vec<f64>`` they release the continuous mechanisms by
  rounding the input to a fine grid (granularity ``2^k``) and adding exactly sampled discrete
  noise on that grid, which avoids the floating-point weaknesses of textbook samplers
  (Mironov 2012).
  OpenDP draws from the operating system's cryptographic random source and cannot be seeded.
  Its constructors require the ``"contrib"`` feature flag, which is enabled only while the
  measurement is built (and switched off again if it was off). OpenDP's own privacy map is
  evaluated for every release and must agree with the closed form that the ledger is charged
  with (:func:`~numpyro_dpgm.privacy.sensitivity.calibrate`).
* ``"jax"``: a JAX-key-seeded sampler **for simulation studies only** (reproducible noise for
  experiments and tests); it uses floating-point samplers that are not safe for real releases
  (:func:`simulate_noise`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..distributions.noise import discrete_gaussian_draw, discrete_laplace_draw
from ..measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    NoiseSpec,
)
from .sensitivity import Sensitivity

__all__ = [
    "simulate_noise",
]



# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
@contextmanager
def opendp_contrib() -> Iterator[Any]:
    """``opendp.prelude`` with the "contrib" feature on (restored afterwards)."""
    try:
        import opendp.prelude as dp
        from opendp import mod as dp_mod
    except ImportError as err:  # pragma: no cover - opendp is a hard dependency
        raise ImportError(
            "sampler='opendp' needs the opendp package (pip install 'opendp>=0.12,<1')"
        ) from err
    features = getattr(dp_mod, "GLOBAL_FEATURES", None)
    was_on = features is not None and "contrib" in features
    dp.enable_features("contrib")
    try:
        yield dp
    finally:
        if features is not None and not was_on:
            dp.disable_features("contrib")


def opendp_measurement(spec: NoiseSpec, sensitivity: Sensitivity) -> tuple[Any, float]:
    """OpenDP measurement on a vector of all cells, and its privacy map at the sensitivity.

    The map is ε (MaxDivergence) for the Laplace variants and ρ (ZeroConcentratedDivergence)
    for the Gaussian variants.
    """
    with opendp_contrib() as dp:
        if isinstance(spec, Laplace | Gaussian):
            try:
                atom = dp.atom_domain(T="f64", nan=False)
            except TypeError:  # OpenDP < 0.13: float atoms exclude NaN by default
                atom = dp.atom_domain(T="f64")
            domain = dp.vector_domain(atom)
        else:
            domain = dp.vector_domain(dp.atom_domain(T="i64"))
        if isinstance(spec, Laplace):
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="f64"), scale=spec.scale)
            d_in: float | int = float(sensitivity.l1)
        elif isinstance(spec, DiscreteLaplace):
            # integer data take an integer L1 distance (the person bound is an integer here)
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=spec.scale)
            d_in = int(round(sensitivity.l1))
        else:
            meas = dp.m.make_gaussian(domain, dp.l2_distance(T="f64"), scale=spec.sigma)
            d_in = float(sensitivity.l2)
        return meas, float(meas.map(d_in))


def opendp_draw(meas: Any, spec: NoiseSpec, values: np.ndarray) -> np.ndarray:
    if isinstance(spec, DiscreteLaplace | DiscreteGaussian):
        out = meas(np.rint(values).astype(np.int64).tolist())
    else:
        out = meas(values.astype(np.float64).tolist())
    return np.asarray(out, dtype=np.float64)


def simulate_noise(key: Any, noise: NoiseSpec, shape: int | tuple[int, ...]) -> jax.Array:
    """Draw noise of the distribution ``noise`` with JAX: **for simulation studies only**.

    Reproducible from ``key``, jit-friendly and fast, but built on floating-point samplers
    that are not protected against the attacks vetted samplers defend against; real releases
    use ``sampler="opendp"`` of :func:`release`.

    Parameters
    ----------
    key : jax PRNG key (or an int seed)
    noise : NoiseSpec
        ``Laplace(b)``: ``b·Lap(0, 1)``; ``Gaussian(σ)``: ``σ·N(0, 1)``;
        ``DiscreteLaplace(b)``: ``P(z) ∝ e^{−|z|/b}``, a side then a geometric distance;
        ``DiscreteGaussian(σ)``: rejection sampling from the discrete Laplace (Canonne, Kamath &
        Steinke 2020, Alg. 3), ``P(z) ∝ e^{−z²/(2σ²)}``; the samplers of the observation models
        :class:`~numpyro_dpgm.distributions.DiscreteLaplaceNoise` and
        :class:`~numpyro_dpgm.distributions.DiscreteGaussianNoise`, at ``loc = 0``.
    shape : int or tuple of int
    """
    key = jax.random.key(key) if isinstance(key, int | np.integer) else key
    shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if isinstance(noise, Laplace):
        return noise.scale * jax.random.laplace(key, shape)
    if isinstance(noise, Gaussian):
        return noise.sigma * jax.random.normal(key, shape)
    zero = jnp.zeros((), dtype=jnp.result_type(float))
    if isinstance(noise, DiscreteLaplace):
        return discrete_laplace_draw(key, zero, noise.scale, shape).astype(int)
    if isinstance(noise, DiscreteGaussian):
        return discrete_gaussian_draw(key, zero, noise.sigma, shape).astype(int)
    raise TypeError(f"noise must be a NoiseSpec, got {type(noise).__name__}")


