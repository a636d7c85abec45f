"""The collapsed Gibbs sampler (:mod:`numpyro_dpgm.infer.bayes.collapse`) against closed forms.

* The release's Gaussian log likelihood ``log N(y; Nμ, Q NΣ Qᵀ + diag v)`` by the junction-tree
  pass (:mod:`~numpyro_dpgm.infer.bayes.collapsed_tree`) and its gradient against a dense
  computation from the brute-force joint (``jax.scipy.stats.multivariate_normal``, autodiff), to
  1e-8, on a chain (12 cells, a one-way table released beside the two-way ones), on a tree
  with a clique of two children (24 cells, a query answer) and on two components.
* The draw of ``n`` given ``(θ, v, y)``: its mean and covariance, as affine maps of ``ξ``,
  against the closed-form Gaussian conditional to 1e-8; 100,000 draws within five standard
  errors of both; the answers' prior draws (``y`` unobserved) by their mean and covariance.
* The inverse Gaussian draws: Kolmogorov–Smirnov against SciPy's law, mean within five standard
  errors.
* The posterior means of ``μ`` on the 12-cell model (N = 200, Laplace b = 2) against the exact
  path (record swaps + NUTS, :func:`~numpyro_dpgm.infer.bayes.run_nuts` with ``exact=True``,
  2 × 10,000 draws, stored in :data:`EXACT_MU`; the slow test re-derives it).
"""

from __future__ import annotations

import functools
import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.stats import multivariate_normal
from numpyro import handlers
from numpyro.diagnostics import effective_sample_size
from numpyro.infer.util import log_density
from scipy import stats

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import (
    CollectiveGraphicalModel,
    DiscreteLaplaceNoise,
    GaussianNoise,
    LaplaceNoise,
)
from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
from numpyro_dpgm.infer.bayes.collapse import collapse, collapse_plan
from numpyro_dpgm.infer.bayes.collapsed_tree import (
    TreeReleaseNormal,
    release_tree,
    tree_log_likelihood,
)
from numpyro_dpgm.infer.bayes.count_sites import CountSiteError
from numpyro_dpgm.infer.bayes.laplace_mixture import inverse_gaussian, noise_variances
from numpyro_dpgm.infer.bayes.nuts import user_collapse
from numpyro_dpgm.infer.bayes.paths import (
    choose_path,
    collapsed_fit,
    collapsed_size,
    released_log_odds,
)
from numpyro_dpgm.infer.diagnostics import to_inference_data
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.oracles import junction_tree as jt

TOTAL = 200
AB = np.array([[40.0, 10, 30], [20, 60, 40]])
BC = np.array([[50.0, 10], [30, 40], [20, 50]])


def release(noise=None, one_way: bool = False) -> list[Measurement]:
    """The tables of ``a – b – c`` (12 cells) with Laplace noise (b = 2) drawn from seed 0,
    modelled as ``noise`` (default ``Laplace(2)``); optionally the one-way table of ``c``."""
    noise = Laplace(2.0) if noise is None else noise
    rng = np.random.default_rng(0)
    out = [Measurement(("a", "b"), AB + rng.laplace(0, 2, AB.shape), noise),
           Measurement(("b", "c"), BC + rng.laplace(0, 2, BC.shape), noise)]
    if one_way:
        c = BC.sum(0)
        out.append(Measurement(("c",), c + rng.laplace(0, 2, c.shape), noise))
    return out


NET = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])


def indicators(net: MarkovNetwork) -> np.ndarray:
    """``Φ``: per cell of the flat layout, which joint cells it sums (``(num_params, |X|)``)."""
    dom = net.domain
    joint = list(np.ndindex(*dom.shape))
    phi = np.zeros((net.num_params, len(joint)))
    for j, x in enumerate(joint):
        for c in net.cliques:
            idx = np.ravel_multi_index(tuple(x[dom.attrs.index(a)] for a in c), dom.shape_of(c))
            phi[net.offsets[net.clique_index(c)] + idx, j] = 1.0
    return phi


def dense_moments(model, phi):
    """``Nμ`` and ``NΣ`` of the tables from the brute-force joint ``p_θ``."""
    ind = jnp.asarray(indicators(model.network))
    p = jax.nn.softmax(ind.T @ model.coding.to_theta(phi))
    mean = ind @ p
    return TOTAL * mean, TOTAL * ((ind * p) @ ind.T - jnp.outer(mean, mean))


def read_out(model) -> jnp.ndarray:
    return jax.jacfwd(model.predict)(jnp.zeros(model.network.num_params))


def dense_log_likelihood(model, phi, v):
    mean, cov = dense_moments(model, phi)
    q = read_out(model)
    return multivariate_normal.logpdf(jnp.asarray(model.y), q @ mean,
                                      q @ cov @ q.T + jnp.diag(v))


