"""The exact path of the Bayesian model (record swaps inside HMCGibbs) against enumeration.

* Records from tables: every draw has the given tables, and the records are dealt uniformly
  (the expected full-record counts are the hypergeometric ``n_ab n_bc / n_b``).
* Invariance: one update applied to exact draws of ``p(n | θ, y)`` (enumerated from the
  12-cell joint table of 8 records, independently of the CGM pmf) keeps their law.
* ``θ`` fixed: the 6-cell ``N = 12`` table with Laplace ``b = 2`` and sparse expected counts
  (0.05–5) to within 0.10 counts of the exact posterior mean, with R-hat ≤ 1.01; the chain
  ``a – b – c`` with expected counts 0.01–2.
* A prior on ``θ``: one attribute of three levels, ``φ ∼ N(0, 1.5²)``, ``N = 12``, release
  ``(11, 0.5, −0.5)``; the exact posterior of ``n`` and of ``μ(θ)`` by quadrature over ``φ``;
  HMCGibbs end to end with R-hat ≤ 1.01.
* :func:`run_nuts` picks the exact path where the relaxation leaks and says so; relaxed
  posteriors warn on leak; convergence warnings fire.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracles.enumeration import compositions, laplace_loglik, log_multinomial, moments
from scipy.special import gammaln, logsumexp

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel
from numpyro_dpgm.distributions.relaxation import RelaxationWarning
from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
from numpyro_dpgm.infer.bayes.checks import ConvergenceWarning, convergence_figures
from numpyro_dpgm.infer.bayes.gibbs import exact_gibbs_fn
from numpyro_dpgm.infer.bayes.interweave import released_noise_share
from numpyro_dpgm.infer.bayes.paths import PINNED_SHARE, choose_path
from numpyro_dpgm.infer.bayes.records import (
    exact_count_update,
    record_plan,
    record_update,
    records_from_tables,
    tables_from_records,
)
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.oracles import junction_tree as jt

# ------------------------------------------------------------------------------------------------
# the 6-cell table, N = 12, Laplace b = 2, θ fixed
# ------------------------------------------------------------------------------------------------
NET6 = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
N6, B6 = 12, 2.0
MU6 = np.array([5.0, 4.0, 2.0, 0.8, 0.15, 0.05]) / 12.0  # expected counts 5 … 0.05
Y6 = np.array([6.2, 1.9, 3.4, -0.6, 1.3, -1.1])


@pytest.fixture(scope="module")
def exact6():
    tables = compositions(N6, 6)
    log_w = log_multinomial(tables, MU6) + laplace_loglik(tables, Y6, B6)
    return moments(tables, log_w)


def test_six_cell_table_matches_enumeration_to_a_tenth_of_a_count(exact6):
    mean, sd = exact6
    model = noisy_marginals_model(NET6, [Measurement(("a", "b"), Y6, Laplace(B6))], N6,
                                  theta=np.log(MU6))
    mcmc = run_nuts(model, jax.random.key(0), num_warmup=200, num_samples=4000, num_chains=2)
    assert mcmc.path == "exact"
    draws = np.asarray(mcmc.get_samples()["n"])
    assert np.all(draws == np.round(draws)) and np.all(draws.sum(1) == N6)
    assert np.max(np.abs(draws.mean(0) - mean)) <= 0.10
    assert np.max(np.abs(draws.std(0) - sd)) <= 0.08
    figures = convergence_figures(mcmc.get_samples(group_by_chain=True), ["n"])
    assert figures.max_r_hat <= 1.01 and figures.min_ess_bulk >= 1000


# ------------------------------------------------------------------------------------------------
# the chain a(2) – b(3) – c(2), N = 8, θ fixed: brute force over the 12-cell joint table
# ------------------------------------------------------------------------------------------------
NETC = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
NC, BC = 8, 1.5
P_AB = np.array([[0.45, 0.2, 0.001], [0.15, 0.1, 0.099]])
P_C_GIVEN_B = np.array([[0.9, 0.1], [0.002, 0.998], [0.5, 0.5]])
YC = (np.array([3.7, 1.2, -0.8, 2.1, 0.4, 1.6]), np.array([4.4, 1.0, -0.3, 2.6, 0.9, 0.2]))


def chain_release() -> list[Measurement]:
    return [Measurement(("a", "b"), YC[0], Laplace(BC)),
            Measurement(("b", "c"), YC[1], Laplace(BC))]


def chain_theta() -> np.ndarray:
    return np.concatenate([np.log(P_AB).ravel(), np.log(P_C_GIVEN_B).ravel()])


@pytest.fixture(scope="module")
def exact_chain():
    """Exact law of the tables ``(n_ab, n_bc)`` given y: a sum over the full 12-cell tables."""
    joint = (P_AB[:, :, None] * P_C_GIVEN_B[None, :, :]).ravel()  # (a, b, c)
    full = compositions(NC, 12)
    log_p = log_multinomial(full, joint)
    cube = full.reshape(-1, 2, 3, 2)
    n = np.concatenate([cube.sum(3).reshape(-1, 6), cube.sum(1).reshape(-1, 6)], axis=1)
    log_w = log_p + laplace_loglik(n, np.concatenate(YC), BC)
    keys, inverse = np.unique(n, axis=0, return_inverse=True)
    log_q = np.full(len(keys), -np.inf)
    np.logaddexp.at(log_q, inverse.ravel(), log_w)
    return keys, log_q - logsumexp(log_q)


def test_records_from_tables_keep_the_tables_and_deal_uniformly():
    model = noisy_marginals_model(NETC, chain_release(), NC, theta=chain_theta(), relaxed=False)
    plan = record_plan(model)
    n = jnp.asarray([2, 1, 0, 3, 1, 1, 3, 2, 0, 2, 1, 0], dtype=float)  # n_b = (5, 2, 1)
    keys = jax.random.split(jax.random.key(3), 4000)
    codes = jax.vmap(lambda k: records_from_tables(plan, n, k))(keys)
    again = jax.vmap(lambda c: tables_from_records(plan, c))(codes)
    np.testing.assert_array_equal(np.asarray(again), np.broadcast_to(n, again.shape))
    cells = np.asarray(codes[..., 0] * 6 + codes[..., 1] * 2 + codes[..., 2])
    counts = np.stack([np.bincount(row, minlength=12) for row in cells]).mean(0)
    n_ab, n_bc = np.asarray(n[:6]).reshape(2, 3), np.asarray(n[6:]).reshape(3, 2)
    expected = (n_ab[:, :, None] * n_bc[None] / n_bc.sum(1)[None, :, None]).ravel()
    np.testing.assert_allclose(counts, expected, atol=0.05)


@pytest.mark.parametrize("moves", [1, 6])
def test_one_update_keeps_the_exact_posterior(exact_chain, moves):
    keys, log_q = exact_chain
    model = noisy_marginals_model(NETC, chain_release(), NC, theta=chain_theta(), relaxed=False)
    plan = record_plan(model)
    rng = np.random.default_rng(1)
    draws = 20_000
    start = keys[rng.choice(len(keys), size=draws, p=np.exp(log_q))]
    eta, y = jnp.asarray(chain_theta()), jnp.asarray(model.y)
    step = jax.jit(jax.vmap(lambda n, k: exact_count_update(plan, model.predict, n, eta, y, k,
                                                            moves)[0]))
    after = np.asarray(step(jnp.asarray(start, dtype=float),
                            jax.random.split(jax.random.key(moves), draws)))
    mean, sd = moments(keys, log_q)
    moved = np.mean(np.any(after != start, axis=1))
    assert moved > 0.2
    # 4.5 Monte Carlo standard errors of a mean of 20,000 independent draws
    np.testing.assert_allclose(after.mean(0), mean, atol=4.5 * np.max(sd) / np.sqrt(draws))
    np.testing.assert_allclose(after.std(0), sd, atol=0.03)


def test_kept_records_keep_the_exact_posterior(exact_chain):
    """Three updates of records kept between them (dealt once, as :class:`RecordSwaps` does)
    from exact posterior draws of the tables: still exact."""
    keys, log_q = exact_chain
    model = noisy_marginals_model(NETC, chain_release(), NC, theta=chain_theta(), relaxed=False)
    plan = record_plan(model)
    draws = 20_000
    start = keys[np.random.default_rng(2).choice(len(keys), size=draws, p=np.exp(log_q))]
    eta, y = jnp.asarray(chain_theta()), jnp.asarray(model.y)

    def three(n, key):
        k_deal, *k_moves = jax.random.split(key, 4)
        codes = records_from_tables(plan, n, k_deal)
        for k in k_moves:
            codes, n, _ = record_update(plan, model.predict, codes, n, eta, y, k, 2)
        return n, codes

    after, codes = jax.jit(jax.vmap(three))(jnp.asarray(start, dtype=float),
                                            jax.random.split(jax.random.key(7), draws))
    np.testing.assert_array_equal(np.asarray(jax.vmap(
        lambda c: tables_from_records(plan, c, after.dtype))(codes)), np.asarray(after))
    after = np.asarray(after)
    mean, sd = moments(keys, log_q)
    assert np.mean(np.any(after != start, axis=1)) > 0.2
    np.testing.assert_allclose(after.mean(0), mean, atol=4.5 * np.max(sd) / np.sqrt(draws))
    np.testing.assert_allclose(after.std(0), sd, atol=0.03)


def test_chain_with_theta_fixed_matches_enumeration(exact_chain):
    keys, log_q = exact_chain
    mean, sd = moments(keys, log_q)
    model = noisy_marginals_model(NETC, chain_release(), NC, theta=chain_theta())
    mcmc = run_nuts(model, jax.random.key(1), num_warmup=100, num_samples=3000, num_chains=2,
                    exact=True)
    draws = np.asarray(mcmc.get_samples()["n"])
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.08)
    np.testing.assert_allclose(draws.std(0), sd, atol=0.06)


# ------------------------------------------------------------------------------------------------
# a prior on θ: one attribute of three levels, quadrature over φ
# ------------------------------------------------------------------------------------------------
NET1 = MarkovNetwork({"a": 3}, [("a",)])
N1, B1, S1 = 12, 2.0, 1.5
Y1 = np.array([11.0, 0.5, -0.5])


@pytest.fixture(scope="module")
def exact_prior():
    """Posterior of ``n`` and ``μ`` with ``φ ∼ N(0, S1² I)``: Gauss–Hermite over ``φ``."""
    x, w = np.polynomial.hermite_e.hermegauss(120)  # ∫ f(x) e^{−x²/2} dx
    p1, p2 = np.meshgrid(S1 * x, S1 * x, indexing="ij")
    logw = np.log(w)[:, None] + np.log(w)[None, :]
    logits = np.stack([np.zeros_like(p1), p1, p2], -1)
    mu = np.exp(logits - logsumexp(logits, -1, keepdims=True)).reshape(-1, 3)
    tables = compositions(N1, 3)
    # log p(φ_g, n_t | y) up to a constant
    log_joint = (logw.reshape(-1, 1) + (tables[None] * np.log(mu)[:, None]).sum(-1)
                 + gammaln(N1 + 1) - gammaln(tables + 1).sum(-1)[None]
                 + laplace_loglik(tables, Y1, B1)[None])
    log_n = logsumexp(log_joint, axis=0)
    log_g = logsumexp(log_joint, axis=1)
    return moments(tables, log_n), moments(mu, log_g)


@pytest.mark.parametrize("coding", ["reference", "conditional"])
def test_prior_on_theta_matches_quadrature(exact_prior, coding):
    """Both codings give the same prior here (log odds against level 0 of one attribute); the
    conditional one's ``θ`` is normalised, so its exact CGM skips ``A(θ)``."""
    (n_mean, n_sd), (mu_mean, mu_sd) = exact_prior
    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1, coding=coding)
    assert model.normalized == (coding == "conditional")
    mcmc = run_nuts(model, jax.random.key(2), num_warmup=500, num_samples=4000, num_chains=2,
                    exact=True)
    s = mcmc.get_samples()
    np.testing.assert_allclose(np.asarray(s["n"]).mean(0), n_mean, atol=0.12)
    np.testing.assert_allclose(np.asarray(s["n"]).std(0), n_sd, atol=0.10)
    np.testing.assert_allclose(np.asarray(s["mu"]).mean(0), mu_mean, atol=0.012)
    np.testing.assert_allclose(np.asarray(s["mu"]).std(0), mu_sd, atol=0.012)
    figures = convergence_figures(mcmc.get_samples(group_by_chain=True), ["phi", "n"],
                                  mcmc.get_extra_fields(group_by_chain=True)["num_steps"], 10)
    assert figures.max_r_hat <= 1.01 and figures.max_depth_hits == 0
    assert int(np.sum(mcmc.get_extra_fields()["diverging"])) == 0


