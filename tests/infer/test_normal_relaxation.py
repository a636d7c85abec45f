"""The Bayesian model with the normal relaxation (``relaxation="normal"``) against closed forms.

With ``θ`` fixed and Gaussian noise the model is linear-Gaussian: ``n = N μ + J z`` with
``J Jᵀ = Σ`` the CGM's covariance (checked by enumeration in
``tests/distributions/test_normal_cgm.py``), ``y = A n + e``. So ``E[n | y] = N μ + Σ Aᵀ (A Σ Aᵀ
+ σ² I)⁻¹ (y − A N μ)`` and ``Cov[n | y] = Σ − Σ Aᵀ (A Σ Aᵀ + σ² I)⁻¹ A Σ``, which NUTS must
reproduce within Monte Carlo error, whatever the partial centring.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from numpyro_dpgm import Gaussian, Laplace, MarkovNetwork, Measurement
from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts

NET = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c"), ("b",)])
TOTAL = 400
P_ABC = np.random.default_rng(5).dirichlet(np.full(12, 2.0)).reshape(2, 3, 2)


def _theta() -> np.ndarray:
    p_ab = P_ABC.sum(2)
    p_c_b = P_ABC.sum(0) / P_ABC.sum((0, 2))[:, None]
    return np.concatenate([np.log(p_ab).ravel(), np.log(p_c_b).ravel(), np.zeros(3)])


def _moments() -> tuple[np.ndarray, np.ndarray]:
    """``N μ`` and ``Σ`` of the tables of ``N`` records (network layout), by enumeration."""
    rows, probs = [], []
    for a, b, c in itertools.product(range(2), range(3), range(2)):
        v = np.zeros(NET.num_params)
        v[a * 3 + b] = v[6 + b * 2 + c] = v[12 + b] = 1.0
        rows.append(v)
        probs.append(P_ABC[a, b, c])
    f, p = np.array(rows), np.array(probs)
    mu = f.T @ p
    return TOTAL * mu, TOTAL * (f.T @ (p[:, None] * f) - np.outer(mu, mu))


@pytest.mark.parametrize("sigma", [3.0, 40.0])  # the release pins the counts / swamps them
def test_posterior_of_the_tables_matches_the_gaussian_update(sigma):
    mean, cov = _moments()
    a = np.zeros((12, NET.num_params))  # the release: the two 2-way tables
    a[np.arange(12), np.arange(12)] = 1.0
    y = a @ mean + np.array([9.0, -4.0, 6.0, 2.0, -7.0, 3.0, 1.0, -5.0, 8.0, 0.0, -2.0, 4.0])
    gain = cov @ a.T @ np.linalg.inv(a @ cov @ a.T + sigma**2 * np.eye(12))
    post_mean = mean + gain @ (y - a @ mean)
    post_sd = np.sqrt(np.diag(cov - gain @ a @ cov))
    release = [Measurement(("a", "b"), y[:6], Gaussian(sigma)),
               Measurement(("b", "c"), y[6:], Gaussian(sigma))]
    model = noisy_marginals_model(NET, release, TOTAL, theta=_theta(), relaxation="normal")
    mcmc = run_nuts(model, jax.random.key(1), num_warmup=500, num_samples=2000, num_chains=2,
                    exact=False)
    assert mcmc.path == "normal"
    draws = np.asarray(mcmc.get_samples()["n"])
    tol = 5 * post_sd / np.sqrt(mcmc.convergence.min_ess_bulk) + 1e-9
    assert np.all(np.abs(draws.mean(0) - post_mean) <= tol)
    np.testing.assert_allclose(draws.std(0), post_sd, rtol=0.1, atol=1e-6)
    assert mcmc.convergence.max_r_hat <= 1.01


def test_sites_and_starting_point():
    y = np.full(6, TOTAL / 6.0)
    model = noisy_marginals_model(NET, [Measurement(("a", "b"), y, Laplace(5.0))], TOTAL,
                                  relaxation="normal")
    assert model.dims["z"] == ["z_cell"] and len(model.coords["z_cell"]) == 12
    mcmc = run_nuts(model, jax.random.key(0), num_warmup=30, num_samples=30, num_chains=1,
                    exact=False, check=False)
    s = mcmc.get_samples()
    assert set(s) >= {"phi", "theta", "mu", "z", "n"} and s["n"].shape == (30, NET.num_params)
    np.testing.assert_allclose(np.asarray(s["n"])[:, :6].sum(1), TOTAL, rtol=1e-12)
    assert "relaxed (normal)" in repr(model)


def test_unknown_relaxation_is_refused():
    with pytest.raises(ValueError, match="'normal'"):
        noisy_marginals_model(NET, [Measurement(("a", "b"), np.ones(6), Laplace(1.0))], 6,
                              relaxation="gauss")


@pytest.mark.parametrize("scale, path", [(5.0, "normal"), (4.9, "relaxed")])
def test_default_path_is_normal_where_the_noise_is_wide(scale, path):
    """Laplace ``b = 5`` is variance 50 = ``NORMAL_MIN_VARIANCE``; ``b = 4.9`` falls short (and
    the 400 records leak nothing, so the conditional coding's relaxed path runs)."""
    from numpyro_dpgm.infer.diagnostics import to_inference_data

    y = np.array([60.0, 80.0, 50.0, 70.0, 90.0, 50.0])
    model = noisy_marginals_model(NET, [Measurement(("a", "b"), y, Laplace(scale))], TOTAL)
    mcmc = run_nuts(model, jax.random.key(0), num_warmup=30, num_samples=30, num_chains=1,
                    check=False)
    assert mcmc.path == path and model.relaxation == "lgamma"
    tree = to_inference_data(mcmc, model, predictive=False)
    if path == "normal":
        assert "at least 50 counts²" in mcmc.path_reason
        assert mcmc.model.relaxation == "normal" and tree["posterior"]["z"].dims[-1] == "z_cell"
    else:
        assert "z" not in tree["posterior"]
    assert tree["posterior"].attrs["cgm_path"] == path


def test_convergence_warning_names_the_normal_path_s_remedies():
    from numpyro_dpgm.infer.bayes.checks import (
        ConvergenceFigures,
        ConvergenceWarning,
        warn_convergence,
    )

    figures = ConvergenceFigures(1.2, 20.0, "phi[0]", 0, 1000)
    with pytest.warns(ConvergenceWarning, match="lgamma relaxation") as record:
        warn_convergence(figures, "normal")
    assert "gibbs_moves" not in str(record[0].message)


def test_divergences_alone_warn_and_name_a_smaller_step():
    import warnings

    from numpyro_dpgm.infer.bayes.checks import (
        ConvergenceFigures,
        ConvergenceWarning,
        warn_convergence,
    )

    with pytest.warns(ConvergenceWarning, match="93 of 19000 draws diverged") as record:
        warn_convergence(ConvergenceFigures(1.005, 417.0, "phi[0]", 0, 19000, 93), "normal")
    text = str(record[0].message)
    assert "target_accept_prob=0.95" in text and "--target-accept 0.95" in text
    assert "lgamma" not in text  # the run converged: only the divergences' remedy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_convergence(ConvergenceFigures(1.005, 417.0, "phi[0]", 0, 19000, 0), "normal")
