"""Property-based tests (hypothesis) of the oracles, the MRF distribution and counting.

Random domains (2 to 5 attributes of 1 to 3 values), random cliques (1 to 3 attributes) and
random log-potentials, from near zero to ±100 per cell, are checked against brute-force
enumeration of the joint (``tests/oracles/brute_force.py``) and against each other:

* junction tree: ``log Z`` and every clique marginal equal brute force; marginals sum to 1;
  calibrated junction-tree cliques agree on their separators; the two triangulations
  (min-fill, min-size) give the same ``log Z``;
* convex_gbp with the Möbius counting numbers equals the exact oracle on random trees;
* MarkovRandomField: ``log_prob`` equals brute force on every record; samples follow the
  joint (total variation below a bound exceeded with probability < 1e-6);
* count tables sum to N and project consistently onto shared attributes.

Every example compiles new programs (the network is static data), so the example counts are
small; ``derandomize=True`` makes every run draw the same examples.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.brute_force import BruteForce, empirical_tv, tv_bound

from numpyro_dpgm import Domain, MarkovNetwork, MarkovRandomField, count
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.oracles.calibration import calibrate_marginals, clique_log_potentials
from numpyro_dpgm.oracles.gbp import convex_gbp
from numpyro_dpgm.oracles.region_graph import build_region_graph
from numpyro_dpgm.tables import project_table

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SCALES = [1e-3, 1.0, 5.0, 30.0, 100.0]


@st.composite
def networks(draw: st.DrawFn, max_attrs: int = 5) -> MarkovNetwork:
    """A random domain and 1 to 4 random cliques of 1 to 3 attributes."""
    n = draw(st.integers(2, max_attrs))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    domain = Domain({f"x{i}": k for i, k in enumerate(sizes)})
    attrs = list(domain)
    cliques = draw(st.lists(
        st.lists(st.sampled_from(attrs), min_size=1, max_size=3, unique=True).map(tuple),
        min_size=1, max_size=4, unique_by=frozenset))
    return MarkovNetwork(domain, cliques)


@st.composite
def thetas(draw: st.DrawFn, network: MarkovNetwork) -> np.ndarray:
    """Log-potentials: a scale from 1e-3 to 100 times uniform [-1, 1], some cells at ±scale."""
    scale = draw(st.sampled_from(SCALES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    theta = scale * rng.uniform(-1, 1, network.num_params)
    extreme = rng.random(network.num_params) < 0.2
    theta[extreme] = scale * rng.choice([-1.0, 1.0], int(extreme.sum()))
    return theta


@settings(max_examples=10, **SETTINGS)
@given(st.data())
def test_junction_tree_equals_brute_force(data: st.DataObject) -> None:
    net = data.draw(networks())
    theta = data.draw(thetas(net))
    exact = BruteForce(net, theta)
    # log Z: against brute force, and between the two triangulations
    for method in ("min_fill", "min_size"):
        log_z = float(jt.log_partition(net, jnp.asarray(theta), method))
        assert abs(log_z - exact.log_z) <= 1e-10 * max(1.0, abs(exact.log_z))
    mu = jt.marginals(net, jnp.asarray(theta))
    for c in net.cliques:
        table = np.asarray(mu[c])
        assert abs(table.sum() - 1.0) < 1e-10 and np.all(table >= 0)
        np.testing.assert_allclose(table, exact.marginal(c), rtol=0, atol=1e-9)
    # calibrated junction-tree cliques agree on every separator, and with brute force
    tree = jt.build_junction_tree(net)
    cal = calibrate_marginals(tree, clique_log_potentials(tree, net, jnp.asarray(theta)))
    assert abs(float(cal.log_z) - exact.log_z) <= 1e-10 * max(1.0, abs(exact.log_z))
    for i, p in enumerate(tree.parent):
        np.testing.assert_allclose(np.asarray(cal.marginals[i]), exact.marginal(tree.cliques[i]),
                                   rtol=0, atol=1e-9)
        if p >= 0 and tree.separators[i]:
            sep = tree.separators[i]
            np.testing.assert_allclose(
                project_table(np.asarray(cal.marginals[i]), tree.cliques[i], sep),
                project_table(np.asarray(cal.marginals[p]), tree.cliques[p], sep),
                rtol=0, atol=1e-10)


@st.composite
def trees(draw: st.DrawFn) -> MarkovNetwork:
    """A random tree of pairwise cliques over 2 to 5 attributes (a random parent array)."""
    n = draw(st.integers(2, 5))
    sizes = draw(st.lists(st.integers(2, 3), min_size=n, max_size=n))
    domain = Domain({f"x{i}": k for i, k in enumerate(sizes)})
    attrs = list(domain)
    parents = [draw(st.integers(0, i - 1)) for i in range(1, n)]
    cliques = [(attrs[p], attrs[i + 1]) for i, p in enumerate(parents)]
    cliques += [(a,) for a in draw(st.lists(st.sampled_from(attrs), max_size=2, unique=True))]
    return MarkovNetwork(domain, cliques)


@settings(max_examples=6, **SETTINGS)
@given(st.data())
def test_convex_gbp_with_moebius_numbers_is_exact_on_trees(data: st.DataObject) -> None:
    net = data.draw(trees())
    scale = data.draw(st.sampled_from([0.1, 1.0, 3.0]))
    theta = scale * np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).uniform(
        -1, 1, net.num_params)
    rg = build_region_graph(net, "saturated", "kikuchi")
    mu, state = convex_gbp(rg, theta, iters=2000, damping=0.3, schedule="sequential", tol=1e-13)
    assert int(state.iterations) < 2000
    exact = jt.marginals(net, jnp.asarray(theta))
    for c in net.cliques:
        np.testing.assert_allclose(np.asarray(mu[c]), np.asarray(exact[c]), rtol=0, atol=1e-8)


@settings(max_examples=5, **SETTINGS)
@given(st.data())
def test_mrf_log_prob_and_samples_agree_with_the_joint(data: st.DataObject) -> None:
    net = data.draw(networks(max_attrs=4))
    theta = data.draw(thetas(net))
    exact = BruteForce(net, theta)
    mrf = MarkovRandomField(net, jnp.asarray(theta))
    records = exact.records()
    log_p = np.asarray(mrf.log_prob(records))
    finite = exact.probs() > 1e-300
    np.testing.assert_allclose(log_p[finite], exact.log_prob(records)[finite], rtol=1e-9,
                               atol=1e-9)
    np.testing.assert_allclose(np.exp(log_p).sum(), 1.0, atol=1e-10)
    n = 4000
    samples = np.asarray(mrf.sample(jax.random.key(data.draw(st.integers(0, 2**31))), (n,)))
    assert samples.shape == (n, len(net.domain))
    assert empirical_tv(samples, exact.probs(), exact.shape) <= tv_bound(exact.probs(), n)
    # every sample is a record of positive probability
    assert np.all(np.isfinite(exact.log_prob(samples)))


@settings(max_examples=30, **SETTINGS)
@given(st.data())
def test_count_tables_sum_to_n_and_project_consistently(data: st.DataObject) -> None:
    net = data.draw(networks())
    domain = net.domain
    n = data.draw(st.integers(0, 60))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    records = rng.integers(0, domain.shape, size=(n, len(domain)))
    tables = count(records, net.cliques, domain)
    for c in net.cliques:
        assert tables[c].shape == domain.shape_of(c) and tables[c].sum() == n
        assert np.all(tables[c] >= 0) and np.all(tables[c] == np.round(tables[c]))
    for c, d in itertools.combinations(net.cliques, 2):
        common = tuple(a for a in c if a in d)
        if common:
            np.testing.assert_array_equal(project_table(tables[c], c, common),
                                          project_table(tables[d], d, common))
    # a sub-clique's table is the projection of the clique's
    c = net.cliques[0]
    sub = c[: data.draw(st.integers(1, len(c)))]
    np.testing.assert_array_equal(count(records, [sub], domain)[sub],
                                  project_table(tables[c], c, sub))