def test_gibbs_fn_plugs_into_numpyro_hmcgibbs():
    from numpyro.infer import MCMC, NUTS, HMCGibbs

    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1, relaxed=False)
    kernel = HMCGibbs(NUTS(model), gibbs_fn=exact_gibbs_fn(model), gibbs_sites=["n"])
    mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.key(0), init_params={"n": jnp.asarray([10.0, 1.0, 1.0])})
    s = mcmc.get_samples()
    assert s["n"].shape == (50, 3) and s["phi"].shape == (50, 2)
    assert np.all(np.asarray(s["n"]).sum(1) == N1)


# ------------------------------------------------------------------------------------------------
# path choice and warnings
# ------------------------------------------------------------------------------------------------
def test_run_nuts_picks_the_exact_path_where_the_relaxation_leaks():
    leaky = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1)
    mcmc = run_nuts(leaky, jax.random.key(0), num_warmup=20, num_samples=20, num_chains=1,
                    init={"phi": jnp.asarray([-3.0, -3.0])}, check=False)
    assert mcmc.path == "exact" and "above the 1% tolerance" in mcmc.path_reason
    assert not mcmc.model.relaxed and leaky.relaxed
    y = np.array([700.0, 650, 600])
    roomy = noisy_marginals_model(NET1, [Measurement(("a",), y, Laplace(20.0))], 2000,
                                  coding="reference")  # the share rule is the reference coding's
    mcmc = run_nuts(roomy, jax.random.key(0), num_warmup=20, num_samples=20, num_chains=1,
                    check=False)
    assert mcmc.path == "relaxed" and "within the 1% tolerance" in mcmc.path_reason
    # V = 2·20² = 800 against the median count 650: the noise's share is 800 / 1450
    assert "share of the median released count is 55.2% (at least 7.5%)" in mcmc.path_reason


