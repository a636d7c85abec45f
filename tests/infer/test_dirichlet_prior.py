"""The Dirichlet prior on conditional log odds and its concentration from a release.

Checked against exact answers: NumPyro's Dirichlet density times the Jacobian of the additive
logistic map (by automatic differentiation), a one-dimensional integral, the closed-form root
of the moment equation for one block, the conjugate posterior of complete tables, and NumPyro's
goodness-of-fit test of ``sample`` against ``log_prob``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpy.testing import assert_allclose
from numpyro.distributions.gof import auto_goodness_of_fit
from numpyro.infer import MCMC, NUTS
from oracles.enumeration import compositions, laplace_loglik, moments
from scipy import integrate
from scipy.special import gammaln, logsumexp

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
from numpyro_dpgm.infer.bayes import (
    ConditionalDirichlet,
    concentration_from_release,
    conditional_coding,
    run_nuts,
)
from numpyro_dpgm.oracles import junction_tree as jt

CHAIN = MarkovNetwork({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("b", "c")])


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5])
def test_density_is_the_dirichlet_times_the_jacobian(alpha: float) -> None:
    """(1): per row ``(K, s)``, NumPyro's Dirichlet density of ``p(· | s)`` times
    ``|det ∂p_{−r0}/∂β|``, summed over rows."""
    coding = conditional_coding(CHAIN)
    beta = jnp.asarray(np.random.default_rng(0).normal(0.0, 1.5, coding.dim))
    theta = coding.to_theta(beta)
    expected = 0.0
    for logits, rows in zip(coding.block_logits(beta), coding.rows, strict=True):
        assert np.all(np.asarray(logits[:, 0]) == 0.0)  # reference levels 0: r0 is cell 0
        for s in range(rows.shape[0]):

            def free(b: jax.Array) -> jax.Array:  # p(r | s), r ≠ r0, of the free log odds
                return jax.nn.softmax(jnp.concatenate([jnp.zeros(1), b]))[1:]

            b_row = logits[s, 1:]
            p = jnp.exp(theta[rows[s]])
            assert_allclose(p[1:], free(b_row), rtol=1e-12)
            expected += (dist.Dirichlet(jnp.full(rows.shape[1], alpha)).log_prob(p)
                         + jnp.linalg.slogdet(jax.jacfwd(free)(b_row))[1])
    assert_allclose(ConditionalDirichlet(coding, alpha).log_prob(beta), expected, rtol=1e-10)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5])
def test_density_integrates_to_one(alpha: float) -> None:
    """One binary attribute: ``β`` is the log odds of a Beta(α, α) probability."""
    coding = conditional_coding(MarkovNetwork({"a": 2}, [("a",)]))
    prior = ConditionalDirichlet(coding, alpha)
    density = jax.jit(lambda b: jnp.exp(prior.log_prob(jnp.reshape(b, (1,)))))
    mass, err = integrate.quad(lambda b: float(density(b)), -np.inf, np.inf, limit=200)
    assert abs(mass - 1.0) < 1e-8, (mass, err)


@pytest.mark.parametrize("alpha", [0.3, 2.5])
def test_samples_follow_the_density(alpha: float) -> None:
    """NumPyro's goodness-of-fit test (its failure rate) on a one-dimensional prior, and the
    Dirichlet's moments of every conditional of the chain (5 standard errors)."""
    one = ConditionalDirichlet(conditional_coding(MarkovNetwork({"a": 2}, [("a",)])), alpha)
    draws = one.sample(jax.random.key(0), (20_000,))
    gof = auto_goodness_of_fit(np.asarray(draws), np.exp(np.asarray(one.log_prob(draws))))
    assert gof > 2e-5
    coding = conditional_coding(CHAIN)
    prior = ConditionalDirichlet(coding, alpha)
    draws = prior.sample(jax.random.key(1), (20_000,))
    assert np.all(np.abs(np.asarray(draws).mean(0) - prior.mean)
                  < 5 * np.sqrt(np.asarray(prior.variance) / len(draws)))
    assert np.all(np.abs(np.asarray(draws).var(0) / prior.variance - 1) < 0.1)
    p = np.exp(np.asarray(coding.to_theta(draws)))
    for rows in coding.rows:
        k = rows.shape[1]
        var = (1 / k) * (1 - 1 / k) / (k * alpha + 1)
        cells = p[:, rows]
        assert_allclose(cells.sum(-1), 1.0, rtol=1e-12)
        assert np.all(np.abs(cells.mean(0) - 1 / k) < 5 * math.sqrt(var / len(p)))
        assert np.all(np.abs(cells.var(0) / var - 1) < 0.1)


