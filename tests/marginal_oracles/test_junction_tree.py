"""The junction-tree oracle against brute-force enumeration of the joint."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest
from oracles.brute_force import (
    STRUCTURES,
    BruteForce,
    assert_close,
    chi_square_pvalue,
    empirical_tv,
    reference,
    tv_bound,
)

from numpyro_dpgm import Domain, MarkovNetwork
from numpyro_dpgm.oracles import ExactOracle, memory
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.oracles.calibration import clique_log_potentials
from numpyro_dpgm.oracles.factored import factored_log_partition, factored_plan

METHODS = ("min_fill", "min_size")
NAMES = [s.name for s in STRUCTURES]


# ------------------------------------------------------------------------------------------------
# Structure of the tree
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", NAMES)
def test_tree_structure(name: str, method: str) -> None:
    """Valid clique tree: covers the network, running intersection, consistent bookkeeping."""
    ref = reference(name)
    net = ref.network
    tree = jt.build_junction_tree(net, method)
    domain = net.domain
    sets = [set(c) for c in tree.cliques]

    assert tree.has_running_intersection()
    # independent check of running intersection: every attribute's holders form a subtree
    g = nx.Graph()
    g.add_nodes_from(range(len(sets)))
    g.add_edges_from((i, p) for i, p in enumerate(tree.parent) if p >= 0)
    assert nx.is_forest(g) and g.number_of_edges() == len(sets) - 1
    for a in domain:
        holders = [i for i, s in enumerate(sets) if a in s]
        assert holders, f"attribute {a} is in no junction-tree clique"
        assert nx.is_connected(g.subgraph(holders))

    for c in net.cliques:
        assert any(set(c) <= s for s in sets), f"clique {c} is in no junction-tree clique"
        i = tree.containing(c)
        assert i is not None and set(c) <= sets[i]
    # maximal, in domain order, distinct
    for i, j in itertools.permutations(range(len(sets)), 2):
        assert not sets[i] <= sets[j]
    for c in tree.cliques:
        assert list(c) == sorted(c, key=domain.index)
    # parents, separators and topological order
    assert sorted(tree.order) == list(range(len(sets)))
    assert tree.parent[tree.order[0]] == -1
    seen = set()
    for i in tree.order:
        p = tree.parent[i]
        assert p == -1 or p in seen
        seen.add(i)
        expected = () if p < 0 else tuple(a for a in tree.cliques[i] if a in sets[p])
        assert tree.separators[i] == expected
    assert tree.num_cells == sum(domain.size(c) for c in tree.cliques)
    # the cliques triangulate the primal graph: the filled graph is chordal and contains it
    filled = nx.Graph()
    filled.add_nodes_from(domain.attrs)
    for c in tree.cliques:
        filled.add_edges_from(itertools.combinations(c, 2))
    assert nx.is_chordal(filled)
    assert all(filled.has_edge(u, v) for u, v in net.graph.edges)
    assert {frozenset(c) for c in nx.find_cliques(filled)} == {frozenset(c) for c in sets}
    # decomposable networks need no fill-in: the tree's cliques are the maximal cliques
    if ref.structure.decomposable is not None:
        assert net.is_decomposable == ref.structure.decomposable
    if ref.structure.decomposable:  # attributes in no clique become singleton cliques
        covered = {a for c in net.cliques for a in c}
        singletons = {frozenset((a,)) for a in domain.attrs if a not in covered}
        assert ({frozenset(c) for c in net.maximal_cliques} | singletons
                == {frozenset(c) for c in sets})


@pytest.mark.parametrize("method", METHODS)
def test_structure_is_cached(method: str) -> None:
    """The tree is built once per network (and per equal network)."""
    net = reference("grid3x3").network
    first = jt.build_junction_tree(net, method)
    assert jt.build_junction_tree(net, method) is first
    again = MarkovNetwork(dict(net.domain), list(net.cliques))
    assert again is not net and jt.build_junction_tree(again, method) is first
    assert jt.build_junction_tree(net, method) is first
    # the default ("auto") is one of the two trees, the very object
    assert jt.build_junction_tree(net) in (jt.build_junction_tree(net, m) for m in METHODS)


def test_running_intersection_detects_a_broken_tree() -> None:
    """A chain ab - c - ac separates the holders of ``a``; the check must say so."""
    domain = Domain({"a": 2, "b": 2, "c": 2})
    bad = jt.JunctionTree(domain, (("a", "b"), ("c",), ("a", "c")), (-1, 0, 1), (0, 1, 2),
                          ((), (), ("c",)))
    assert not bad.has_running_intersection()
    good = jt.JunctionTree(domain, (("a", "b"), ("a", "c")), (-1, 0), (0, 1), ((), ("a",)))
    assert good.has_running_intersection()


def test_unknown_method_is_an_error() -> None:
    net = reference("chain3").network
    with pytest.raises(ValueError, match="min_fill"):
        jt.build_junction_tree(net, "bogus")


def test_min_size_minimises_the_new_clique_on_a_cycle() -> None:
    """On a 4-cycle with one huge attribute, min_size eliminates the cheap opposite corner first.

    Eliminating ``c`` creates {b, c, d} (8 cells) and the fill edge b-d; what remains is the
    triangle {a, b, d} (200 cells). Any order putting ``a`` in two triangles costs 400.
    """
    net = MarkovNetwork({"a": 50, "b": 2, "c": 2, "d": 2},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    tree = jt.build_junction_tree(net, "min_size")
    assert {frozenset(c) for c in tree.cliques} == {frozenset("bcd"), frozenset("abd")}
    assert tree.num_cells == 208


# ------------------------------------------------------------------------------------------------
# Exactness
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", NAMES)
def test_exact_against_brute_force(name: str, method: str) -> None:
    """log Z, clique marginals and out-of-model marginals equal enumeration.

    θ of ±30 per cell, and ±300, where ``exp(θ·φ(x))`` of the likeliest records exceeds the
    float64 range on models with three or more cliques: only log-space arithmetic is exact.
    """
    net = reference(name).network
    tree = jt.build_junction_tree(net, method)
    biggest = max(tree.cliques, key=lambda c: (len(c), net.domain.size(c)))
    queries = list(reference(name).structure.queries) + [biggest[::-1]]
    for scale in (1.0, 30.0, 300.0):
        ref = reference(name, scale)
        theta, exact = jnp.asarray(ref.theta), ref.exact
        assert_close(jt.log_partition(net, theta, method), exact.log_z, f"{name} log Z")
        mus = jt.marginals(net, theta, 1.0, method)
        assert list(mus) == list(net.cliques)
        for c in net.cliques:
            assert mus[c].shape == net.domain.shape_of(c)
            assert_close(mus[c], exact.marginal(c), f"{name} marginal {c}")
        for q in queries:
            mu = jt.marginal(net, theta, q, method)
            assert mu.shape == net.domain.shape_of(q)
            assert_close(mu, exact.marginal(q), f"{name} marginal {q} (scale {scale})")
        # many queries from one run of the program (the fallback at scale 300 included)
        for q, mu in zip(queries, jt.marginals_of(net, theta, queries, method), strict=True):
            assert isinstance(mu, np.ndarray) and mu.shape == net.domain.shape_of(q)
            assert_close(mu, exact.marginal(q), f"{name} marginals_of {q} (scale {scale})")


def test_out_of_model_queries_are_out_of_the_tree() -> None:
    """The catalogue's queries include sets that no junction-tree clique holds."""
    for name in ("grid3x3", "cycle5", "disconnected", "attr_in_no_clique", "chain6"):
        ref = reference(name)
        for method in METHODS:
            tree = jt.build_junction_tree(ref.network, method)
            assert any(tree.containing(q) is None for q in ref.structure.queries), name


