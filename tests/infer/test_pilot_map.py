"""The sinh-arcsinh map of :mod:`numpyro_dpgm.infer.bayes.pilot_map`, checked exactly: its
inverse and log-Jacobian against autodiff, the mapped model's potential against the model's own
plus the map's Jacobian, the quantile fit against a known map; and ``run_nuts(metric="pilot")``
against the Laplace metric's run on the same collapsed posterior (a second sampler of one
target, compared within Monte-Carlo error)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.flatten_util import ravel_pytree
from numpyro.diagnostics import effective_sample_size
from numpyro.infer.util import potential_energy
from scipy.stats import norm

from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
from numpyro_dpgm.infer.bayes import run_nuts
from numpyro_dpgm.infer.bayes.pilot_map import (
    MAPPED_SITE,
    PROBABILITIES,
    SinhArcsinh,
    fit_sinh_arcsinh,
    map_forward,
    map_inverse,
    sinh_arcsinh_map,
)
from numpyro_dpgm.network import MarkovNetwork

numpyro.enable_x64()


def _a_map(d: int, seed: int = 0) -> SinhArcsinh:
    rng = np.random.default_rng(seed)
    chol = np.tril(rng.normal(size=(d, d)) * 0.3) + np.diag(rng.uniform(0.5, 2.0, d))
    return SinhArcsinh(jnp.asarray(rng.normal(size=d)), jnp.asarray(chol),
                       jnp.asarray(rng.normal(size=d) * 0.5),
                       jnp.asarray(rng.uniform(-0.5, 0.5, d)),
                       jnp.asarray(rng.uniform(-1, 1, d)), jnp.asarray(rng.uniform(-0.5, 0.5, d)))


def test_inverse_and_log_jacobian_are_exact():
    sas = _a_map(4)
    u = jnp.asarray(np.random.default_rng(1).normal(size=4) * 2)
    z, log_det = map_forward(sas, u)
    np.testing.assert_allclose(map_inverse(sas, z), u, atol=1e-10)
    jacobian = jax.jacfwd(lambda x: map_forward(sas, x)[0])(u)
    np.testing.assert_allclose(log_det, np.linalg.slogdet(np.asarray(jacobian))[1], atol=1e-10)


def _whitened_quantile(sas: SinhArcsinh, p: float) -> np.ndarray:
    t = norm.ppf(p)
    return np.asarray(sas.shift + jnp.exp(sas.log_scale)
                      * jnp.sinh(jnp.exp(sas.log_tail) * jnp.arcsinh(t) - sas.skew))


def test_fit_recovers_a_known_maps_quantiles():
    sas = _a_map(2, seed=3)
    u = jax.random.normal(jax.random.key(0), (40_000, 2))
    draws = jax.vmap(lambda x: map_forward(sas, x)[0])(u)
    fitted = fit_sinh_arcsinh(draws, sas.loc, sas.chol)
    for p in (0.05, 0.25, 0.5, 0.75, 0.95):  # sampling error of a quantile: about 0.01-0.02
        np.testing.assert_allclose(_whitened_quantile(fitted, p), _whitened_quantile(sas, p),
                                   atol=0.05)


def test_fit_rejects_too_few_draws():
    with pytest.raises(ValueError, match=r"\(S, D\)"):
        fit_sinh_arcsinh(np.zeros((len(PROBABILITIES) - 1, 2)), np.zeros(2), np.eye(2))


def _model():
    scale = numpyro.sample("scale", dist.HalfNormal(2.0))
    numpyro.sample("x", dist.Normal(1.0, scale).expand([3]).to_event(1))


def test_mapped_potential_is_the_models_plus_the_maps_jacobian():
    mode = {"scale": jnp.zeros(()), "x": jnp.zeros(3)}
    sas = _a_map(4, seed=5)
    u = jnp.asarray(np.random.default_rng(2).normal(size=4))
    mapped = potential_energy(sinh_arcsinh_map(_model, sas, mode), (), {}, {MAPPED_SITE: u})
    z, log_det = map_forward(sas, u)
    _, unravel = ravel_pytree(mode)
    plain = potential_energy(_model, (), {}, unravel(z))
    np.testing.assert_allclose(mapped, plain - log_det, atol=1e-10)


def test_the_map_needs_as_many_coordinates_as_the_sites():
    with pytest.raises(ValueError, match="3 coordinates, the sites 4"):
        sinh_arcsinh_map(_model, _a_map(3), {"scale": jnp.zeros(()), "x": jnp.zeros(3)})


NET = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])


def _release_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([6]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, 1000))
    numpyro.sample("y", LaplaceNoise(n, 20.0), obs=y)


def test_pilot_metric_samples_the_same_posterior_as_the_laplace_metric():
    y = jnp.array([300.0, 2, 180, 160, 350, 8])  # two nearly empty cells
    runs = {m: run_nuts(_release_model, jax.random.key(1), y, collapsed=True, metric=m,
                        num_chains=2, num_samples=1500, check=False)
            for m in ("laplace", "pilot")}
    pilot = runs["pilot"]
    assert pilot.metric == "pilot" and pilot.pilot.metric == "laplace"
    assert pilot.pilot.num_samples == 100
    assert MAPPED_SITE in pilot.get_samples()
    for site in ("theta", "n"):
        a, b = (np.asarray(r.get_samples(group_by_chain=True)[site]) for r in runs.values())
        se = np.sqrt(sum(x.reshape(-1, x.shape[-1]).var(0) / effective_sample_size(x)
                         for x in (a, b)))
        z = np.abs(a.mean((0, 1)) - b.mean((0, 1))) / se
        assert z.max() < 4.0, (site, z)


def test_pilot_metric_is_the_collapsed_paths():
    y = jnp.array([300.0, 2, 180, 160, 350, 8])
    with pytest.raises(ValueError, match="metric='pilot' is the collapsed path's"):
        run_nuts(_release_model, jax.random.key(0), y, exact=True, metric="pilot",
                 num_chains=1, num_samples=2, num_warmup=2)


def test_unknown_metric_is_refused_and_the_command_line_offers_the_same_choices():
    from numpyro_dpgm.cli._fit import NUTS_METRICS as CLI_METRICS
    from numpyro_dpgm.infer.bayes.nuts import NUTS_METRICS

    assert CLI_METRICS == NUTS_METRICS
    with pytest.raises(ValueError, match="metric must be one of"):
        run_nuts(_release_model, jax.random.key(0), jnp.ones(6), metric="curved")


def test_the_librarys_model_takes_the_pilot_map_too():
    """The library's own model runs the collapsed path through the same kernel: with
    ``metric="pilot"`` its draws hold ``phi``, ``theta`` and ``n`` as usual, the tables summing to
    ``N``, and the map has one coordinate per entry of ``phi``."""
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.measurements import Laplace, Measurement

    y = np.array([300.0, 2, 180, 160, 350, 8])
    model = noisy_marginals_model(NET, [Measurement(("a", "b"), y, Laplace(20.0))], 1000)
    mcmc = run_nuts(model, jax.random.key(0), collapsed=True, metric="pilot", num_warmup=20,
                    num_samples=20, num_chains=1, check=False)
    samples = mcmc.get_samples()
    assert mcmc.metric == "pilot" and {"phi", "theta", "n"} <= set(samples)
    np.testing.assert_allclose(np.asarray(samples["n"]).sum(-1), 1000.0, rtol=1e-9)
    assert mcmc.pilot_map.loc.size == samples["phi"].shape[-1]
    assert mcmc.pilot.num_samples == 20  # no pilot longer than the run it serves


def test_pilot_draws_follow_the_run_and_are_enough_for_the_fit():
    from numpyro_dpgm.infer.bayes.nuts import PILOT_DRAWS, pilot_draws

    assert pilot_draws(10 * PILOT_DRAWS) == PILOT_DRAWS
    assert pilot_draws(PILOT_DRAWS // 2) == PILOT_DRAWS // 2
    assert pilot_draws(1) == len(PROBABILITIES)