def test_conjugate_posterior_of_complete_tables() -> None:
    """Complete tables ``n`` observed: each conditional's posterior is Dirichlet(α + n_s), so
    the posterior mean of ``p(r | s)`` is ``(α + n_sr) / (kα + m_s)``; NUTS on the prior and the
    multinomial likelihood ``θ · n`` (4 chains × 1,000 draws) within 4 Monte Carlo errors."""
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    coding = conditional_coding(net)
    n = jnp.asarray([30.0, 0.0, 5.0, 2.0, 11.0, 1.0])  # the one block: a joint of 6 cells
    alpha = 0.4

    def model() -> None:
        beta = numpyro.sample("beta", ConditionalDirichlet(coding, alpha))
        theta = numpyro.deterministic("theta", coding.to_theta(beta))
        numpyro.factor("n", jnp.sum(theta * n))

    mcmc = MCMC(NUTS(model), num_warmup=500, num_samples=1000, num_chains=4,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(2))
    p = np.exp(np.asarray(mcmc.get_samples()["theta"]))
    post = alpha + np.asarray(n)
    mean = post / post.sum()
    sd = np.sqrt(mean * (1 - mean) / (post.sum() + 1))
    assert np.all(np.abs(p.mean(0) - mean) < 4 * sd / math.sqrt(4000 / 10))


def test_exact_path_of_a_users_model_with_the_prior_against_enumeration() -> None:
    """A model of your own (one attribute of three levels, 12 records, Laplace noise b = 2,
    the Dirichlet prior with α = 0.5) on ``run_nuts``'s exact path: the counts' posterior
    ``p(n | y) ∝ DirMult(n; N, α) ∏ Laplace(y − n)`` by enumeration (every table), and
    ``E[p | y] = Σ_n p(n | y)(n + α)/(N + 3α)``; means within 0.10 (counts) and 0.012
    (probabilities), as the Normal prior's test of the same path."""
    net = MarkovNetwork({"a": 3}, [("a",)])
    coding = conditional_coding(net)
    total, b, alpha = 12, 2.0, 0.5
    y = np.array([11.0, 0.5, -0.5])

    def model(y):
        phi = numpyro.sample("phi", ConditionalDirichlet(coding, alpha))
        theta = numpyro.deterministic("theta", coding.to_theta(phi))
        numpyro.deterministic("mu", jnp.exp(theta))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total, normalized=True))
        numpyro.sample("y", LaplaceNoise(n, b), obs=y)

    tables = compositions(total, 3)
    log_w = (gammaln(total + 1) - gammaln(tables + 1).sum(-1) + gammaln(3 * alpha)
             - gammaln(total + 3 * alpha) + (gammaln(tables + alpha) - gammaln(alpha)).sum(-1)
             + laplace_loglik(tables, y, b))
    n_mean, _ = moments(tables, log_w)
    mu_mean = np.exp(log_w - logsumexp(log_w)) @ ((tables + alpha) / (total + 3 * alpha))
    mcmc = run_nuts(model, jax.random.key(2), jnp.asarray(y), num_warmup=500,
                    num_samples=4000, num_chains=2)
    assert mcmc.path == "exact"
    s = mcmc.get_samples()
    assert_allclose(np.asarray(s["n"]).mean(0), n_mean, atol=0.10)
    assert_allclose(np.asarray(s["mu"]).mean(0), mu_mean, atol=0.012)
    assert mcmc.convergence.max_r_hat <= 1.01