def test_scaled_marginals_and_table_input() -> None:
    """``total`` scales the marginals; θ given as CliqueTables equals θ as a vector."""
    ref = reference("nondomain_order")
    net, exact = ref.network, ref.exact
    tables = net.unflatten(jnp.asarray(ref.theta))
    scaled = jt.marginals(net, tables, 1234.5)
    for c in net.cliques:
        assert_close(scaled[c] / 1234.5, exact.marginal(c), f"scaled {c}")
    assert_close(jt.log_partition(net, tables), exact.log_z)


def test_gradient_of_log_partition_is_the_marginals() -> None:
    """``∇A(θ) = μ(θ)`` with μ from enumeration, in the network's flat layout."""
    for name in ("cycle5", "oneway_beside_twoway"):
        ref = reference(name)
        grad = jax.grad(lambda t, n=ref.network: jt.log_partition(n, t))(jnp.asarray(ref.theta))
        expected = np.concatenate([ref.exact.marginal(c).ravel() for c in ref.network.cliques])
        assert_close(grad, expected, f"{name} gradient")


def test_vmap_over_thetas_matches_each_theta() -> None:
    """A batch of θ under ``jax.vmap`` gives the per-θ exact answers."""
    for name, query in (("grid3x3", ("g22", "g00")), ("oneway_beside_twoway", ("d", "a"))):
        refs = [reference(name, scale, seed) for scale, seed in ((1.0, 0), (30.0, 0), (3.0, 1))]
        net = refs[0].network
        thetas = jnp.stack([jnp.asarray(r.theta) for r in refs])
        log_z = jax.vmap(lambda t, n=net: jt.log_partition(n, t))(thetas)
        mus = jax.vmap(lambda t, n=net: jt.marginals(n, t))(thetas)
        oom = jax.vmap(lambda t, n=net, q=query: jt.marginal(n, t, q))(thetas)
        assert log_z.shape == (3,) and oom.shape == (3,) + net.domain.shape_of(query)
        for b, r in enumerate(refs):
            assert_close(log_z[b], r.exact.log_z, f"{name} batch {b}")
            assert_close(oom[b], r.exact.marginal(query), f"{name} batch {b} {query}")
            for c in net.cliques:
                assert_close(mus[c][b], r.exact.marginal(c), f"{name} batch {b} {c}")