def test_run_nuts_picks_the_exact_path_where_the_release_pins_the_counts():
    y = np.array([700.0, 650, 600])
    pinned = noisy_marginals_model(NET1, [Measurement(("a",), y, Laplace(B1))], 2000,
                                   coding="reference")
    shares = released_noise_share(pinned)
    np.testing.assert_allclose(shares, 2 * B1**2 / (y + 2 * B1**2), rtol=1e-12)
    assert np.median(shares) < PINNED_SHARE
    mcmc = run_nuts(pinned, jax.random.key(0), num_warmup=20, num_samples=20, num_chains=1,
                    check=False)
    assert mcmc.path == "exact" and "within the 1% tolerance" in mcmc.path_reason
    assert "the release pins the counts" in mcmc.path_reason
    n = np.asarray(mcmc.get_samples()["n"])
    assert np.all(n.sum(1) == 2000) and np.all(n == np.round(n))
    given = run_nuts(pinned, jax.random.key(0), num_warmup=5, num_samples=5, num_chains=1,
                     exact=False, check=False)
    assert given.path == "relaxed" and given.path_reason == "exact=False"
    # with the prior on the conditional coding only the leak sends a run to the exact path
    conditional = noisy_marginals_model(NET1, [Measurement(("a",), y, Laplace(B1))], 2000,
                                        coding="conditional")
    chosen, reason = choose_path(conditional, None, conditional.uniform_point())
    assert chosen == "relaxed" and "with the conditional coding" in reason


