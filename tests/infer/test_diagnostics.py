"""ArviZ helpers: named dims and coords, convergence on a demo model, predictive marginals."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import laplace

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.infer.bayes import cell_labels, noisy_marginals_model, run_svi
from numpyro_dpgm.infer.diagnostics import (
    clique_tables,
    convergence_report,
    marginal_summary,
    posterior_marginals,
    to_inference_data,
)
from numpyro_dpgm.measurements import Laplace, Measurement
from studies.convergence import demo_convergence, demo_release


@pytest.fixture(scope="module")
def demo():
    """4 chains × 1,000 draws (500 warmup) of NUTS on the demo release, seed 0.

    Measured: max R-hat 1.004, min bulk ESS 1,236, 0 divergences (vectorised chains).
    """
    run = demo_convergence(0, num_chains=4, num_warmup=500, num_samples=1000,
                           chain_method="vectorized")
    assert run.release.network == demo_release(0).network
    return run.report, run.tree, run.release, run


def test_demo_converges(demo):
    report = demo[0]
    assert report.num_chains == 4 and report.num_draws == 1000
    assert report.max_r_hat <= 1.01, str(report)
    assert report.min_ess_bulk >= 400, str(report)
    assert report.divergences == 0
    assert set(report.table.columns) == {"r_hat", "ess_bulk", "ess_tail"}
    # phi (8 parameters), n and mu (12 cells each)
    assert len(report.table) == 8 + 12 + 12
    assert "n[a=1,b=2]" in report.table.index and "phi[a=1,b=2]" in report.table.index


def test_dims_and_coords(demo):
    _, tree, release, _ = demo
    net = release.network
    post = tree["posterior"].to_dataset()
    cells, _ = cell_labels(net)
    for var in ("n", "theta", "mu"):
        assert post[var].dims == ("chain", "draw", "cell")
    assert list(post["cell"].values) == cells
    assert post["phi"].dims == ("chain", "draw", "param")
    assert list(post["param"].values) == ["a=1", "b=1", "b=2", "c=1", "a=1,b=1", "a=1,b=2",
                                          "b=1,c=1", "b=2,c=1"]
    obs = tree["observed_data"].to_dataset()
    np.testing.assert_allclose(obs["y"].values,
                               np.concatenate([m.values for m in release.measurements]))
    assert obs["y"].dims == ("answer",)
    pp = tree["posterior_predictive"].to_dataset()
    assert pp["y"].dims == ("chain", "draw", "answer")
    assert pp["y"].shape == (4, 1000, 12)
    assert "diverging" in tree["sample_stats"].to_dataset()
    # the draws satisfy the model: every table sums to N and n is near the truth
    n = post["n"].values
    np.testing.assert_allclose(n[..., :6].sum(-1), release.total_count, rtol=1e-10)
    sd = n.std(axis=(0, 1))
    assert np.all(np.abs(n.mean(axis=(0, 1)) - np.asarray(release.counts)) <= 4 * sd + 1)


def test_posterior_predictive_covers_the_release(demo):
    _, tree, release, _ = demo
    pp = tree["posterior_predictive"].to_dataset()["y"].values.reshape(-1, 12)
    y = np.concatenate([m.values for m in release.measurements])
    lo, hi = np.quantile(pp, [0.005, 0.995], axis=0)
    assert np.mean((lo <= y) & (y <= hi)) >= 11 / 12


def test_clique_tables(demo):
    _, tree, release, _ = demo
    net = release.network
    tables = clique_tables(tree, net, "n")
    assert set(tables.data_vars) == {"a,b", "b,c"}
    assert tables["a,b"].dims == ("chain", "draw", "a", "b")
    assert tables["b,c"].shape == (4, 1000, 3, 2)
    n = tree["posterior"].to_dataset()["n"].values
    np.testing.assert_array_equal(tables["b,c"].values.reshape(4, 1000, 6), n[..., 6:])
    # the tables agree on b (consistency of the latent counts)
    np.testing.assert_allclose(tables["a,b"].sum("a").values, tables["b,c"].sum("c").values,
                               rtol=1e-9)
    with pytest.raises(ValueError, match="no 'cell' dim"):
        clique_tables(tree, net, "phi")


def brute_force_marginal(net: MarkovNetwork, theta: np.ndarray, attrs: tuple) -> np.ndarray:
    """Enumerate the joint of the demo's chain and sum it down to ``attrs``."""
    dom = net.domain
    logp = np.zeros(dom.shape)
    for x in itertools.product(*(range(k) for k in dom.shape)):
        rec = dict(zip(dom.attrs, x, strict=True))
        val = 0.0
        offset = 0
        for c, shape, size in zip(net.cliques, net.shapes, net.sizes, strict=True):
            val += theta[offset + np.ravel_multi_index(tuple(rec[a] for a in c), shape)]
            offset += size
        logp[x] = val
    p = np.exp(logp - logsumexp(logp))
    drop = tuple(i for i, a in enumerate(dom.attrs) if a not in attrs)
    kept = [a for a in dom.attrs if a in attrs]
    return np.transpose(p.sum(axis=drop), [kept.index(a) for a in attrs])