def star_release() -> tuple[MarkovNetwork, list[Measurement]]:
    """``b`` shared by three cliques (a clique of two children in the junction tree), 24 cells;
    released: two tables, one two-way marginal of the third and a query of it."""
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2, "d": 2}, [("a", "b"), ("b", "c"), ("b", "d")])
    rng = np.random.default_rng(7)
    tables = {c: rng.uniform(5, 40, net.domain.shape_of(c)) for c in net.cliques}
    noise = Laplace(2.0)
    return net, [Measurement(("a", "b"), tables[("a", "b")], noise),
                 Measurement(("c", "b"), tables[("b", "c")].T, noise),
                 Measurement(("d",), tables[("b", "d")].sum(0), noise),
                 Measurement(("b", "d"), np.array([30.0]), noise,
                             query=np.array([[1.0, -1.0, 0.5, 0.0, 2.0, 1.0]]))]


def forest_release() -> tuple[MarkovNetwork, list[Measurement]]:
    """Two components, ``a – b`` and ``c`` (8 cells): the junction tree joins them by an empty
    separator."""
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("c",)])
    noise = Laplace(2.0)
    return net, [Measurement(("a", "b"), AB + 3.0, noise),
                 Measurement(("c",), np.array([150.0, 47.0]), noise)]


RELEASES = {"chain": lambda: (NET, release(one_way=True)), "star": star_release,
            "forest": forest_release}


class Passes:
    """The collapse plan's passes for the library's model (its one count site ``n``), as
    :class:`~numpyro_dpgm.infer.bayes.collapse.collapse` runs them."""

    def __init__(self, model):
        self.model = model
        self.site = collapse_plan(model.with_cgm(False), (), {"y": model.y}).sites[0]
        self.tree, self.plan = self.site.tree, self.site.tree.plan

    def release(self, phi, v):
        """The answers' law at ``φ`` and noise variances ``v``, the tables integrated out."""
        theta = self.model.latent_theta(self.model.coding.to_theta(phi))
        conds = self.site.functions.conditionals(theta, self.model.normalized)
        return TreeReleaseNormal(self.tree, conds, self.site.total, v,
                                 functions=self.site.functions.tree)

    def conditional_tables(self, release, y, xi):
        """``n`` drawn from its conditional given ``(θ, v, y)`` at standard normal ``ξ``."""
        fns = self.site.functions
        z = fns.tree.coordinates(release.conditionals, y - release.loc, release.cov_diag, xi)
        return fns.tables(release.conditionals, z)


@pytest.fixture(scope="module", params=list(RELEASES))
def setup(request):
    net, ms = RELEASES[request.param]()
    model = noisy_marginals_model(net, ms, TOTAL)
    rng = np.random.default_rng(1)
    phi = jnp.asarray(rng.normal(0.0, 0.7, model.coding.dim))
    v = jnp.asarray(rng.uniform(2.0, 30.0, model.y.size))
    return model, Passes(model), phi, v


def test_log_likelihood_and_gradient_match_dense(setup):
    model, cm, phi, v = setup
    y = jnp.asarray(model.y)

    def ours(phi, v):
        return cm.release(phi, v).log_prob(y)

    def dense(phi, v):
        return dense_log_likelihood(model, phi, v)

    net = model.network  # the brute-force layout agrees with the junction tree's marginals
    mu = net.flatten(jt.marginals(net, model.coding.to_theta(phi)))
    np.testing.assert_allclose(TOTAL * mu, dense_moments(model, phi)[0], rtol=1e-10)
    value, grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1)))(phi, v)
    ref, ref_grads = jax.jit(jax.value_and_grad(dense, argnums=(0, 1)))(phi, v)
    np.testing.assert_allclose(value, ref, rtol=1e-10)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-8 * float(jnp.max(jnp.abs(r))))


def real_size_release(star: bool) -> tuple[MarkovNetwork, list[Measurement], int]:
    """226,051 records on a chain ``a – b – c – d`` of 9, 15, 6 and 16 levels (the collapsed
    benchmark's cliques: 135, 90 and 96 cells), or a star of them around ``b``; Laplace b = 3."""
    levels = {"a": 9, "b": 15, "c": 6, "d": 16}
    edges = ([("a", "b"), ("b", "c"), ("b", "d")] if star
             else [("a", "b"), ("b", "c"), ("c", "d")])
    net = MarkovNetwork(levels, edges)
    rng = np.random.default_rng(11)
    total = 226_051
    return net, [Measurement(c, rng.dirichlet(np.full(net.domain.size(c), 0.5)).reshape(
        net.domain.shape_of(c)) * total + rng.laplace(0, 3.0, net.domain.shape_of(c)),
        Laplace(3.0)) for c in edges], total