def test_relaxed_posterior_warns_on_leak_and_convergence_warnings_fire():
    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_nuts(model, jax.random.key(0), num_warmup=30, num_samples=30, num_chains=2,
                 exact=False, max_tree_depth=1)
    kinds = {type(w.message) for w in caught}
    assert RelaxationWarning in kinds and ConvergenceWarning in kinds
    text = " ".join(str(w.message) for w in caught if w.category is ConvergenceWarning)
    assert "maximum tree depth" in text and "bulk ESS" in text and "exact=True" in text
    leak = next(str(w.message) for w in caught if w.category is RelaxationWarning)
    assert "exact=True" in leak


def test_convergence_figures_flag_stuck_chains():
    rng = np.random.default_rng(0)
    good = {"x": rng.normal(size=(4, 500, 3))}
    bad = {"x": good["x"] + np.array([0.0, 0.0, 0.0, 1.0])[:, None, None]}
    assert convergence_figures(good, ["x"]).max_r_hat < 1.01
    figures = convergence_figures(bad, ["x"])
    assert figures.max_r_hat > 1.05 and figures.worst.startswith("x[")
    steps = np.full((4, 500), 1023)
    assert convergence_figures(good, ["x"], steps, 10).max_depth_hits == 2000
    diverging = np.zeros((4, 500), bool)
    diverging[1, :7] = True
    assert convergence_figures(good, ["x"], steps, 10, diverging).divergences == 7
    assert convergence_figures(good, ["x"]).divergences == 0