def test_concentration_is_the_root_of_the_moment_equation() -> None:
    """One block, exact tables: (2) reads ``(α + 1)/(kα + 1) = D`` with ``D = Σ n(n−1) /
    (m(m−1))``, so ``α = (1 − D)/(kD − 1)``."""
    net = MarkovNetwork({"a": 3, "b": 4}, [("a", "b")])
    n = np.array([40, 3, 0, 7, 1, 0, 12, 5, 2, 0, 25, 9], float)
    d = np.sum(n * (n - 1)) / (n.sum() * (n.sum() - 1))
    found = concentration_from_release(conditional_coding(net), n, 0.0)
    assert found.bound is None
    assert_allclose(found.simpson, d, rtol=1e-12)
    assert_allclose(found.concentration, (1 - d) / (12 * d - 1), rtol=1e-10)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 3.0])
def test_concentration_recovers_the_truth_through_the_noise(alpha: float) -> None:
    """Every conditional of the coding's blocks drawn from Dirichlet(α) (a root joint of 500
    cells, 100 conditionals of 5), 10⁵ records, Laplace noise (b = 4): the mean estimate over
    10 releases within 10 % of α (about 2.5 of its standard errors), each within 40 %."""
    net = MarkovNetwork({"a": 5, "b": 10, "c": 10, "d": 5}, [("a", "b", "c"), ("b", "c", "d")])
    coding = conditional_coding(net)
    rng = np.random.default_rng(int(alpha * 10))
    found = []
    for _ in range(10):
        p = np.zeros(net.num_params)
        for rows in coding.rows:  # every conditional, then the joint by the chain rule
            for s in range(rows.shape[0]):
                p[rows[s]] = rng.dirichlet(np.full(rows.shape[1], alpha))
        theta = np.log(np.maximum(p, 1e-300))
        mu = np.asarray(net.flatten(jt.marginals(net, jnp.asarray(theta))))
        counts = np.concatenate([rng.multinomial(100_000, mu[o:o + z] / mu[o:o + z].sum())
                                 for o, z in zip(net.offsets, net.sizes, strict=True)])
        y = counts + rng.laplace(0.0, 4.0, counts.shape)
        found.append(concentration_from_release(coding, y, 2 * 4.0**2).concentration)
    found = np.asarray(found)
    assert abs(found.mean() / alpha - 1) < 0.10, found
    assert np.all(np.abs(found / alpha - 1) < 0.40), found


def test_concentration_at_a_bound_says_so() -> None:
    coding = conditional_coding(MarkovNetwork({"a": 3, "b": 4}, [("a", "b")]))
    one_cell = np.zeros(12)
    one_cell[5] = 1000.0
    with pytest.warns(UserWarning, match="lower bound"):
        assert concentration_from_release(coding, one_cell, 0.0).bound == "lower"
    with pytest.warns(UserWarning, match="upper bound"):
        assert concentration_from_release(coding, np.full(12, 1000.0), 0.0).bound == "upper"


def test_bad_input() -> None:
    coding = conditional_coding(MarkovNetwork({"a": 3, "b": 4}, [("a", "b")]))
    with pytest.raises(ValueError, match="shape"):
        concentration_from_release(coding, np.ones(11), 1.0)
    with pytest.raises(ValueError, match="not finite"):
        concentration_from_release(coding, np.full(12, np.nan), 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        concentration_from_release(coding, np.ones(12) * 50, -1.0)
    with pytest.raises(ValueError, match="cannot inform"):
        concentration_from_release(coding, np.ones(12), 100.0)
    with pytest.raises(TypeError, match="ConditionalCoding"):
        concentration_from_release(MarkovNetwork({"a": 2}, [("a",)]), np.ones(2), 1.0)
    with pytest.raises(TypeError, match="ConditionalCoding"):
        ConditionalDirichlet("coding", 1.0)