def test_posterior_marginals_in_and_out_of_model(demo):
    _, tree, release, _ = demo
    net = release.network
    post = tree["posterior"].to_dataset()
    theta = post["theta"].values[:, :5]  # (4, 5, num_params)
    out = posterior_marginals(net, theta, ("c", "a"))  # in no clique
    assert out.shape == (4, 5, 2, 2)
    for i, j in [(0, 0), (3, 4), (2, 1)]:
        np.testing.assert_allclose(out[i, j], brute_force_marginal(net, theta[i, j], ("c", "a")),
                                   atol=1e-12)
    inside = posterior_marginals(net, theta, ("a", "b"), total=release.total_count)
    np.testing.assert_allclose(
        np.asarray(inside).reshape(4, 5, 6),
        release.total_count * post["mu"].values[:, :5, :6], rtol=1e-10)
    with pytest.raises(ValueError, match="theta has shape"):
        posterior_marginals(net, np.zeros(3), ("a",))


def test_marginal_summary(demo):
    _, tree, release, _ = demo
    net = release.network
    theta = tree["posterior"].to_dataset()["theta"].values.reshape(-1, net.num_params)[::10]
    truth = brute_force_marginal(net, np.asarray(release.theta), ("a", "c"))
    frame = marginal_summary(net, theta, ("a", "c"), prob=0.9, reference=truth)
    assert list(frame.index) == ["a=0,c=0", "a=0,c=1", "a=1,c=0", "a=1,c=1"]
    assert list(frame.columns) == ["mean", "sd", "lower", "upper", "reference"]
    np.testing.assert_allclose(frame["mean"].sum(), 1.0, rtol=1e-10)
    assert np.all(frame["lower"] <= frame["mean"]) and np.all(frame["mean"] <= frame["upper"])
    draws = np.asarray(posterior_marginals(net, theta, ("a", "c"))).reshape(-1, 4)
    np.testing.assert_allclose(frame["mean"], draws.mean(0), rtol=1e-12)
    with pytest.raises(ValueError, match="prob"):
        marginal_summary(net, theta, ("a",), prob=1.5)


def test_sample_stats_and_log_likelihood(demo):
    *_, run = demo
    stats = run.tree["sample_stats"].to_dataset()
    for name in ("diverging", "lp", "step_size", "n_steps", "tree_depth", "acceptance_rate",
                 "energy"):
        assert stats[name].dims == ("chain", "draw"), name
    np.testing.assert_allclose(stats["lp"].values.ravel(),
                               -np.asarray(run.mcmc.get_extra_fields()["potential_energy"]))
    tree = to_inference_data(run.mcmc, run.model, predictive=False, log_likelihood=True)
    ll = tree["log_likelihood"].to_dataset()["y"]
    assert ll.dims == ("chain", "draw", "answer")
    # independent check of one draw: Laplace(b) log densities of the 12 answers
    n = tree["posterior"].to_dataset()["n"].values[2, 17]
    y = np.concatenate([m.values for m in run.release.measurements])
    b = run.release.measurements[0].noise.scale
    np.testing.assert_allclose(ll.values[2, 17], laplace.logpdf(y, loc=n, scale=b), rtol=1e-12)


def test_to_inference_data_from_a_network(demo):
    *_, run = demo
    tree = to_inference_data(run.mcmc, run.release.network)
    post = tree["posterior"].to_dataset()
    assert post["n"].dims == ("chain", "draw", "cell")
    assert post["mu"].dims == ("chain", "draw", "cell")
    assert post["phi"].dims == ("chain", "draw", "param")
    assert list(post["param"].values) == run.model.coords["param"]
    assert "posterior_predictive" not in tree.children
    report = convergence_report(tree, var_names=["n"])
    assert len(report.table) == 12 and report.num_chains == 4
    with pytest.raises(ValueError, match="need the NoisyMarginalsModel"):
        to_inference_data(run.mcmc, run.release.network, predictive=True)
    tree = to_inference_data(run.mcmc, run.model, prior_draws=50, rng_key=jax.random.key(3))
    assert tree["prior"].to_dataset()["n"].dims == ("chain", "draw", "cell")
    assert tree["prior_predictive"].to_dataset()["y"].shape == (1, 50, 12)
    with pytest.raises(TypeError, match="MCMC run, an SVIFit or a LaplaceFit"):
        to_inference_data({"n": np.zeros((3, 4))}, run.model)
    with pytest.raises(TypeError, match="NoisyMarginalsModel or the MarkovNetwork"):
        to_inference_data(run.mcmc, "net")


def test_to_inference_data_from_svi_and_a_batch_of_releases():
    net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    ms = [Measurement(("a", "b"), [7.0, 3.0, 6.0, 4.0], Laplace(2.0))]
    model = noisy_marginals_model(net, ms, 20)
    # an SVI fit of three simulated releases at once: every site gains the dim "release"
    ys = np.array([[7.0, 3.0, 6.0, 4.0], [2.0, 9.0, 5.0, 4.0], [10.0, 0.0, 5.0, 6.0]])
    fit = run_svi(model, jax.random.key(2), guide="normal", num_steps=50, num_samples=20, y=ys)
    tree = to_inference_data(fit, model, log_likelihood=True)
    post = tree["posterior"].to_dataset()
    assert post["n"].dims == ("chain", "draw", "release", "cell")
    assert post["phi"].shape == (1, 20, 3, 3)
    assert tree["observed_data"].to_dataset()["y"].dims == ("release", "answer")
    np.testing.assert_allclose(tree["observed_data"].to_dataset()["y"].values, ys)
    assert tree["posterior_predictive"].to_dataset()["y"].shape == (1, 20, 3, 4)
    assert tree["log_likelihood"].to_dataset()["y"].shape == (1, 20, 3, 4)
    with pytest.raises(ValueError, match="batch of releases"):
        to_inference_data(fit, model, prior_draws=5)
