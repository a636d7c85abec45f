"""Discrete observation models: pmfs against closed forms and brute-force sums, samplers against
the pmfs, and against what OpenDP's integer release actually draws."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from numpyro_dpgm.distributions.noise import (
    DiscreteGaussianNoise,
    DiscreteLaplaceNoise,
    GaussianNoise,
    LaplaceNoise,
    integer,
    noise_model,
)
from numpyro_dpgm.measurements import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace
from numpyro_dpgm.privacy import release_tables

GRID = np.arange(-600, 601, dtype=float)  # far beyond the mass of every scale used below


def _pmf(d, loc_index: int = 0) -> np.ndarray:
    """The univariate pmf of cell ``loc_index`` of ``d`` on GRID."""
    return np.exp(np.asarray(d.base_dist.log_prob(GRID[:, None]))[:, loc_index])


def _brute(weight, loc: float) -> np.ndarray:
    w = np.array([weight(k - loc) for k in GRID])
    return w / w.sum()


LOCS = (0.0, 3.0, 0.3, -2.75, 0.5)


@pytest.mark.parametrize("scale", [0.3, 1.0, 7.5])
def test_discrete_laplace_pmf(scale):
    d = DiscreteLaplaceNoise(jnp.array(LOCS), scale)
    for j, loc in enumerate(LOCS):
        p = _pmf(d, j)
        np.testing.assert_allclose(p.sum(), 1.0, atol=1e-13)
        np.testing.assert_allclose(p, _brute(lambda r: math.exp(-abs(r) / scale), loc),
                                   rtol=1e-10, atol=1e-300)
        if loc == round(loc):  # closed form of the discrete Laplace at an integer centre
            q = math.exp(-1 / scale)
            closed = (1 - q) / (1 + q) * q ** np.abs(GRID - loc)
            np.testing.assert_allclose(p, closed, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("sigma", [0.25, 0.999, 1.0, 1.7, 12.0])
def test_discrete_gaussian_pmf(sigma):
    d = DiscreteGaussianNoise(jnp.array(LOCS), sigma)
    for j, loc in enumerate(LOCS):
        p = _pmf(d, j)
        np.testing.assert_allclose(p.sum(), 1.0, atol=1e-13)
        np.testing.assert_allclose(p, _brute(lambda r: math.exp(-r * r / (2 * sigma**2)), loc),
                                   rtol=1e-10, atol=1e-300)


def test_event_shape_and_broadcasting():
    loc = np.array([[0.0, 1.5, 3.0], [2.0, -1.0, 0.25]])
    scale = np.array([1.0, 2.0, 0.5])
    y = np.array([1.0, 2.0, 3.0])
    weights = {DiscreteLaplaceNoise: lambda r, s: math.exp(-abs(r) / s),
               DiscreteGaussianNoise: lambda r, s: math.exp(-r * r / (2 * s * s))}
    for cls, w in weights.items():
        d = cls(jnp.asarray(loc), jnp.asarray(scale))
        assert d.event_shape == (3,) and d.batch_shape == (2,)
        expected = [sum(math.log(_brute(lambda r, s=scale[j], w=w: w(r, s), loc[i, j])[
            np.searchsorted(GRID, y[j])]) for j in range(3)) for i in range(2)]
        np.testing.assert_allclose(d.log_prob(jnp.asarray(y)), expected, rtol=1e-10)
        assert d.sample(jax.random.key(0), (4,)).shape == (4, 2, 3)


@pytest.mark.parametrize("cls,scale", [(DiscreteLaplaceNoise, 2.0), (DiscreteGaussianNoise, 1.6),
                                       (DiscreteGaussianNoise, 0.6)])
def test_sampler_matches_pmf(cls, scale):
    loc = jnp.array([0.0, 5.3])
    d = cls(loc, scale)
    x = np.asarray(d.sample(jax.random.key(1), (40_000,)))
    assert np.all(integer(x))
    for j in range(2):
        values, counts = np.unique(x[:, j], return_counts=True)
        p = _pmf(d, j)
        expected = p[np.searchsorted(GRID, values)]
        # total variation between the empirical and exact pmfs; with 40,000 draws its
        # sampling fluctuation is below 0.02 for these scales (≈ 10 standard errors)
        tv = 0.5 * (np.abs(counts / x.shape[0] - expected).sum() + (1 - expected.sum()))
        assert tv < 0.02, (j, tv)


def test_support_is_the_integers():
    d = DiscreteLaplaceNoise(jnp.array([0.0, 1.0]), 1.0, validate_args=True)
    assert float(d.log_prob(jnp.array([2.0, -3.0]))) < 0
    with pytest.warns(UserWarning, match="Out-of-support"):
        d.log_prob(jnp.array([0.5, 1.0]))
    assert not bool(integer(jnp.inf)) and bool(integer(-4.0)) and not bool(integer(1.25))
    with pytest.raises(ValueError, match="vector loc"):
        DiscreteGaussianNoise(1.0, 1.0)


def test_noise_model_dispatch():
    loc = jnp.zeros(3)
    assert isinstance(noise_model(Laplace(2.0), loc), LaplaceNoise)
    assert isinstance(noise_model(Gaussian(2.0), loc), GaussianNoise)
    assert isinstance(noise_model(DiscreteLaplace(2.0), loc), DiscreteLaplaceNoise)
    d = noise_model(DiscreteGaussian(3.0), loc)
    assert isinstance(d, DiscreteGaussianNoise) and float(d.scale[0]) == 3.0
    with pytest.raises(TypeError, match="NoiseSpec"):
        noise_model(2.0, loc)


@pytest.mark.parametrize("mechanism,budget", [("discrete_laplace", 0.5),
                                              ("discrete_gaussian", None)])
def test_model_matches_opendp_release(mechanism, budget):
    """The noise OpenDP adds in an integer release follows the model's pmf.

    OpenDP cannot be seeded, so this is a chi-square goodness-of-fit test at level 1e-6.
    """
    from numpyro_dpgm.privacy import ZCDP

    cells = 20_000
    table = {("a",): np.full(cells, 7.0)}
    spend = budget if budget is not None else ZCDP(0.1)
    (m,) = release_tables(table, spend, mechanism=mechanism)
    assert np.all(m.values == np.rint(m.values))
    d = noise_model(m.noise, jnp.array([7.0]))
    p = _pmf(d)
    # bins: every value with expected count ≥ 20, tails pooled
    expected = p * cells
    keep = expected >= 20
    observed = np.array([np.sum(m.values == v) for v in GRID[keep]])
    obs = np.append(observed, cells - observed.sum())
    exp = np.append(expected[keep], cells - expected[keep].sum())
    chi2 = float(np.sum((obs - exp) ** 2 / exp))
    assert chi2 < stats.chi2.ppf(1 - 1e-6, obs.size - 1), chi2


def test_gradient_in_a_real_loc():
    """The relaxed CGM differentiates log p(y | loc) in loc: autodiff equals finite differences
    away from the integers (where the normaliser has its kinks)."""
    y = jnp.array([3.0, -1.0, 7.0])
    loc = jnp.array([2.3, 0.6, 7.45])
    for cls, scale in ((DiscreteLaplaceNoise, 1.7), (DiscreteGaussianNoise, 0.8),
                       (DiscreteGaussianNoise, 2.5)):
        def f(x, cls=cls, scale=scale):
            return cls(x, scale).log_prob(y)

        grad = np.asarray(jax.grad(f)(loc))
        h = 1e-6
        fd = [(float(f(loc.at[i].add(h))) - float(f(loc.at[i].add(-h)))) / (2 * h)
              for i in range(3)]
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
