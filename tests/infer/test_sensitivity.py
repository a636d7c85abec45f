"""Prior sensitivity in one call (:func:`prior_sensitivity`, power-scaling).

* The log prior and log likelihood per draw equal their direct sums (a user's CGM model).
* A conjugate Normal model: a prior far tighter than the data is flagged as prior-sensitive; a
  vague one is not, and the likelihood is what moves the posterior.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
from numpyro_dpgm.infer.sensitivity import log_prior_likelihood, prior_sensitivity

NET = MarkovNetwork({"a": 3}, [("a",)])


def cgm_model(y):
    phi = numpyro.sample("phi", dist.Normal(0.0, 1.5).expand([2]).to_event(1))
    theta = jnp.concatenate([jnp.zeros(1), phi])
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, total_count=12))
    numpyro.sample("y", LaplaceNoise(n, 2.0), obs=y)


def test_log_prior_and_likelihood_are_the_direct_sums():
    y = jnp.array([11.0, 0.5, -0.5])
    phi = jnp.array([[0.3, -1.2], [-2.0, 0.4]])
    n = jnp.array([[10.0, 1.0, 1.0], [12.0, 0.0, 0.0]])
    prior, lik = log_prior_likelihood(cgm_model, {"phi": phi, "n": n}, (y,))
    for i in range(2):
        theta = jnp.concatenate([jnp.zeros(1), phi[i]])
        want_prior = dist.Normal(0.0, 1.5).log_prob(phi[i]).sum()
        want_lik = (CollectiveGraphicalModel(NET, theta, 12).log_prob(n[i])
                    + LaplaceNoise(n[i], 2.0).log_prob(y))
        np.testing.assert_allclose(prior[i], want_prior, rtol=1e-12)
        np.testing.assert_allclose(lik[i], want_lik, rtol=1e-12)


def normal_model(y, scale):
    mu = numpyro.sample("mu", dist.Normal(0.0, scale))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(("scale", "flagged"), [(0.05, True), (100.0, False)])
def test_a_tight_prior_is_flagged_and_a_vague_one_is_not(scale, flagged):
    y = 3.0 + jnp.asarray(np.random.default_rng(0).normal(size=10))
    mcmc = MCMC(NUTS(normal_model), num_warmup=500, num_samples=2000, num_chains=2,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), y, scale)
    table = prior_sensitivity(mcmc)
    row = table.loc["mu"]
    assert (row["prior"] >= 0.05) == flagged
    assert row["likelihood"] >= 0.05  # the data move mu in both
    assert ("prior" in row["diagnosis"]) == flagged
