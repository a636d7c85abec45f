"""Record moves in models users write (:class:`CGMGibbs`, :class:`RecordMoves`) against
enumeration.

* Invariance: one update of the tables, applied to exact posterior draws (enumerated
  independently of the kernel), keeps their law: a chain network released through two noise
  sites of two families (a clique table with Laplace noise, a one-way marginal of the other
  clique with Gaussian noise); two regions in a plate with different totals, each released, and
  a national total over both (one release reading two sets of tables).
* End to end: a model with a prior on the log odds, ``run_nuts`` and ``MCMC(CGMGibbs(NUTS))``
  against Gauss–Hermite quadrature over ``φ``.
* The layout found by tracing (the linear map of a marginal) and the errors that name the site.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS
from oracles.enumeration import compositions, laplace_loglik, log_multinomial, moments
from scipy.special import logsumexp

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel, GaussianNoise, LaplaceNoise
from numpyro_dpgm.infer.bayes import CGMGibbs, CountSiteError, RecordMoves, count_layout, run_nuts
from numpyro_dpgm.infer.bayes.checks import convergence_figures


def one_update(model, args, draws: np.ndarray, moves: int, seed: int) -> np.ndarray:
    """One :class:`RecordMoves` update from each of ``draws`` (records dealt afresh)."""
    kernel = RecordMoves(model, moves=moves)
    kernel.init(jax.random.key(0), 0, {"n": jnp.asarray(draws[0], float)}, args, None)

    def step(n, key):
        k_init, k_step = jax.random.split(key)
        state = kernel.init(k_init, 0, {"n": n}, args, None)
        return kernel.sample(state, args, None).z["n"]

    keys = jax.random.split(jax.random.key(seed), len(draws))
    return np.asarray(jax.jit(jax.vmap(step))(jnp.asarray(draws, float), keys))


def assert_law_kept(after: np.ndarray, start: np.ndarray, mean: np.ndarray, sd: np.ndarray):
    flat = (len(after), -1)
    assert np.mean(np.any(after.reshape(flat) != start.reshape(flat), axis=1)) > 0.2
    # 4.5 Monte Carlo standard errors of a mean of independent draws
    tol = 4.5 * np.max(sd) / np.sqrt(len(after))
    np.testing.assert_allclose(after.mean(0), mean, atol=tol)
    np.testing.assert_allclose(after.std(0), sd, atol=0.03)


# ------------------------------------------------------------------------------------------------
# a chain a(2) – b(3) – c(2), N = 8, two noise sites of two families
# ------------------------------------------------------------------------------------------------
NETC = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
NC = 8
P_AB = np.array([[0.45, 0.2, 0.001], [0.15, 0.1, 0.099]])
P_C_GIVEN_B = np.array([[0.9, 0.1], [0.002, 0.998], [0.5, 0.5]])
THETA_C = np.concatenate([np.log(P_AB).ravel(), np.log(P_C_GIVEN_B).ravel()])
Y_AB, B_AB = np.array([3.7, 1.2, -0.8, 2.1, 0.4, 1.6]), 1.5
Y_C, S_C = np.array([5.2, 1.9]), 1.2


def chain_model(y_ab, y_c):
    n = numpyro.sample("n", CollectiveGraphicalModel(NETC, jnp.asarray(THETA_C), NC))
    numpyro.sample("y_ab", LaplaceNoise(n[:6], B_AB), obs=y_ab)
    # the one-way marginal of c, read from the (b, c) table
    numpyro.sample("y_c", GaussianNoise(jnp.reshape(n[6:], (3, 2)).sum(0), S_C), obs=y_c)


@pytest.fixture(scope="module")
def chain_posterior():
    """Exact law of the tables given both releases: a sum over the full 12-cell tables."""
    joint = (P_AB[:, :, None] * P_C_GIVEN_B[None, :, :]).ravel()
    full = compositions(NC, 12)
    cube = full.reshape(-1, 2, 3, 2)
    n = np.concatenate([cube.sum(3).reshape(-1, 6), cube.sum(1).reshape(-1, 6)], axis=1)
    c = n[:, 6:].reshape(-1, 3, 2).sum(1)
    log_w = (log_multinomial(full, joint) + laplace_loglik(n[:, :6], Y_AB, B_AB)
             - 0.5 * (((c - Y_C) / S_C) ** 2).sum(-1))
    keys, inverse = np.unique(n, axis=0, return_inverse=True)
    log_q = np.full(len(keys), -np.inf)
    np.logaddexp.at(log_q, inverse.ravel(), log_w)
    return keys, log_q - logsumexp(log_q)


def test_layout_reads_the_marginal_of_a_table():
    layout = count_layout(chain_model, (jnp.asarray(Y_AB), jnp.asarray(Y_C)))
    (site,) = layout.counts
    assert [s.name for s in layout.noise] == ["y_ab", "y_c"] and layout.num_answers == 8
    assert site.name == "n" and site.batch_shape == () and int(site.totals) == NC
    # cells of (a, b) enter their own answer; cell (b, c) enters the answer of c
    np.testing.assert_array_equal(site.rows[:6, 0], np.arange(6))
    np.testing.assert_array_equal(site.rows[6:, 0], 6 + np.tile([0, 1], 3))
    np.testing.assert_array_equal(site.coefs[:, 0], np.ones(12))


@pytest.mark.parametrize("moves", [1, 5])
def test_one_update_keeps_the_exact_posterior_of_two_releases(chain_posterior, moves):
    keys, log_q = chain_posterior
    draws = 20_000
    start = keys[np.random.default_rng(moves).choice(len(keys), size=draws, p=np.exp(log_q))]
    after = one_update(chain_model, (jnp.asarray(Y_AB), jnp.asarray(Y_C)), start, moves, moves)
    assert np.all(after == np.round(after))
    np.testing.assert_array_equal(after[:, :6].reshape(-1, 2, 3).sum(1),
                                  after[:, 6:].reshape(-1, 3, 2).sum(2))
    assert_law_kept(after, start, *moments(keys, log_q))


# ------------------------------------------------------------------------------------------------
# two regions in a plate (N = 4 and 5), each released, and a national total over both
# ------------------------------------------------------------------------------------------------
NET2 = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
P2 = np.array([0.5, 0.3, 0.15, 0.05])
TOTALS = np.array([4, 5])
Y_REG = np.array([[2.6, 0.4, 1.8, -0.9], [1.1, 2.7, 0.2, 1.4]])
Y_NAT, B_REG, B_NAT = np.array([4.1, 2.2, 2.9, 0.3]), 1.0, 2.0


def regions_model(y_reg, y_nat):
    with numpyro.plate("region", 2):
        n = numpyro.sample("n", CollectiveGraphicalModel(NET2, jnp.log(jnp.asarray(P2)),
                                                         TOTALS))
        numpyro.sample("y", LaplaceNoise(n, B_REG), obs=y_reg)
    numpyro.sample("y_nat", LaplaceNoise(n.sum(0), B_NAT), obs=y_nat)


@pytest.fixture(scope="module")
def regions_posterior():
    first, second = compositions(4, 4), compositions(5, 4)
    i, j = np.meshgrid(np.arange(len(first)), np.arange(len(second)), indexing="ij")
    n = np.stack([first[i.ravel()], second[j.ravel()]], axis=1)  # (pairs, 2, 4)
    log_w = (log_multinomial(n[:, 0], P2) + log_multinomial(n[:, 1], P2)
             + laplace_loglik(n[:, 0], Y_REG[0], B_REG) + laplace_loglik(n[:, 1], Y_REG[1], B_REG)
             + laplace_loglik(n.sum(1), Y_NAT, B_NAT))
    return n, log_w - logsumexp(log_w)


def test_layout_of_a_plate_and_a_national_total():
    layout = count_layout(regions_model, (jnp.asarray(Y_REG), jnp.asarray(Y_NAT)))
    (site,) = layout.counts
    assert site.batch_shape == (2,) and list(site.totals) == [4, 5]
    assert [s.name for s in layout.noise] == ["y", "y_nat"]
    # every cell of region r enters its region's answer and the national one
    expected = np.stack([np.arange(8), 8 + np.tile(np.arange(4), 2)], axis=1)
    np.testing.assert_array_equal(np.sort(site.rows, axis=1), expected)


def test_one_update_keeps_the_exact_posterior_of_regions_and_their_total(regions_posterior):
    tables, log_q = regions_posterior
    draws = 20_000
    start = tables[np.random.default_rng(3).choice(len(tables), size=draws, p=np.exp(log_q))]
    after = one_update(regions_model, (jnp.asarray(Y_REG), jnp.asarray(Y_NAT)), start, 3, 4)
    np.testing.assert_array_equal(after.sum(-1), np.broadcast_to(TOTALS, after.shape[:2]))
    mean, sd = moments(tables.reshape(len(tables), -1), log_q)
    assert_law_kept(after.reshape(draws, -1), start.reshape(draws, -1), mean, sd)


# ------------------------------------------------------------------------------------------------
# a prior on θ: one attribute of three levels, the user's own coding
# ------------------------------------------------------------------------------------------------
NET1 = MarkovNetwork({"a": 3}, [("a",)])
N1, B1, S1 = 12, 2.0, 1.5
Y1 = np.array([11.0, 0.5, -0.5])


def prior_model(y):
    phi = numpyro.sample("phi", dist.Normal(0.0, S1).expand([2]).to_event(1))
    theta = jnp.concatenate([jnp.zeros(1), phi])  # log odds against level 0
    n = numpyro.sample("n", CollectiveGraphicalModel(NET1, theta, total_count=N1))
    numpyro.deterministic("mu", jax.nn.softmax(theta))
    numpyro.sample("y", LaplaceNoise(n, B1), obs=y)


@pytest.fixture(scope="module")
def prior_posterior():
    """Posterior of ``n`` and ``μ`` by Gauss–Hermite quadrature over ``φ``."""
    x, w = np.polynomial.hermite_e.hermegauss(120)
    p1, p2 = np.meshgrid(S1 * x, S1 * x, indexing="ij")
    logits = np.stack([np.zeros_like(p1), p1, p2], -1)
    mu = np.exp(logits - logsumexp(logits, -1, keepdims=True)).reshape(-1, 3)
    tables = compositions(N1, 3)
    log_joint = ((np.log(w)[:, None] + np.log(w)[None, :]).reshape(-1, 1)
                 + log_multinomial(tables[None], mu[:, None])
                 + laplace_loglik(tables, Y1, B1)[None])
    return (moments(tables, logsumexp(log_joint, axis=0)),
            moments(mu, logsumexp(log_joint, axis=1)))


def test_run_nuts_samples_a_users_model_with_exact_tables(prior_posterior):
    (n_mean, n_sd), (mu_mean, mu_sd) = prior_posterior
    mcmc = run_nuts(prior_model, jax.random.key(2), jnp.asarray(Y1), num_warmup=500,
                    num_samples=4000, num_chains=2)
    assert mcmc.path == "exact" and "'n'" in mcmc.path_reason and "'phi'" in mcmc.path_reason
    s = mcmc.get_samples()
    assert np.all(np.asarray(s["n"]) == np.round(np.asarray(s["n"])))
    np.testing.assert_allclose(np.asarray(s["n"]).mean(0), n_mean, atol=0.10)
    np.testing.assert_allclose(np.asarray(s["n"]).std(0), n_sd, atol=0.10)
    np.testing.assert_allclose(np.asarray(s["mu"]).mean(0), mu_mean, atol=0.012)
    np.testing.assert_allclose(np.asarray(s["mu"]).std(0), mu_sd, atol=0.012)
    assert mcmc.convergence.max_r_hat <= 1.01
    extra = mcmc.get_extra_fields(group_by_chain=True)
    assert {"num_steps", "diverging", "accept_prob"} <= set(extra)


def test_cgm_gibbs_composes_in_numpyro_mcmc(prior_posterior):
    (n_mean, _), _ = prior_posterior
    mcmc = MCMC(CGMGibbs(NUTS(prior_model)), num_warmup=300, num_samples=3000,
                num_chains=2, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(5), jnp.asarray(Y1), extra_fields=("num_steps",))
    n = mcmc.get_samples(group_by_chain=True)["n"]
    np.testing.assert_allclose(np.asarray(n).reshape(-1, 3).mean(0), n_mean, atol=0.12)
    assert convergence_figures(mcmc.get_samples(group_by_chain=True), ["n", "phi"]).max_r_hat \
        <= 1.02


def test_theta_fixed_runs_the_record_moves_alone(chain_posterior):
    keys, log_q = chain_posterior
    mean, _ = moments(keys, log_q)
    mcmc = run_nuts(chain_model, jax.random.key(1), jnp.asarray(Y_AB), jnp.asarray(Y_C),
                    num_warmup=100, num_samples=3000, num_chains=2)
    assert mcmc.path == "exact" and "NUTS" not in mcmc.path_reason
    np.testing.assert_allclose(np.asarray(mcmc.get_samples()["n"]).mean(0), mean, atol=0.10)


# ------------------------------------------------------------------------------------------------
# models the record moves cannot update: the error names the site
# ------------------------------------------------------------------------------------------------
def _cgm():
    return numpyro.sample("n", CollectiveGraphicalModel(NET2, jnp.zeros(4), 10))


def latent_reader(y):
    n = _cgm()
    z = numpyro.sample("z", dist.Normal(n.sum() / 10.0, 1.0))
    numpyro.sample("y", LaplaceNoise(n + z, 1.0), obs=y)


def foreign_reader(y):
    n = _cgm()
    numpyro.sample("y", dist.Poisson(n + 1.0).to_event(1), obs=y)


def nonlinear_reader(y):
    n = _cgm()
    numpyro.sample("y", LaplaceNoise(n**2, 1.0), obs=y)


def scaled_reader(y):
    n = _cgm()
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("y", LaplaceNoise(s * n, 1.0), obs=y)


def no_counts(y):
    numpyro.sample("y", LaplaceNoise(jnp.zeros(4), 1.0), obs=y)


@pytest.mark.parametrize(("model", "words"), [
    (latent_reader, ["latent site 'z'", "'n'"]),
    (foreign_reader, ["observed site 'y'", "Poisson"]),
    (nonlinear_reader, ["'y'", "not an affine function"]),
    (scaled_reader, ["'y'", "changes with other latent sites"]),
    (no_counts, ["no latent site with an exact"]),
])
def test_models_outside_the_class_get_an_error_naming_the_site(model, words):
    with pytest.raises(CountSiteError) as err:
        count_layout(model, (jnp.ones(4),))
    for w in words:
        assert w in str(err.value)


def test_non_decomposable_network_is_refused_by_name():
    cycle = MarkovNetwork({"a": 2, "b": 2, "c": 2, "d": 2},
                          [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])

    def model(y):
        n = numpyro.sample("n", CollectiveGraphicalModel(cycle, jnp.zeros(16), 10))
        numpyro.sample("y", LaplaceNoise(n, 1.0), obs=y)

    with pytest.raises(ValueError, match="'n'"):
        RecordMoves(model).init(jax.random.key(0), 0, None, (jnp.ones(16),), None)


def test_starting_tables_are_checked():
    kernel = RecordMoves(regions_model)
    bad = np.zeros((2, 4))
    bad[:, 0] = [4, 4]  # the second region holds 5 records
    args = (jnp.asarray(Y_REG), jnp.asarray(Y_NAT))
    with pytest.raises(ValueError, match="sum to total_count"):
        kernel.init(jax.random.key(0), 0, {"n": bad}, args, None)
    for tables in itertools.islice(compositions(4, 4), 1):
        good = np.stack([tables, [5, 0, 0, 0]]).astype(float)
        state = kernel.init(jax.random.key(0), 0, {"n": good}, args, None)
        assert state.records[0].shape == (2, 5, 2)


# ------------------------------------------------------------------------------------------------
# the relaxed path of the same models: the relax handler, run_svi
# ------------------------------------------------------------------------------------------------
def test_relax_swaps_exact_sites_for_the_relaxed_density_inside_plates():
    from numpyro import handlers

    from numpyro_dpgm.infer.bayes import relax

    tr = handlers.trace(handlers.seed(relax(regions_model), 0)).get_trace(
        jnp.asarray(Y_REG), jnp.asarray(Y_NAT))
    fn = tr["n"]["fn"]
    assert fn.batch_shape == (2,) and getattr(fn, "base_dist", fn).relaxed
    assert not fn.support.is_discrete
    # a plate over a CGM without a batch of totals expands it; relax goes through the wrapper
    def expanded():
        with numpyro.plate("r", 3):
            numpyro.sample("m", CollectiveGraphicalModel(NET2, jnp.zeros(4), 5))

    fn = handlers.trace(handlers.seed(relax(expanded), 0)).get_trace()["m"]["fn"]
    assert fn.batch_shape == (3,) and fn.base_dist.relaxed


def test_run_svi_fits_a_users_model_on_the_relaxed_path_and_says_so():
    from numpyro_dpgm.infer.bayes import run_svi

    fit = run_svi(prior_model, jax.random.key(0), jnp.asarray(Y1), num_steps=1500,
                  num_samples=500)
    assert fit.path == "relaxed" and "'n'" in fit.path_reason
    n = np.asarray(fit.samples["n"])
    assert n.shape == (500, 3) and np.allclose(n.sum(-1), N1)
    # the release says 11 of the 12 records are at level 0
    assert 9.0 < n[:, 0].mean() <= 12.0


def regions_apart_model(y_reg):
    with numpyro.plate("region", 2):
        n = numpyro.sample("n", CollectiveGraphicalModel(NET2, jnp.log(jnp.asarray(P2)),
                                                         TOTALS))
        numpyro.sample("y", LaplaceNoise(n, B_REG), obs=y_reg)


def test_regions_that_share_no_answer_move_in_parallel_and_keep_the_law():
    from numpyro_dpgm.infer.bayes.count_gibbs import _site_plans

    (site,) = _site_plans(count_layout(regions_apart_model, (jnp.asarray(Y_REG),)))
    np.testing.assert_array_equal(site.local, [[0, 1, 2, 3], [4, 5, 6, 7]])
    coupled = count_layout(regions_model, (jnp.asarray(Y_REG), jnp.asarray(Y_NAT)))
    assert _site_plans(coupled)[0].local is None
    first, second = compositions(4, 4), compositions(5, 4)
    log_p = [log_multinomial(t, P2) + laplace_loglik(t, Y_REG[r], B_REG)
             for r, t in enumerate((first, second))]
    rng = np.random.default_rng(5)
    draws = 20_000
    start = np.stack([t[rng.choice(len(t), size=draws, p=np.exp(lp - logsumexp(lp)))]
                      for t, lp in zip((first, second), log_p, strict=True)], axis=1)
    after = one_update(regions_apart_model, (jnp.asarray(Y_REG),), start, 3, 6)
    for r, (t, lp) in enumerate(zip((first, second), log_p, strict=True)):
        assert_law_kept(after[:, r], start[:, r], *moments(t, lp))
