"""NUTS's start and metric from the mode and curvature of the potential
(:mod:`numpyro_dpgm.infer.bayes.laplace_metric`), checked against closed forms: a conjugate
linear-Gaussian model (mode and inverse Hessian = posterior mean and covariance), a constrained
site (the Jacobian of the unconstrained space), a site held fixed, and a flat direction."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints

from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
from numpyro_dpgm.infer.bayes.laplace_metric import (
    block_potential,
    choose_metric,
    laplace_metric,
    laplace_starts,
)
from numpyro_dpgm.infer.bayes.nuts import WARMUP_STEPS, WARMUP_STEPS_FIXED_METRIC
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.network import MarkovNetwork

numpyro.enable_x64()

M0 = np.array([0.5, -1.0, 2.0])
S0 = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.2], [0.0, 0.2, 3.0]])
A = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, -1.0], [2.0, 0.0, 1.0], [0.0, 0.5, 0.5]])
R = np.diag([0.5, 1.0, 0.2, 2.0])
Y = np.array([1.0, -0.5, 3.0, 0.7])


def linear_gaussian(v=None):
    x = numpyro.sample("x", dist.MultivariateNormal(M0, S0))
    noise = numpyro.sample("v", dist.Exponential(1.0).expand([4]).to_event(1)) if v else None
    cov = R if noise is None else R * 0 + jnp.diag(noise)
    numpyro.sample("y", dist.MultivariateNormal(jnp.asarray(A) @ x, cov), obs=Y)


def posterior(noise_cov):
    precision = np.linalg.inv(S0) + A.T @ np.linalg.inv(noise_cov) @ A
    cov = np.linalg.inv(precision)
    return cov @ (np.linalg.solve(S0, M0) + A.T @ np.linalg.solve(noise_cov, Y)), cov


def test_conjugate_gaussian_mode_and_covariance():
    potential, z0 = block_potential(linear_gaussian, (), {}, {}, jax.random.key(0))
    found = laplace_metric(potential, z0)
    mean, cov = posterior(R)
    assert found.converged  # the mode to L-BFGS's tolerance; the curvature exact (quadratic)
    np.testing.assert_allclose(found.mode["x"], mean, atol=1e-5)
    np.testing.assert_allclose(found.inverse_mass_matrix, cov, atol=1e-8)


def test_a_search_stopped_early_is_finished_by_newton_steps(monkeypatch):
    """L-BFGS cut after one iteration (as a stalled line search ends): the Newton steps with
    the curvature at its point land on the mode, exactly on a quadratic potential, and the
    decrement says the point is stationary; with no step allowed, the decrement says it is
    not."""
    from numpyro_dpgm.infer.bayes import laplace_metric as lm

    potential, z0 = block_potential(linear_gaussian, (), {}, {}, jax.random.key(0))
    found = laplace_metric(potential, z0, max_iterations=1)
    mean, _ = posterior(R)
    assert found.iterations == 1 and found.converged and found.decrement < 1e-12
    np.testing.assert_allclose(found.mode["x"], mean, atol=1e-8)
    monkeypatch.setattr(lm, "NEWTON_STEPS", 0)
    stopped = laplace_metric(potential, z0, max_iterations=1)
    assert not stopped.converged and stopped.decrement > lm.DECREMENT_TOLERANCE
    assert np.abs(np.asarray(stopped.mode["x"]) - mean).max() > 1e-3


def test_fixed_sites_are_conditioned_on():
    """The Gibbs sites held at given values: the metric is the posterior of ``x`` given them."""
    noise = np.array([0.3, 0.8, 1.5, 0.1])
    potential, z0 = block_potential(linear_gaussian, (), {"v": True},
                                    {"v": jnp.asarray(noise)}, jax.random.key(0))
    assert set(z0) == {"x"}
    found = laplace_metric(potential, z0)
    mean, cov = posterior(np.diag(noise))
    np.testing.assert_allclose(found.mode["x"], mean, atol=1e-5)
    np.testing.assert_allclose(found.inverse_mass_matrix, cov, atol=1e-8)


def test_constrained_site_in_the_unconstrained_space():
    """``s ∼ Gamma(a, b)`` alone: in ``u = log s`` the potential is ``b e^u − a u`` (the
    Jacobian adds ``u``), mode ``log(a/b)``, curvature ``a``."""
    a, b = 3.0, 2.0

    def model():
        numpyro.sample("s", dist.Gamma(a, b))

    potential, z0 = block_potential(model, (), {}, {}, jax.random.key(1))
    found = laplace_metric(potential, z0)
    np.testing.assert_allclose(found.mode["s"], np.log(a / b), atol=1e-5)
    np.testing.assert_allclose(found.inverse_mass_matrix, [[1 / a]], rtol=1e-4)


def flat():
    numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.sample("z", dist.ImproperUniform(constraints.real, (), ()))


def test_no_strict_mode_falls_back_or_raises():
    potential, z0 = block_potential(flat, (), {}, {}, jax.random.key(0))
    with pytest.raises(ValueError, match="not positive definite"):
        laplace_metric(potential, z0)
    args = (flat, (), {}, {}, numpyro.infer.init_to_median, jax.random.key(0), 2, 0.5, False)
    with pytest.warns(UserWarning, match="adapts its mass matrix"):
        chosen = choose_metric(None, *args)
    assert chosen.name == "adapt" and chosen.starts is None
    assert chosen.nuts_options == {"dense_mass": False}
    with pytest.raises(ValueError, match="not positive definite"):
        choose_metric("laplace", *args)
    with pytest.raises(ValueError, match="metric must be one of"):
        choose_metric("dense", *args)


def test_starts_are_draws_of_the_normal_approximation():
    potential, z0 = block_potential(linear_gaussian, (), {}, {}, jax.random.key(0))
    found = laplace_metric(potential, z0)
    at_mode = laplace_starts(found, jax.random.key(0), 3, spread=0.0)
    assert at_mode["x"].shape == (3, 3)
    np.testing.assert_allclose(at_mode["x"], np.broadcast_to(found.mode["x"], (3, 3)))
    draws = laplace_starts(found, jax.random.key(1), 20_000)["x"]
    mean, cov = posterior(R)
    np.testing.assert_allclose(np.mean(draws, 0), mean, atol=0.05)
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.05)
    assert laplace_starts(found, jax.random.key(1), 1)["x"].shape == (3,)


def test_run_nuts_says_which_metric_and_warms_up_by_it():
    """The collapsed path takes the pilot map by default (its pilot run the Laplace metric),
    the Laplace metric or NumPyro's adaptation when asked; the metric is refused on the paths
    that have none. Warm-up that adapts only the step size (the Laplace metric, the pilot map)
    takes fewer steps by default than NumPyro's windowed adaptation of the mass matrix; a given
    ``num_warmup`` is kept."""
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    y = np.array([150.0, 170, 180, 160, 170, 170])
    ms = [Measurement(("a", "b"), y, Laplace(2.0))]
    model = noisy_marginals_model(net, ms, 1000)
    options = dict(collapsed=True, num_samples=10, num_chains=1, check=False)
    began = time.perf_counter()
    mcmc = run_nuts(model, jax.random.key(0), **options)
    assert mcmc.metric == "pilot" and mcmc.pilot.metric == "laplace"
    assert mcmc.pilot.laplace is mcmc.laplace
    assert mcmc.num_warmup == WARMUP_STEPS_FIXED_METRIC
    mcmc = run_nuts(model, jax.random.key(0), metric="laplace", **options)
    assert mcmc.metric == "laplace" and mcmc.laplace.converged
    assert mcmc.num_warmup == WARMUP_STEPS_FIXED_METRIC
    assert 0 < mcmc.laplace.seconds < time.perf_counter() - began  # set-up counted, once
    used = mcmc.last_state.adapt_state.inverse_mass_matrix  # kept through warm-up
    np.testing.assert_allclose(next(iter(used.values())), mcmc.laplace.inverse_mass_matrix)
    mcmc = run_nuts(model, jax.random.key(0), metric="adapt", **options)
    assert mcmc.metric == "adapt" and mcmc.laplace is None
    assert mcmc.num_warmup == WARMUP_STEPS > WARMUP_STEPS_FIXED_METRIC
    assert run_nuts(model, jax.random.key(0), num_warmup=7, **options).num_warmup == 7
    with pytest.raises(ValueError, match="the collapsed path's"):
        run_nuts(model, jax.random.key(0), exact=True, collapsed=False, metric="laplace",
                 num_warmup=1, num_samples=1, num_chains=1)