@pytest.mark.parametrize("star", [False, True])
def test_structured_pass_matches_dense_factors_at_real_size(star):
    """The diagonal-plus-low-rank pass (``form="low_rank"``) against dense factors of every
    clique, value to 1e-10 and gradient to 1e-7 relative, at 226,051 records (counts up to
    ~10⁴, noise variance 18: the scales where cancellation would show); an unknown form is
    refused by name."""
    net, ms, total = real_size_release(star)
    model = noisy_marginals_model(net, ms, total)
    cm = Passes(model)
    y = jnp.asarray(model.y)
    rng = np.random.default_rng(2)  # near the released log odds, at a posterior's spread
    phi = released_log_odds(model) + 0.02 * jnp.asarray(rng.normal(size=model.coding.dim))
    v = jnp.asarray(rng.uniform(5.0, 60.0, y.size))

    def log_lik(phi, v, form):
        release = cm.release(phi, v)
        return tree_log_likelihood(cm.tree, release.conditionals, release.total,
                                   y - release.loc, v, form=form)

    fast = jax.jit(jax.value_and_grad(functools.partial(log_lik, form="low_rank"),
                                      argnums=(0, 1)))
    slow = jax.jit(jax.value_and_grad(functools.partial(log_lik, form="dense"),
                                      argnums=(0, 1)))
    (value, grads), (ref, ref_grads) = fast(phi, v), slow(phi, v)
    np.testing.assert_allclose(value, ref, rtol=1e-10)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-7, atol=1e-7 * float(jnp.max(jnp.abs(r))))
    with pytest.raises(ValueError, match="form must be one of"):
        log_lik(phi, v, "sparse")


def test_release_tree_refuses_an_answer_across_cliques():
    """An answer that reads two junction-tree cliques cannot be assigned to one."""
    model = noisy_marginals_model(NET, release(), TOTAL)
    plan = Passes(model).plan
    with pytest.raises(ValueError, match="reads the tables of"):
        release_tree(plan, lambda n: jnp.sum(n, keepdims=True))


def test_gaussian_noise_model_density():
    """With Gaussian noise, ``v = σ²`` is fixed: under ``collapse`` the library's model has no
    ``n_v`` site, and its ``n_release`` site is the dense law."""
    model = noisy_marginals_model(NET, release(Gaussian(3.0)), TOTAL)
    exact = model.with_cgm(False)
    kwargs = {"y": model.y}
    plan = collapse_plan(exact, (), kwargs)
    phi = jnp.asarray(np.random.default_rng(3).normal(0.0, 0.5, model.coding.dim))

    sites = []

    @jax.jit
    def densities(phi):
        _, trace = log_density(collapse(exact, plan), (), kwargs,
                               {"phi": phi, "n_xi": jnp.zeros(plan.dim)})
        sites.extend(trace)
        site = trace["n_release"]
        return site["fn"].log_prob(site["value"]), trace["phi"]["value"]

    ours, phi_site = densities(phi)
    assert "n_v" not in sites and "n" in sites
    ref = jax.jit(dense_log_likelihood, static_argnums=0)(model, phi, jnp.full(model.y.size, 9.0))
    np.testing.assert_allclose(ours, ref, rtol=1e-10)
    np.testing.assert_allclose(phi_site, phi, rtol=1e-12)


def test_conditional_tables_match_closed_form(setup):
    model, cm, phi, v = setup
    y = jnp.asarray(model.y)
    q = read_out(model)

    @jax.jit
    def closed_form(phi):
        mean, cov = dense_moments(model, phi)
        gain = cov @ q.T @ jnp.linalg.inv(q @ cov @ q.T + jnp.diag(v))
        return mean + gain @ (y - q @ mean), cov - gain @ q @ cov

    c_mean, c_cov = closed_form(phi)

    @jax.jit
    def draws(phi, xi):
        """Tables drawn at ``ξ`` (``(draws, dim)``), and the affine map's matrix."""
        release = cm.release(phi, v)

        def draw(x):
            return cm.conditional_tables(release, y, x)

        return jax.vmap(draw)(xi), jax.jacfwd(draw)(jnp.zeros(xi.shape[1]))

    dim = cm.plan.dim
    xi = jax.random.normal(jax.random.key(4), (100_000, dim))
    n, jac = draws(phi, jnp.concatenate([jnp.zeros((1, dim)), xi]))
    np.testing.assert_allclose(n[0], c_mean, rtol=1e-10)
    np.testing.assert_allclose(jac @ jac.T, c_cov, atol=1e-8 * float(jnp.max(c_cov)))
    # the random draws: 100,000 of them, mean and covariance within five standard errors
    n = n[1:]
    sd = jnp.sqrt(jnp.diagonal(c_cov))
    assert np.all(np.abs(n.mean(0) - c_mean) <= 5 * sd / np.sqrt(len(n)))
    emp = jnp.cov(n.T)
    se = jnp.sqrt((jnp.outer(sd**2, sd**2) + c_cov**2) / len(n))
    assert np.all(np.abs(emp - c_cov) <= 5 * se + 1e-9)