def test_bulk_ess_of_antithetic_draws_is_capped_not_negative():
    # NumPyro's raw estimate S/τ̂ (τ̂ unbounded) of an antithetic chain exceeds S·log10(S) or
    # turns negative on short chains; as ArviZ and Stan, τ̂ ≥ 1/log10(S) caps it
    rng = np.random.default_rng(1)
    flip = (-1.0) ** np.arange(20) * (1.0 + 0.01 * rng.normal(size=(2, 20)))
    ess = convergence_figures({"x": flip[..., None]}, ["x"]).min_ess_bulk
    np.testing.assert_allclose(ess, 40 * np.log10(40), rtol=1e-12)
    ar = np.cumsum(rng.normal(size=(2, 400)), axis=1)  # a random walk: a small ESS, untouched
    assert 0 < convergence_figures({"x": ar[..., None]}, ["x"]).min_ess_bulk < 40


def test_exact_path_with_theta_fixed_runs_vectorised_chains_in_turn():
    # the record moves start from one key: chain_method="vectorized" failed inside their init
    model = noisy_marginals_model(NET6, [Measurement(("a", "b"), Y6, Laplace(B6))], N6,
                                  theta=np.log(MU6))
    runs = [run_nuts(model, jax.random.key(0), num_warmup=5, num_samples=5, num_chains=2,
                     exact=True, chain_method=method, check=False)
            for method in ("vectorized", "sequential")]
    n = [np.asarray(r.get_samples()["n"]) for r in runs]
    assert n[0].shape == (10, 6) and np.all(n[0].sum(1) == N6)
    np.testing.assert_array_equal(n[0], n[1])


def test_exact_start_model_errors():
    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1)
    with pytest.raises(ValueError, match="relaxed=False"):
        from numpyro_dpgm.infer.bayes.gibbs import exact_kernel

        exact_kernel(model)
    with pytest.raises(ValueError, match="needs observed answers"):
        run_nuts(model, jax.random.key(0), num_warmup=2, num_samples=2, num_chains=1,
                 exact=True, y=None)
    assert CollectiveGraphicalModel(NET1, jnp.zeros(3), N1).support.is_discrete


# ------------------------------------------------------------------------------------------------
# non-centred moves of (φ, n): invariance from exact joint draws
# ------------------------------------------------------------------------------------------------
def _noncentred(plan, model, y, moves, k_max, kind="all"):
    """``(keys, n, φ) -> (n, φ, accepted)``: non-centred moves from freshly dealt records, on
    one kind of event (the parameters', the cells', the cells' within a margin) or all."""
    from numpyro_dpgm.infer.bayes.interweave import events, noncentred_moves

    ev = events(model.network, model.coding)
    chosen = {"all": np.ones(ev.phi.size, bool), "parameters": ev.phi >= 0,
              "cells": (ev.cell >= 0) & (ev.context == 0), "within": ev.context > 0}[kind]
    assert chosen.any()

    def one(key, n, phi):
        k_deal, k_move = jax.random.split(key)
        codes = records_from_tables(plan, n, k_deal)
        return noncentred_moves(plan, model, codes, n, phi, y, k_move, moves, k_max,
                                weights=chosen.astype(float))[1:]

    return jax.jit(jax.vmap(one))


NET2 = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
N2, B2, S2 = 8, 1.5, 1.5
Y2 = np.array([5.0, 0.5, 2.5, -0.5])


