"""NUTS's start and metric from the mode and curvature of the potential
(:mod:`numpyro_dpgm.infer.bayes.laplace_metric`), checked against closed forms: a conjugate
linear-Gaussian model (mode and inverse Hessian = posterior mean and covariance), a constrained
site (the Jacobian of the unconstrained space), a site held fixed, and a flat direction."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.infer import MCMC, NUTS
from numpyro.infer.hmc_util import _initialize_mass_matrix

from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
from numpyro_dpgm.infer.bayes.laplace_metric import (
    block_potential,
    choose_metric,
    laplace_metric,
    laplace_starts,
    rescaled,
    with_metric,
)
from numpyro_dpgm.infer.bayes.warmup import Retune, bounded_warmup, nuts_state
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


def test_run_nuts_says_which_metric():
    """The collapsed path takes the Laplace metric by default, NumPyro's adaptation when asked;
    the metric is refused on the paths that have none."""
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    y = np.array([150.0, 170, 180, 160, 170, 170])
    ms = [Measurement(("a", "b"), y, Laplace(2.0))]
    model = noisy_marginals_model(net, ms, 1000)
    options = dict(collapsed=True, num_warmup=10, num_samples=10, num_chains=1, check=False)
    mcmc = run_nuts(model, jax.random.key(0), **options)
    assert mcmc.metric == "laplace" and mcmc.laplace.converged
    # with 150 warm-up steps or more, warm-up rescales the metric (two chains: the retuned
    # states stack)
    mcmc = run_nuts(model, jax.random.key(0), collapsed=True, num_warmup=150, num_samples=10,
                    num_chains=2, check=False)
    used = mcmc.last_state.adapt_state.inverse_mass_matrix
    (used,) = used.values()
    assert used.shape[0] == 2
    assert not np.allclose(used[0], mcmc.laplace.inverse_mass_matrix)
    mcmc = run_nuts(model, jax.random.key(0), metric="adapt", **options)
    assert mcmc.metric == "adapt" and mcmc.laplace is None
    with pytest.raises(ValueError, match="the collapsed path's"):
        run_nuts(model, jax.random.key(0), exact=True, collapsed=False, metric="laplace",
                 num_warmup=1, num_samples=1, num_chains=1)


def test_rescaled_keeps_correlations_and_takes_the_draws_variances():
    potential, z0 = block_potential(linear_gaussian, (), {}, {}, jax.random.key(0))
    found = laplace_metric(potential, z0)
    cov = np.asarray(found.inverse_mass_matrix)
    variance = np.diag(cov) * np.array([4.0, 0.5, 100.0])  # the last beyond the bound 16
    new = np.asarray(rescaled(found, variance))
    expected_var = np.diag(cov) * np.array([4.0, 0.5, 16.0])
    np.testing.assert_allclose(np.diag(new), expected_var, rtol=1e-12)
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    np.testing.assert_allclose(new / np.sqrt(np.outer(expected_var, expected_var)), corr,
                               atol=1e-12)


def test_with_metric_matches_numpyros_factors():
    """The replaced metric's square roots are NumPyro's own (``_initialize_mass_matrix``), and
    step-size adaptation restarts from ten times the current step size, as at a window end."""
    inverse = jnp.asarray(S0)
    expected = _initialize_mass_matrix({"x": jnp.zeros(3)}, inverse, True)
    potential = NUTS(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), dense_mass=True)
    state = potential.init(jax.random.key(0), 10, {"x": jnp.zeros(3)})
    new = with_metric(state, inverse).adapt_state
    for got, want in zip((new.inverse_mass_matrix, new.mass_matrix_sqrt,
                          new.mass_matrix_sqrt_inv), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert float(new.ss_state[4]) == pytest.approx(np.log(10 * state.adapt_state.step_size))

    def model():  # a model's NUTS keeps its metric per block of sites: the same structure
        numpyro.sample("x", dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    state = NUTS(model, dense_mass=True).init(jax.random.key(0), 10, None, (), {})
    new = with_metric(state, inverse).adapt_state
    assert jax.tree.structure(new) == jax.tree.structure(state.adapt_state)
    for got, want in zip((new.inverse_mass_matrix, new.mass_matrix_sqrt,
                          new.mass_matrix_sqrt_inv), expected, strict=True):
        np.testing.assert_allclose(got[("x",)], want, rtol=1e-12)


def test_warmup_tracks_the_variance_of_the_steps_it_says():
    """:func:`bounded_warmup`'s running variance over steps 11–40 equals the variance of the
    positions of the same 40 kernel steps replayed one by one; the change applies after step
    40 and the warm-up goes on from it."""

    def model():
        numpyro.sample("x", dist.Normal(jnp.zeros(3), jnp.array([1.0, 2.0, 0.5])))

    seen = []

    def apply(state, variance):
        seen.append(np.asarray(variance))
        return state

    kernel = NUTS(model)
    mcmc = MCMC(kernel, num_warmup=60, num_samples=5, num_chains=1, progress_bar=False)
    retune = Retune(lambda s: nuts_state(s).z, apply, 10, 40)
    done = bounded_warmup(mcmc, jax.random.key(3), (), {}, deadline=float("inf"),
                          retune=retune, chunk=7)
    assert done.steps == (60,) and len(seen) == 1
    replay = NUTS(model)
    state = replay.init(jax.random.split(jax.random.key(3), 1)[0], 60, None, (), {})
    positions = []
    for t in range(1, 41):
        state = replay.sample(state, (), {})
        if t > 10:
            positions.append(np.asarray(state.z["x"]))
    np.testing.assert_allclose(seen[0], np.var(positions, axis=0, ddof=1), rtol=1e-10)