def test_release_law_samples(setup):
    """``TreeReleaseNormal.sample``: 100,000 answers, mean and covariance within five standard
    errors of ``(Q Nμ, Q NΣ Qᵀ + diag v)`` from the brute-force joint."""
    model, cm, phi, v = setup
    q = read_out(model)
    mean, cov = dense_moments(model, phi)
    c_mean, c_cov = q @ mean, q @ cov @ q.T + jnp.diag(v)
    release = cm.release(phi, v)
    np.testing.assert_allclose(release.mean, c_mean, rtol=1e-10)
    ys = jax.jit(lambda k: release.sample(k, (100_000,)))(jax.random.key(8))
    assert ys.shape == (100_000, model.y.size)
    sd = jnp.sqrt(jnp.diagonal(c_cov))
    assert np.all(np.abs(ys.mean(0) - c_mean) <= 5 * sd / np.sqrt(len(ys)))
    se = jnp.sqrt((jnp.outer(sd**2, sd**2) + c_cov**2) / len(ys))
    assert np.all(np.abs(jnp.cov(ys.T) - c_cov) <= 5 * se + 1e-9)


@pytest.mark.parametrize("mean,shape", [(1.0, 1.0), (0.05, 4.0), (30.0, 0.25)])
def test_inverse_gaussian(mean, shape):
    x = np.asarray(jax.jit(inverse_gaussian)(jax.random.key(5), jnp.full(200_000, mean), shape))
    law = stats.invgauss(mean / shape, scale=shape)
    assert stats.kstest(x, law.cdf).pvalue > 1e-3
    assert abs(x.mean() - mean) <= 5 * np.sqrt(mean**3 / shape / x.size)
    assert np.all(x > 0)


def test_noise_variances_mean():
    """``E[1/v | e] = 1/(b|e|)`` (5); tiny and zero errors give finite, positive ``v``."""
    e = jnp.array([0.5, 3.0, -12.0, 1e-12, 0.0])
    draw = jax.jit(jax.vmap(lambda k: noise_variances(k, e, jnp.full(5, 2.0))))
    inv = 1.0 / draw(jax.random.split(jax.random.key(6), 100_000))
    assert np.all(np.isfinite(inv)) and np.all(inv > 0)
    target = 1.0 / (2.0 * np.abs(np.asarray(e[:3])))
    se = np.sqrt(target**3 * 4.0 / inv.shape[0])
    assert np.all(np.abs(np.asarray(inv[:, :3].mean(0)) - target) <= 5 * se)


#: Posterior means, standard deviations and bulk ESS of ``μ`` by the exact path:
#: ``run_nuts(noisy_marginals_model(NET, release(), 200), jax.random.key(11), exact=True,
#: num_warmup=1000, num_samples=10000, num_chains=2)`` (:func:`test_exact_reference`).
EXACT_MU = {
    "mean": [0.218727, 0.051136, 0.121326, 0.079916, 0.315223, 0.213672, 0.248162, 0.050481,
             0.14887, 0.217489, 0.123158, 0.21184],
    "sd": [0.032605, 0.019048, 0.025662, 0.023963, 0.034536, 0.030793, 0.032446, 0.019455,
           0.026832, 0.030427, 0.026906, 0.03214],
    "ess": [20668, 18899, 21457, 16849, 24093, 23126, 23561, 12174, 23378, 25124, 17484, 20548],
}


def mu_summary(mcmc) -> tuple[np.ndarray, np.ndarray]:
    """Posterior means of ``μ`` and their Monte Carlo standard errors (bulk ESS)."""
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    ess = np.asarray(effective_sample_size(draws))
    flat = draws.reshape(-1, draws.shape[-1])
    return flat.mean(0), flat.std(0) / np.sqrt(ess)


#: Allowance for the normal relaxation's bias in the posterior means of μ on this model (the
#: prototype measured 0.0015 at most against 2 × 10,000 exact draws).
BIAS = 0.0015