def _exact_joint(model, nodes):
    """The exact joint law of ``(φ, n) | y`` of a one-clique Laplace release with the prior
    ``φ ∼ N(0, s²)``: ``φ`` on a Gauss–Hermite grid of ``nodes`` per coordinate, ``n`` by
    enumeration. Returns the grid, the tables and the weights (grid × tables, flattened)."""
    net, s, total = model.network, float(model.prior_scale), int(model.total_count)
    y_obs, b = np.asarray(model.y), float(np.asarray(model.noise_scales)[0])
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    dim = model.coding.dim
    grid = np.stack([a.ravel() for a in np.meshgrid(*[s * x] * dim, indexing="ij")], -1)
    log_w = sum(a.ravel() for a in np.meshgrid(*[np.log(w)] * dim, indexing="ij"))
    logits = np.asarray(model.coding.to_theta(grid))
    log_mu = logits - logsumexp(logits, -1, keepdims=True)
    tables = compositions(total, net.num_params)
    log_joint = (log_w[:, None] + log_mu @ tables.T - gammaln(tables + 1).sum(-1)[None]
                 + laplace_loglik(tables, y_obs, b)[None])
    return grid, tables, np.exp(log_joint - logsumexp(log_joint)).ravel()


@pytest.mark.parametrize(("table", "kind", "nodes", "coding"), [
    ("one-way", "parameters", 60, "reference"), ("one-way", "cells", 60, "reference"),
    ("two-way", "within", 24, "reference"), ("two-way", "all", 24, "reference"),
    ("two-way", "all", 24, "conditional")])
