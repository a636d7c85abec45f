"""Warm-up in chunks within a time limit (:func:`bounded_warmup`, ``run_nuts(time_limit=…)``).

* The chunks make the same warm-up as NumPyro's one loop: the adapted step size, mass matrix
  and position after ``num_warmup`` steps equal ``MCMC.warmup``'s from the same key.
* A deadline stops warm-up early, keeps the adapted state, and ``run_nuts`` says so.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from numpyro_dpgm.infer.bayes import ConvergenceWarning, run_nuts
from numpyro_dpgm.infer.bayes.nuts import MIN_FIRST_DRAWS
from numpyro_dpgm.infer.bayes.warmup import _settled, bounded_warmup


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 0.5, 30))


def test_chunks_make_the_same_warmup_as_one_loop():
    key = jax.random.key(3)
    one = MCMC(NUTS(model), num_warmup=120, num_samples=10, progress_bar=False)
    one.warmup(jax.random.split(key, 1)[0], Y)
    chunked = MCMC(NUTS(model), num_warmup=120, num_samples=10, progress_bar=False)
    warm = bounded_warmup(chunked, key, (Y,), {}, deadline=float("inf"), chunk=25)
    assert warm.steps == (120,)
    assert warm.step_seconds > 0 and warm.compile_seconds >= 0
    a, b = one.post_warmup_state, chunked.post_warmup_state
    np.testing.assert_allclose(a.adapt_state.step_size, b.adapt_state.step_size, rtol=1e-10)
    np.testing.assert_allclose(a.adapt_state.inverse_mass_matrix[("mu", "sigma")],
                               b.adapt_state.inverse_mass_matrix[("mu", "sigma")], rtol=1e-10)
    for site in ("mu", "sigma"):
        np.testing.assert_allclose(a.z[site], b.z[site], rtol=1e-10)


def test_a_deadline_stops_warmup_and_keeps_the_adapted_state():
    mcmc = MCMC(NUTS(model), num_warmup=10_000, num_samples=10, num_chains=2,
                chain_method="sequential", progress_bar=False)
    seen = []
    warm = bounded_warmup(mcmc, jax.random.key(0), (Y,), {}, deadline=0.0, chunk=25,
                          callback=lambda c, done, total, left: seen.append((c, done)))
    # past the deadline every chain makes one step (one compiled call of one step each)
    assert warm.steps == (1, 1) and seen == [(0, 1), (1, 1)]
    mcmc.run(jax.random.key(1), Y)
    assert mcmc.get_samples()["mu"].shape == (20,)


def test_setup_is_not_charged_to_the_deadline_up_to_the_limit():
    """With ``limit``, the first chain's set-up (init and the compiling first call) moves the
    deadline later: a share of 0.4 s of stepping gives every chain many steps, however long
    the compilation took, and warm-up ends by the limit; with the limit at the deadline it is
    the deadline as before."""
    import time

    def fresh(y):  # a model of its own: its programs compile in this test
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Normal(mu, 0.5), obs=y)

    mcmc = MCMC(NUTS(fresh), num_warmup=100_000, num_samples=10, num_chains=2,
                chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    warm = bounded_warmup(mcmc, jax.random.key(0), (Y,), {}, deadline=start + 0.4,
                          chunk=25, limit=start + 120.0)
    assert min(warm.steps) > 25 and time.perf_counter() < start + 120.0
    mcmc = MCMC(NUTS(fresh), num_warmup=100_000, num_samples=10, num_chains=2,
                chain_method="sequential", progress_bar=False)
    warm = bounded_warmup(mcmc, jax.random.key(0), (Y,), {}, deadline=0.0, limit=0.0)
    assert warm.steps == (1, 1)


def test_a_cut_warmup_keeps_the_averaged_step_size_and_stops_adapting():
    """Cut after 40 of 500 steps, a chain keeps ``exp(x̄)``, the dual-averaging mean that
    NumPyro itself keeps at a window's end, not the last iterate ``exp(x_t)``; its position is
    unchanged, and the steps after it are draws of one kernel: the step size and mass matrix
    stay as they are (NumPyro's kernel adapts while its step counter is below the warm-up
    length; the counter is moved to its end)."""
    kernel = NUTS(model)
    state = kernel.init(jax.random.key(5), 500, None, (Y,), {})
    step = jax.jit(lambda s: kernel.sample(s, (Y,), {}))  # one program for every step below
    for _ in range(40):
        state = step(state)
    ss = state.adapt_state.ss_state
    assert not np.isclose(float(jnp.exp(ss[1])), float(state.adapt_state.step_size))
    settled = _settled(state, 500)
    np.testing.assert_allclose(settled.adapt_state.step_size, np.exp(ss[1]), rtol=1e-14)
    np.testing.assert_array_equal(settled.z["mu"], state.z["mu"])
    mass = settled.adapt_state.inverse_mass_matrix[("mu", "sigma")]
    np.testing.assert_array_equal(mass, state.adapt_state.inverse_mass_matrix[("mu", "sigma")])
    drawn, unsettled = settled, state
    for _ in range(30):
        drawn, unsettled = step(drawn), step(unsettled)
        assert float(drawn.adapt_state.step_size) == float(settled.adapt_state.step_size)
    np.testing.assert_array_equal(drawn.adapt_state.inverse_mass_matrix[("mu", "sigma")], mass)
    # without the counter moved the kernel would have gone on adapting
    assert float(unsettled.adapt_state.step_size) != float(state.adapt_state.step_size)


def test_run_nuts_time_limit_bounds_warmup_and_says_so():
    # ten million steps: this model's steps take about 17 µs once compiled, and warm-up's
    # share of the limit is one second, so a hundred thousand were nearly done in it
    with pytest.warns(ConvergenceWarning, match="warm-up stopped after"):
        mcmc = run_nuts(model, jax.random.key(0), Y, num_warmup=10_000_000, num_samples=50,
                        num_chains=1, time_limit=2.0, check=False)
    assert mcmc.warmup_steps[0] < 10_000_000
    assert mcmc.get_samples()["mu"].shape[0] >= MIN_FIRST_DRAWS
    # the draws after the cut are draws of one kernel: one step size throughout
    assert np.unique(np.asarray(mcmc.get_extra_fields()["adapt_state.step_size"])).size == 1