def test_posterior_mu_matches_exact_path():
    """Each cell's posterior mean of μ within four combined Monte Carlo standard errors plus
    :data:`BIAS` of the exact path's (MC standard errors from the bulk ESS of each run)."""
    model = noisy_marginals_model(NET, release(), TOTAL)
    mcmc = run_nuts(model, jax.random.key(2), collapsed=True, num_warmup=300,
                    num_samples=1500, num_chains=1, check=False)
    samples = mcmc.get_samples()
    assert {"phi", "theta", "mu", "n", "n_v"} <= set(samples)
    assert mcmc.path == "collapsed" and mcmc.path_reason
    mean, se = mu_summary(mcmc)
    ref = np.asarray(EXACT_MU["mean"])
    ref_se = np.asarray(EXACT_MU["sd"]) / np.sqrt(np.asarray(EXACT_MU["ess"]))
    tol = 4 * np.sqrt(se**2 + ref_se**2) + BIAS
    assert np.all(np.abs(mean - ref) <= tol), (mean - ref, tol)
    assert np.allclose(np.asarray(samples["n"]).sum(-1), 2 * TOTAL)  # two tables of N each


@pytest.mark.slow
def test_exact_reference():
    """The exact path still gives :data:`EXACT_MU` (fewer draws, within MC error)."""
    model = noisy_marginals_model(NET, release(), TOTAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = run_nuts(model, jax.random.key(12), exact=True, num_warmup=500,
                        num_samples=3000, num_chains=2, check=False)
    mean, se = mu_summary(mcmc)
    ref_se = np.asarray(EXACT_MU["sd"]) / np.sqrt(np.asarray(EXACT_MU["ess"]))
    assert np.all(np.abs(mean - np.asarray(EXACT_MU["mean"]))
                  <= 4 * np.sqrt(se**2 + ref_se**2))


def large_release(total: int, values: int = 12) -> tuple[MarkovNetwork, list[Measurement]]:
    """A chain ``a – b – c`` of ``values`` levels each (``2 values²`` coordinates), its two
    tables of ``total`` uniform records released with Laplace noise (b = 3)."""
    net = MarkovNetwork({"a": values, "b": values, "c": values}, [("a", "b"), ("b", "c")])
    table = np.full((values, values), total / values**2)
    rng = np.random.default_rng(1)
    return net, [Measurement(c, table + rng.laplace(0, 3, table.shape), Laplace(3.0))
                 for c in net.cliques]


def test_size_rule_counts_every_table_together():
    """The normal relaxation's coordinates of all latent tables together decide, and the
    sparsest table's records per cell: each within the rule's bounds or a reason why not."""
    from numpyro_dpgm.distributions.normal_cgm import normal_tables_plan
    from numpyro_dpgm.infer.bayes.paths import COLLAPSED_MIN_COUNT, COLLAPSED_MIN_DIM

    net, _ = large_release(100_000)
    dim = normal_tables_plan(net).dim
    assert COLLAPSED_MIN_DIM <= dim and 2 * dim > COLLAPSED_MIN_DIM
    assert collapsed_size([(net, 100_000.0)]) is None
    assert collapsed_size([(net, 100_000.0), (net, 100_000.0)]) is None
    largest = max(net.domain.size(c) for c in net.cliques)
    sparse = COLLAPSED_MIN_COUNT * largest * 0.99
    assert "records per cell" in collapsed_size([(net, 100_000.0), (net, sparse)])
    assert "coordinates" in collapsed_size([(NET, TOTAL)])


def test_choose_path_collapsed_by_rule():
    """The collapsed path by default on a large release of many records per cell, and not on
    a small release, a sparse one, a fixed θ or a batch of releases; ``collapsed=True`` says
    why it cannot run; ``exact`` and ``collapsed=False`` are obeyed."""
    net, ms = large_release(100_000)
    model = noisy_marginals_model(net, ms, 100_000)
    start = model.starting_point("uniform")
    path, reason = choose_path(model, None, start)
    assert path == "collapsed" and "288 coordinates" in reason
    assert choose_path(model, True, start)[0] == "exact"
    assert choose_path(model, None, start, collapsed=False)[0] != "collapsed"
    assert choose_path(model, None, start, one_release=False)[0] != "collapsed"
    with pytest.raises(ValueError, match="batch of releases"):
        choose_path(model, None, start, collapsed=True, one_release=False)
    sparse = noisy_marginals_model(net, ms, 1_000)  # 6.9 records per cell of a table
    assert choose_path(sparse, None, start)[0] != "collapsed"
    assert "records per cell" in collapsed_fit(sparse)
    assert choose_path(sparse, None, start, collapsed=True)[0] == "collapsed"
    fixed = noisy_marginals_model(net, ms, 100_000, theta=np.zeros(net.num_params))
    with pytest.raises(ValueError, match="θ is fixed"):
        choose_path(fixed, None, {}, collapsed=True)
    small = noisy_marginals_model(NET, release(), TOTAL)
    assert "coordinates" in collapsed_fit(small)
    reference = noisy_marginals_model(net, ms, 100_000, coding="reference")
    assert choose_path(reference, None, reference.starting_point("uniform"))[0] == "collapsed"


def test_run_nuts_collapsed_by_default():
    """``run_nuts`` with its defaults on a large release: the collapsed path, its sites and
    statistics, ``n`` summing to ``N`` per table and near the released counts."""
    net, ms = large_release(100_000, values=11)
    model = noisy_marginals_model(net, ms, 100_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = run_nuts(model, jax.random.key(0), num_warmup=20, num_samples=20, num_chains=1)
    assert mcmc.path == "collapsed" and "large" in mcmc.path_reason
    samples = mcmc.get_samples()
    assert {"phi", "theta", "mu", "n", "n_v", "n_xi"} <= set(samples)
    assert set(mcmc.get_extra_fields()) >= {"diverging", "num_steps"}
    n = np.asarray(samples["n"])
    assert np.allclose(n.sum(-1), 2 * 100_000)
    y = np.concatenate([np.ravel(m.values) for m in ms])
    assert np.median(np.abs(n.mean(0) - y)) < 10  # noise b = 3: mostly within a few counts
    assert mcmc.convergence is not None
    tree = to_inference_data(mcmc, model, log_likelihood=True)
    assert tree["posterior"].attrs["cgm_path"] == "collapsed"
    assert tree["posterior_predictive"]["y"].shape == (1, 20, y.size)
    assert tree["posterior"]["n"].dims[-1] == "cell"


# --- a model of your own on the collapsed path (:mod:`numpyro_dpgm.infer.bayes.collapse`) ---

#: The user's model below: Laplace noise on the table of ``(a, b)``, Gaussian noise on two
#: linear queries of ``(b, c)`` with an offset (its ``loc = J n + c``).
USER_B, USER_SIGMA, USER_OFFSET = 2.0, 3.0, 5.0
USER_QUERY = np.array([[1.0, 1.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, -2.0]])


def user_model(y_ab, y_q, total=TOTAL, noise=None):
    """A model of your own on :data:`NET`: ``θ`` in the network's own layout, N(0, 2²)."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 2.0).expand([NET.num_params]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, total))
    noise = LaplaceNoise if noise is None else noise
    numpyro.sample("y_ab", noise(n[NET.slice_of(("a", "b"))], USER_B), obs=y_ab)
    q = jnp.asarray(USER_QUERY) @ n[NET.slice_of(("b", "c"))] + USER_OFFSET
    numpyro.sample("y_q", GaussianNoise(q, USER_SIGMA), obs=y_q)


def user_release() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (AB.ravel() + rng.laplace(0, USER_B, 6),
            USER_QUERY @ BC.ravel() + USER_OFFSET + rng.normal(0, USER_SIGMA, 2))


def user_dense(theta, v):
    """``(J Nμ + c, J NΣ Jᵀ + V, Nμ, NΣ, J)`` of the user's model by brute force."""
    ind = jnp.asarray(indicators(NET))
    p = jax.nn.softmax(ind.T @ theta)
    mean = ind @ p
    cov = TOTAL * ((ind * p) @ ind.T - jnp.outer(mean, mean))
    read = np.zeros((8, NET.num_params))
    read[np.arange(6), np.arange(NET.num_params)[NET.slice_of(("a", "b"))]] = 1.0
    read[6:, NET.slice_of(("b", "c"))] = USER_QUERY
    read = jnp.asarray(read)
    offset = jnp.asarray([0.0] * 6 + [USER_OFFSET] * 2)
    var = jnp.concatenate([v, jnp.full(2, USER_SIGMA**2)])
    return (read @ (TOTAL * mean) + offset, read @ cov @ read.T + jnp.diag(var),
            TOTAL * mean, cov, read)


def test_collapse_density_and_tables_match_closed_form():
    """Under :class:`~numpyro_dpgm.infer.bayes.collapse.collapse` the user's model has the
    density ``p(θ) p(v) p(ξ) N(y; J Nμ + c, J NΣ Jᵀ + V)`` (brute-force moments, 1e-8), with
    its gradient in ``θ``; at ``ξ = 0`` its ``n`` is the closed-form conditional mean
    ``Nμ + NΣJᵀ(J NΣ Jᵀ + V)⁻¹(y − J Nμ − c)``; the noise sites are masked."""
    y = user_release()
    plan = collapse_plan(user_model, y)
    assert [s.name for s in plan.sites] == ["n"] and plan.noise == ("y_ab", "y_q")
    rng = np.random.default_rng(5)
    theta = jnp.asarray(rng.normal(0, 0.5, NET.num_params))
    v = jnp.asarray(rng.uniform(2.0, 12.0, 6))
    handled = collapse(user_model, plan)

    def density(theta):
        params = {"theta": theta, "n_v": v, "n_xi": jnp.zeros(plan.dim)}
        lp, _ = log_density(handled, y, {}, params)
        return lp - jnp.sum(dist.Normal(0.0, 2.0).log_prob(theta)) - jnp.sum(
            dist.Exponential(0.5 / USER_B**2).log_prob(v)) - jnp.sum(
            dist.Normal(0.0, 1.0).log_prob(jnp.zeros(plan.dim)))

    def dense(theta):
        loc, cov, *_ = user_dense(theta, v)
        return multivariate_normal.logpdf(jnp.concatenate([jnp.asarray(a) for a in y]),
                                          loc, cov)

    assert np.isclose(density(theta), dense(theta), rtol=1e-10, atol=1e-8)
    assert np.allclose(jax.grad(density)(theta), jax.grad(dense)(theta), atol=1e-8)
    _, tr = log_density(handled, y, {}, {"theta": theta, "n_v": v,
                                         "n_xi": jnp.zeros(plan.dim)})
    loc, cov_y, mean, cov, read = user_dense(theta, v)
    yy = jnp.concatenate([jnp.asarray(a) for a in y])
    expected = mean + cov @ read.T @ jnp.linalg.solve(cov_y, yy - loc)
    assert tr["n"]["type"] == "deterministic"
    assert np.allclose(tr["n"]["value"], expected, atol=1e-8)
    assert float(jnp.sum(tr["y_ab"]["fn"].log_prob(tr["y_ab"]["value"]))) == 0.0


def _offset_model(y_ab, y_q):
    bias = numpyro.sample("bias", dist.Normal(0.0, 1.0))
    theta = numpyro.sample("theta", dist.Normal(0.0, 2.0).expand([NET.num_params]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, TOTAL))
    numpyro.sample("y_ab", LaplaceNoise(n[NET.slice_of(("a", "b"))] + bias, USER_B), obs=y_ab)


def _plate_model(y_ab, y_q):
    theta = numpyro.sample("theta", dist.Normal(0.0, 2.0).expand([NET.num_params]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, jnp.array([TOTAL, TOTAL])))
    numpyro.sample("y_ab", LaplaceNoise(n[:, NET.slice_of(("a", "b"))], USER_B),
                   obs=jnp.stack([y_ab, y_ab]))


def _cross_model(y_ab, y_q):
    theta = numpyro.sample("theta", dist.Normal(0.0, 2.0).expand([NET.num_params]).to_event(1))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET, theta, TOTAL))
    numpyro.sample("y_ab", LaplaceNoise(n[:6] + n[6:12], USER_B), obs=y_ab)