def test_noncentred_moves_keep_the_exact_joint_posterior(table, kind, nodes, coding):
    """Exact draws of ``(φ, n) | y`` (``φ`` on a Gauss–Hermite grid, ``n | φ, y`` by
    enumeration) for a three-level attribute or a 2 × 2 table, moved 8 times, keep their
    moments."""
    net, y_obs, b, total, s = ((NET1, Y1, B1, N1, S1) if table == "one-way"
                               else (NET2, Y2, B2, N2, S2))
    model = noisy_marginals_model(net, [Measurement(net.cliques[0], y_obs, Laplace(b))], total,
                                  prior_scale=s, relaxed=False, coding=coding,
                                  reference={"a": 1} if coding == "conditional" else None)
    grid, tables, flat = _exact_joint(model, nodes)
    draws = 20_000
    pick = np.random.default_rng(5).choice(flat.size, size=draws, p=flat / flat.sum())
    phi0 = grid[pick // len(tables)]
    n0 = tables[pick % len(tables)].astype(float)
    plan = record_plan(model)
    move = _noncentred(plan, model, jnp.asarray(model.y), 8, 12, kind)
    n1, phi1, acc = move(jax.random.split(jax.random.key(0), draws), jnp.asarray(n0),
                         jnp.asarray(phi0))
    n1, phi1 = np.asarray(n1), np.asarray(phi1)
    assert 0.2 < float(np.mean(acc)) < 0.95
    assert np.all(n1.sum(1) == total) and np.mean(np.any(n1 != n0, axis=1)) > 0.3
    w_joint = (flat / flat.sum()).reshape(-1, len(tables))
    phi_mean, n_mean = w_joint.sum(1) @ grid, w_joint.sum(0) @ tables
    se_phi = phi0.std(0) / np.sqrt(draws)
    np.testing.assert_allclose(phi1.mean(0), phi_mean, atol=5 * se_phi.max())
    np.testing.assert_allclose(n1.mean(0), n_mean, atol=5 * n0.std(0).max() / np.sqrt(draws))
    np.testing.assert_allclose(phi1.std(0), phi0.std(0), rtol=0.03)


def test_a_model_of_your_own_with_the_non_centred_moves_keeps_the_exact_posterior():
    """The library's exact path is the kernel of a model of your own (:class:`CGMGibbs`) with
    the non-centred moves as its ``joint_fn``; the same kernel on the same model written by
    hand keeps the exact joint posterior of ``(φ, n)`` (quadrature × enumeration)."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    from numpyro_dpgm.distributions import LaplaceNoise
    from numpyro_dpgm.infer.bayes import CGMGibbs
    from numpyro_dpgm.infer.bayes.gibbs import exact_kernel, noncentred_fn

    lib = noisy_marginals_model(NET2, [Measurement(("a", "b"), Y2, Laplace(B2))], N2,
                                prior_scale=S2, relaxed=False)
    coding = lib.coding

    def model(y):
        phi = numpyro.sample("phi", dist.Normal(0.0, S2).expand([coding.dim]).to_event(1))
        n = numpyro.sample("n", CollectiveGraphicalModel(NET2, coding.to_theta(phi), N2))
        numpyro.sample("y", LaplaceNoise(n, B2), obs=y)

    assert type(exact_kernel(lib)) is CGMGibbs
    kernel = CGMGibbs(NUTS(model), joint_fn=noncentred_fn(lib, moves=8))
    mcmc = MCMC(kernel, num_warmup=200, num_samples=3000, progress_bar=False)
    mcmc.run(jax.random.key(1), jnp.asarray(Y2))
    draws = mcmc.get_samples()
    grid, tables, flat = _exact_joint(lib, 24)
    w_joint = flat.reshape(-1, len(tables))
    assert np.max(np.abs(np.asarray(draws["n"]).mean(0) - w_joint.sum(0) @ tables)) <= 0.10
    np.testing.assert_allclose(np.asarray(draws["phi"]).mean(0), w_joint.sum(1) @ grid,
                               atol=0.08)


@pytest.mark.parametrize("coding", ["reference", "conditional"])
def test_noncentred_moves_keep_the_prior_on_a_chain(coding):
    """With uninformative noise the posterior is the prior: ``φ ∼ N(0, s²)``, ``n ∼ CGM(θ)``;
    moves that mix up the clique memberships must keep it (the conditional coding's moves
    stay within a separator's value)."""
    flat = [Measurement(("a", "b"), np.zeros(6), Laplace(1e6)),
            Measurement(("b", "c"), np.zeros(6), Laplace(1e6))]
    model = noisy_marginals_model(NETC, flat, 6, prior_scale=1.0, relaxed=False, coding=coding)
    plan = record_plan(model)
    draws = 6000
    phi0 = jax.random.normal(jax.random.key(1), (draws, model.coding.dim))
    eta = jax.vmap(lambda p: model.latent_theta(model.coding.to_theta(p)))(phi0)
    n0 = jax.vmap(lambda t, k: CollectiveGraphicalModel(NETC, t, 6).sample(k))(
        eta, jax.random.split(jax.random.key(2), draws))
    y = jnp.asarray(model.y)
    move = _noncentred(plan, model, y, 10, 6)
    n1, phi1, acc = move(jax.random.split(jax.random.key(3), draws), n0, phi0)
    assert float(np.mean(acc)) > 0.5
    phi1 = np.asarray(phi1)
    np.testing.assert_allclose(phi1.mean(0), 0.0, atol=5 / np.sqrt(draws))
    np.testing.assert_allclose(phi1.std(0), 1.0, atol=0.05)
    # E[n | φ] = N μ(θ(φ)): the moved tables keep their law given the moved parameters
    mu1 = jax.vmap(lambda p: NETC.flatten(jt.marginals(NETC, model.coding.to_theta(p))))(
        jnp.asarray(phi1))
    resid = np.asarray(n1) - 6 * np.asarray(mu1)
    np.testing.assert_allclose(resid.mean(0), 0.0, atol=5 * resid.std(0).max() / np.sqrt(draws))


def test_relaxed_svi_warns_on_leak():
    from numpyro_dpgm.infer.bayes import run_svi

    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1)
    with pytest.warns(RelaxationWarning, match="run_svi"):
        run_svi(model, jax.random.key(0), num_steps=200, num_samples=100)


def test_arviz_sees_both_sites_of_the_exact_path():
    from numpyro_dpgm.infer.diagnostics import convergence_report, to_inference_data

    model = noisy_marginals_model(NET1, [Measurement(("a",), Y1, Laplace(B1))], N1,
                                  prior_scale=S1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mcmc = run_nuts(model, jax.random.key(4), num_warmup=50, num_samples=50, num_chains=2,
                        exact=True)
    assert type(mcmc.sampler).__name__ == "CGMGibbs"  # the kernel of a model of your own
    tree = to_inference_data(mcmc, mcmc.model, predictive=True)
    post = tree["posterior"]
    assert post.attrs["cgm_path"] == "exact"
    assert {"phi", "n", "mu", "theta"} <= set(post.data_vars)
    assert np.all(np.asarray(post["n"]) == np.round(np.asarray(post["n"])))
    assert "tree_depth" in tree["sample_stats"].data_vars
    report = convergence_report(tree)
    assert report.num_chains == 2 and report.num_draws == 50
