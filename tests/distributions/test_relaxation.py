"""The relaxed CGM's bias at small expected counts, against quadrature of its own density.

``relaxed_cell_mean`` is checked against scipy's adaptive quadrature of ``λⁿ/Γ(n+1)``; the
Poisson-limit claim behind ``relaxation_leak`` against the mean of a binary table under the
library's relaxed ``CollectiveGraphicalModel.log_prob`` (whose exact, integer law has mean
``N·p``), integrated numerically over the table's one free coordinate.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import gammaln

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel
from numpyro_dpgm.distributions.relaxation import (
    RelaxationWarning,
    relaxation_leak,
    relaxed_cell_mean,
    warn_if_leaky,
)

LAMBDAS = [1e-30, 1e-8, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 99.0]


def _quad_mean(lam: float) -> float:
    shift = lam * np.log(lam) - gammaln(lam + 1.0) if lam > 1 else 0.0
    f = lambda n: np.exp(n * np.log(lam) - gammaln(n + 1.0) - shift)  # noqa: E731
    upper = lam + 30 * np.sqrt(lam) + 60
    points = [lam] if lam > 1 else None
    z, z_err = quad(f, 0, upper, limit=500, points=points, epsabs=0, epsrel=1e-12)
    m, m_err = quad(lambda n: n * f(n), 0, upper, limit=500, points=points, epsabs=0,
                    epsrel=1e-12)
    # adaptive quadrature reports its error estimate: assert it is below the 1e-9 the test checks
    assert z_err <= 1e-10 * z and m_err <= 1e-10 * max(m, 1e-300), (z_err, m_err)
    return m / z


def test_relaxed_cell_mean_matches_adaptive_quadrature():
    got = relaxed_cell_mean(np.array(LAMBDAS))
    want = np.array([_quad_mean(lam) for lam in LAMBDAS])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert got[LAMBDAS.index(0.01)] == pytest.approx(0.2205, abs=1e-4)  # the module's figures
    assert got[LAMBDAS.index(1.0)] == pytest.approx(1.2388, abs=1e-4)
    assert relaxed_cell_mean(1e6) == 1e6


@pytest.mark.parametrize("lam", [0.01, 0.1, 1.0, 3.0, 10.0])
def test_poisson_limit_predicts_the_relaxed_cgm_mean(lam):
    """E[n₀] under the relaxed binary table (N = 10⁴, p₀ = λ/N) exceeds the exact mean λ by
    ``m(λ) − λ``: quadrature of the library's own log density, to 1e-4 counts."""
    net = MarkovNetwork({"a": 2}, [("a",)])
    total = 10_000.0
    p0 = lam / total
    dist = CollectiveGraphicalModel(net, jnp.log(jnp.array([p0, 1 - p0])), total, relaxed=True)
    upper = lam + 12 * np.sqrt(lam) + 40
    x, w = np.polynomial.legendre.leggauss(2000)
    n0 = 0.5 * (x + 1) * upper
    log_p = np.asarray(jax.vmap(dist.log_prob)(jnp.stack([n0, total - n0], axis=1)))
    f = w * np.exp(log_p - log_p.max())
    relaxed = float((f * n0).sum() / f.sum())
    assert relaxed - lam == pytest.approx(float(relaxed_cell_mean(lam)) - lam, abs=1e-4)
    leak = relaxation_leak(net, jnp.log(jnp.array([p0, 1 - p0])), total)[("a",)]
    assert leak * total == pytest.approx(relaxed - lam, abs=1e-4)


def test_leak_of_a_uniform_table_and_the_warning():
    net = MarkovNetwork({"a": 100, "b": 100}, [("a", "b")])
    theta = jnp.zeros(net.num_params)
    # 10⁴ cells with 0.1 expected records each: each holds m(0.1) = 0.4025 under the relaxation
    leak = relaxation_leak(net, theta, 1000)[("a", "b")]
    assert leak == pytest.approx(10_000 * (_quad_mean(0.1) - 0.1) / 1000, rel=1e-9)
    with pytest.warns(RelaxationWarning, match=r"about 303% of N = 1000 .* 10000-cell table"):
        assert warn_if_leaky(net, theta, 1000, "variational_em") == pytest.approx(leak)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 100 records a cell: no warning
        assert warn_if_leaky(net, theta, 10 ** 6, "variational_em") < 1e-6


@pytest.mark.parametrize("bad", [0.0, -1.0, np.inf, np.nan])
def test_bad_expected_counts(bad):
    with pytest.raises(ValueError, match="positive and finite"):
        relaxed_cell_mean(np.array([1.0, bad]))