@pytest.mark.parametrize("model, match", [
    (_offset_model, "depends on latent sites"),
    (_plate_model, "batch of tables"),
    (_cross_model, "junction-tree clique"),
    (functools.partial(user_model, noise=DiscreteLaplaceNoise), "discrete noise"),
])
def test_collapse_refuses_with_the_reason(model, match):
    """A model the collapsed path cannot take: an error naming the site and why, from the
    plan and from ``run_nuts(collapsed=True)``; by default the exact path instead."""
    y = user_release()
    y = (np.round(y[0]), y[1])  # integer answers, for the discrete noise
    with pytest.raises(CountSiteError, match=match):
        collapse_plan(model, y)
    with pytest.raises(ValueError, match=f"collapsed=True, but .*{match}"):
        run_nuts(model, jax.random.key(0), *y, collapsed=True, num_warmup=1, num_samples=1)


def test_a_later_release_reuses_the_sites_compiled_passes():
    """Two releases of one model (the same network, read-out and N, other answers): the second
    plan holds the first's tree and compiled passes, with its own answers; another N builds its
    own. The passes take the answers as arguments, so the tables drawn under the second plan
    are those of a plan built afresh (the cache emptied), to the last digit."""
    module = importlib.import_module("numpyro_dpgm.infer.bayes.collapse")  # not the handler

    y1 = user_release()
    y2 = (y1[0] + 7.0, y1[1] - 3.0)
    first, second = collapse_plan(user_model, y1), collapse_plan(user_model, y2)
    assert second.sites[0].functions is first.sites[0].functions
    assert second.sites[0].tree is first.sites[0].tree
    assert not np.allclose(second.sites[0].observed, first.sites[0].observed)
    other = collapse_plan(user_model, y2, {"total": 2 * TOTAL})
    assert other.sites[0].functions is not first.sites[0].functions

    def tables(plan):
        theta = jnp.asarray(np.random.default_rng(5).normal(0, 0.5, NET.num_params))
        data = {"theta": theta, "n_xi": jnp.ones(plan.dim), "n_v": jnp.full(6, 9.0)}
        tr = handlers.trace(handlers.substitute(collapse(user_model, plan), data=data))
        return np.asarray(tr.get_trace(*y2)["n"]["value"])

    cached = tables(second)
    module._SITE_PASSES.clear()
    fresh = collapse_plan(user_model, y2)
    assert fresh.sites[0].functions is not first.sites[0].functions
    np.testing.assert_array_equal(cached, tables(fresh))