def test_jit_of_a_composite_function() -> None:
    """The oracle composes inside a user's jitted function (network closed over)."""
    ref = reference("clique3_plus_edges")
    net = ref.network

    @jax.jit
    def summary(theta: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        mu = net.flatten(jt.marginals(net, theta))
        return jt.log_partition(net, theta), mu, jt.marginal(net, theta, ("e", "c"))

    log_z, mu, ec = summary(jnp.asarray(ref.theta))
    assert_close(log_z, ref.exact.log_z)
    assert_close(mu, np.concatenate([ref.exact.marginal(c).ravel() for c in net.cliques]))
    assert_close(ec, ref.exact.marginal(("e", "c")))


def test_errors() -> None:
    net = reference("chain3").network
    with pytest.raises(ValueError, match=r"theta has shape \(3,\)"):
        jt.log_partition(net, jnp.zeros(3))
    with pytest.raises(ValueError, match="vmap"):
        jt.marginals(net, jnp.zeros((2, net.num_params)))
    with pytest.raises(KeyError, match="nope"):
        jt.marginal(net, jnp.zeros(net.num_params), ("v0", "nope"))
    with pytest.raises(ValueError, match="repeats"):
        jt.marginal(net, jnp.zeros(net.num_params), ("v0", "v0"))


# ------------------------------------------------------------------------------------------------
# Forward sampling
# ------------------------------------------------------------------------------------------------
NUM_SAMPLES = 200_000


@pytest.mark.parametrize(
    ("name", "method"),
    [("cycle5", "min_fill"), ("disconnected", "min_size"), ("nondomain_order", "min_fill"),
     ("sizes_1_to_5", "min_size"), ("grid3x3", "min_fill")],
)
def test_sample_frequencies_match_the_joint(name: str, method: str) -> None:
    """200k forward samples: TV below a bound a correct sampler exceeds w.p. < 1e-6, and
    Pearson's chi-square p-value above 1e-6 (fixed seed, so the test is deterministic).

    θ of ±2 spreads the mass; θ of ±30 makes it nearly deterministic (samples must avoid the
    records of negligible probability).
    """
    for scale in (2.0, 30.0):
        ref = reference(name, scale)
        net, exact = ref.network, ref.exact
        key = jax.random.key(20240607)
        x = jt.sample(net, jnp.asarray(ref.theta), key, NUM_SAMPLES, method)
        assert x.shape == (NUM_SAMPLES, len(net.domain))
        assert jnp.issubdtype(x.dtype, jnp.integer)
        x = np.asarray(x)
        assert (x >= 0).all() and (x < np.array(net.domain.shape)).all()
        assert (exact.joint[tuple(x.T)] > 1e-12).all()
        probs = exact.probs()
        bound = tv_bound(probs, NUM_SAMPLES)
        tv = empirical_tv(x, probs, exact.shape)
        assert tv < bound, f"scale {scale}: TV {tv:.4f} >= {bound:.4f}"
        assert chi_square_pvalue(x, probs, exact.shape) > 1e-6
        if scale == 2.0:  # the statistics have power: a slightly different model is rejected
            other = BruteForce(net, np.asarray(ref.theta) * 0.9)
            assert chi_square_pvalue(x, other.probs(), exact.shape) < 1e-6
        # every clique's sample frequencies, too (smaller tables, tighter bound)
        for c in net.cliques:
            cols = [net.domain.index(a) for a in c]
            mu = exact.marginal(c)
            assert empirical_tv(x[:, cols], mu, mu.shape) < tv_bound(mu.ravel(), NUM_SAMPLES)


def test_sample_is_reproducible_and_keyed() -> None:
    ref = reference("cycle5", 2.0)  # the network and size of a frequency test: no new compile
    theta = jnp.asarray(ref.theta)
    a = jt.sample(ref.network, theta, jax.random.key(1), NUM_SAMPLES)
    b = jt.sample(ref.network, theta, jax.random.key(1), NUM_SAMPLES)
    c = jt.sample(ref.network, theta, jax.random.key(2), NUM_SAMPLES)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# ------------------------------------------------------------------------------------------------
# Memory cap
# ------------------------------------------------------------------------------------------------
def test_memory_cap_refuses_large_cliques(monkeypatch) -> None:
    """A clique above the cap is refused, naming it, its cells and bytes, and convex_gbp."""
    monkeypatch.delenv(memory.MAX_CLIQUE_BYTES_ENV, raising=False)
    assert memory.max_clique_bytes() == memory.DEFAULT_MAX_CLIQUE_BYTES == 2**30
    # a 4-cycle of 1000-value attributes: triangulation makes cliques of 10^9 cells (8 GB)
    domain = Domain({a: 1000 for a in "abcd"})
    big = MarkovNetwork(domain, [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    tree = jt.build_junction_tree(big)  # building (and measuring) a tree is never refused
    assert max(domain.size(c) for c in tree.cliques) == 10**9
    theta = jnp.zeros(big.num_params)
    for call in (lambda: jt.log_partition(big, theta), lambda: jt.marginals(big, theta),
                 lambda: jt.marginal(big, theta, ("a", "c")),
                 lambda: jt.sample(big, theta, jax.random.key(0), 2),
                 lambda: clique_log_potentials(tree, big, theta)):
        with pytest.raises(memory.CliqueTooLargeError) as err:
            call()
        msg = str(err.value)
        assert f"clique {max(tree.cliques, key=domain.size)} with" in msg
        assert "1,000,000,000 cells (8,000,000,000 bytes" in msg
        assert "cap of 1,073,741,824 bytes" in msg and "oracle='convex_gbp'" in msg
    assert isinstance(err.value, MemoryError)

    # the cap is overridable: argument, context, environment (read at each check)
    small = MarkovNetwork(Domain({"a": 4, "b": 5, "c": 6}), [("a", "b"), ("b", "c")])
    memory.check_memory(jt.build_junction_tree(small))  # 30 cells: far below the default
    with pytest.raises(memory.CliqueTooLargeError, match=r"30 cells \(240 bytes"):
        memory.check_memory(jt.build_junction_tree(small), max_bytes=239)
    memory.check_memory(jt.build_junction_tree(small), max_bytes=240)
    with memory.clique_memory_cap(100):
        assert memory.max_clique_bytes() == 100
        with pytest.raises(memory.CliqueTooLargeError, match="cap of 100 bytes"):
            jt.log_partition(small, jnp.zeros(small.num_params))
    monkeypatch.setenv(memory.MAX_CLIQUE_BYTES_ENV, "200")
    with pytest.raises(memory.CliqueTooLargeError, match="cap of 200 bytes"):
        jt.marginals(small, jnp.zeros(small.num_params) + 0.5)
    monkeypatch.setenv(memory.MAX_CLIQUE_BYTES_ENV, str(16 * 2**30))
    assert memory.max_clique_bytes() == 16 * 2**30
    assert float(jt.log_partition(small, jnp.zeros(small.num_params))) == pytest.approx(
        np.log(120))
    for bad in ("-5", "1e9", "lots"):
        monkeypatch.setenv(memory.MAX_CLIQUE_BYTES_ENV, bad)
        with pytest.raises(ValueError, match="NUMPYRO_DPGM_MAX_CLIQUE_BYTES must be a positive"):
            memory.max_clique_bytes()
    for bad in (0, -1, 1.5, True, "x"):
        with pytest.raises(ValueError, match="max_bytes must be a positive integer"):
            memory.check_memory(jt.build_junction_tree(small), max_bytes=bad)


def test_inverse_cdf_draws_each_rows_categorical_and_never_a_zero_cell() -> None:
    """The sampler's per-record draw: rows laid end to end, one searchsorted. Row frequencies
    match the row's probabilities (chi-square at a fixed seed), zero cells are never drawn,
    and a row of one certain cell always gives it."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(6), size=40)
    probs[:, 2] = 0.0  # a zero cell in every row
    probs[7] = np.eye(6)[4]  # a certain cell
    probs /= probs.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        logits = jnp.asarray(np.log(probs))
    row = jnp.asarray(np.repeat(np.arange(40), 2_000))
    cell = np.asarray(jt._inverse_cdf(jax.random.key(3), logits, row))
    assert cell.min() >= 0 and cell.max() <= 5
    assert not np.any(cell == 2)
    assert np.all(cell[np.asarray(row) == 7] == 4)
    joint = probs / 40  # rows drawn equally often: the joint of (row, cell)
    pairs = np.stack([np.asarray(row), cell], axis=1)
    assert chi_square_pvalue(pairs, joint, (40, 6)) > 1e-4


# ------------------------------------------------------------------------------------------------
# The exact marginal oracle of Prox-PGM where a clique is factored
# ------------------------------------------------------------------------------------------------
def _complete4() -> MarkovNetwork:
    """Every pair of four 7-value attributes: the one junction-tree clique (2,401 cells) holds
    six 49-cell factors, so it is contracted from them, never built."""
    names = ("a", "b", "c", "d")
    return MarkovNetwork({n: 7 for n in names}, list(itertools.combinations(names, 2)))


def _indicators(net: MarkovNetwork, clique: tuple[str, ...], attrs: tuple[str, ...]) -> np.ndarray:
    """``φ_C``: one row per cell of ``clique``, one column per joint state (``attrs`` order)."""
    states = np.indices(tuple(net.domain[a] for a in attrs)).reshape(len(attrs), -1)
    cell = np.ravel_multi_index(tuple(states[attrs.index(a)] for a in clique),
                                net.domain.shape_of(clique))
    return (cell[None, :] == np.arange(net.domain.size(clique))[:, None]).astype(float)


@pytest.mark.parametrize("method", METHODS)
def test_exact_oracle_with_a_factored_clique_against_brute_force(method: str) -> None:
    """``ExactOracle`` gives ``μ`` and ``log Z`` of enumeration, jitted, at θ of ±1, ±30 and
    ±3000 per cell (the last through the log-space fallback, checked), and its JVP is the
    covariance of the sufficient statistics times the tangent, ``dμ = Cov(φ)·v`` (the risk
    path's divergence differentiates the oracle forward)."""
    net = _complete4()
    assert any(factored_plan(net, method).factored)
    oracle = jax.jit(lambda t: ExactOracle(net, method)(t, ())[:2])
    rng = np.random.default_rng(7)
    for scale in (1.0, 30.0, 3000.0):
        theta = rng.uniform(-scale, scale, net.num_params)
        ok = bool(factored_log_partition(net, jnp.asarray(theta), method)[1])
        assert ok == (scale < 3000.0)  # the contraction is trusted, or the fallback answers
        exact = BruteForce(net, theta)
        mu, log_z = oracle(jnp.asarray(theta))
        assert_close(log_z, exact.log_z, f"log Z (scale {scale})")
        expected = np.concatenate([exact.marginal(c).ravel() for c in net.cliques])
        assert_close(mu, expected, f"marginals (scale {scale})")
    theta, v = rng.uniform(-1.0, 1.0, net.num_params), rng.normal(size=net.num_params)
    exact = BruteForce(net, theta)
    phi = np.concatenate([_indicators(net, c, exact.attrs) for c in net.cliques])
    p = exact.joint.ravel()
    mean = phi @ p
    cov_v = phi @ (p * (phi.T @ v)) - mean * (mean @ v)
    _, tangent = jax.jvp(lambda t: ExactOracle(net, method)(t, ())[0], (jnp.asarray(theta),),
                         (jnp.asarray(v),))
    assert_close(tangent, cov_v, "dμ")