def test_collapse_posterior_matches_quadrature():
    """One binary attribute, ``θ = (0, t)``, ``t ∼ N(0, 1)``, N = 1,000, Laplace b = 20 (noise
    wider than the counts' spread, so ``v`` matters): the collapsed path's posterior mean and
    sd of ``t`` and mean of ``n₁`` within five Monte Carlo standard errors of a quadrature of
    ``p(t) ∫ N(n₁; Np, Np(1−p)) Lap(y₀ − N + n₁) Lap(y₁ − n₁) dn₁`` (the normal relaxation's
    posterior, which the path samples)."""
    net, total, b = MarkovNetwork({"a": 2}, [("a",)]), 1000, 20.0
    y = np.array([310.0, 655.0])

    def model(y):
        t = numpyro.sample("t", dist.Normal(0.0, 1.0))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, jnp.stack([0.0, t]), total))
        numpyro.sample("y", LaplaceNoise(n, b), obs=y)

    t = np.linspace(0.0, 1.5, 1501)[:, None]
    n1 = np.linspace(400.0, 900.0, 4001)[None, :]
    p = 1.0 / (1.0 + np.exp(-t))
    log_w = (stats.norm.logpdf(t) + stats.norm.logpdf(n1, total * p, np.sqrt(total * p * (1 - p)))
             + stats.laplace.logpdf(y[0] - total + n1, scale=b)
             + stats.laplace.logpdf(y[1] - n1, scale=b))
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    t_mean = float((w.sum(1) * t[:, 0]).sum())
    t_sd = float(np.sqrt((w.sum(1) * (t[:, 0] - t_mean) ** 2).sum()))
    n1_mean = float((w.sum(0) * n1[0]).sum())
    mcmc = run_nuts(model, jax.random.key(1), y, collapsed=True, num_warmup=400,
                    num_samples=2500, num_chains=2, check=False)
    assert mcmc.path == "collapsed" and "'n'" in mcmc.path_reason
    samples = mcmc.get_samples(group_by_chain=True)
    draws_t, draws_n = np.asarray(samples["t"]), np.asarray(samples["n"])[..., 1]
    for draws, ref in ((draws_t, t_mean), (draws_n, n1_mean)):
        se = draws.std() / np.sqrt(float(effective_sample_size(draws)))
        assert abs(draws.mean() - ref) < 5 * se, (draws.mean(), ref, se)
    se_sd = draws_t.std() / np.sqrt(2 * float(effective_sample_size(draws_t)))
    assert abs(draws_t.std() - t_sd) < 5 * se_sd + 0.01 * t_sd
    assert np.allclose(np.asarray(samples["n"]).sum(-1), total)


def test_user_model_takes_the_collapsed_path_by_rule():
    """A model of your own takes the collapsed path by the library model's size rule (288
    coordinates of 100,000 records), not on a sparse release or with ``exact``/``collapsed``
    saying otherwise, nor where ``θ`` is fixed (``collapsed=True`` then says why)."""
    net, ms = large_release(100_000)
    y = np.concatenate([np.ravel(m.values) for m in ms])

    def model(y, total):
        theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([net.num_params])
                               .to_event(1))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total))
        numpyro.sample("y", LaplaceNoise(n, 3.0), obs=y)

    plan, reason = user_collapse(model, (y, 100_000))
    assert plan.dim == 288 and "'n'" in reason and "large" in reason
    assert user_collapse(model, (y, 1_000)) is None  # 6.9 records per cell of a table
    assert user_collapse(model, (y, 1_000), collapsed=True)[1].endswith("(collapsed=True)")
    assert user_collapse(model, (y, 100_000), exact=True) is None
    assert user_collapse(model, (y, 100_000), collapsed=False) is None

    def fixed(y, total):
        n = numpyro.sample("n", CollectiveGraphicalModel(net, jnp.zeros(net.num_params), total))
        numpyro.sample("y", LaplaceNoise(n, 3.0), obs=y)

    assert user_collapse(fixed, (y, 100_000)) is None
    with pytest.raises(ValueError, match="θ is fixed"):
        user_collapse(fixed, (y, 100_000), collapsed=True)
