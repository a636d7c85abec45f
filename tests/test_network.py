"""Markov networks: parameter layout, features and validation."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce, reference, split_theta

from numpyro_dpgm import CliqueTables, Domain, MarkovNetwork

DOMAIN = Domain({"a": 2, "b": 3, "c": 4, "d": 1})
CLIQUES = [("c", "a"), ("b",), ("a", "b", "c"), ("d", "b")]


def test_layout_is_c_order_concatenation() -> None:
    net = MarkovNetwork(DOMAIN, CLIQUES)
    assert net.cliques == (("c", "a"), ("b",), ("a", "b", "c"), ("d", "b"))
    assert net.shapes == ((4, 2), (3,), (2, 3, 4), (1, 3))
    assert net.sizes == (8, 3, 24, 3)
    assert net.offsets == (0, 8, 11, 35)
    assert net.num_params == 38
    vec = np.arange(38.0)
    tables = net.unflatten(vec)
    assert isinstance(tables, CliqueTables) and list(tables) == list(net.cliques)
    # C order: the last axis varies fastest
    assert tables[("c", "a")][3, 1] == 3 * 2 + 1
    assert tables[("a", "b", "c")][1, 2, 3] == 11 + 1 * 12 + 2 * 4 + 3
    assert tables[("d", "b")][0, 2] == 35 + 2
    for c in net.cliques:
        np.testing.assert_array_equal(tables[c], vec[net.slice_of(c)].reshape(net.shapes[
            net.clique_index(c)]))
        np.testing.assert_array_equal(tables[c], split_theta(net, vec)[c])
    assert net.slice_of(("b",)) == slice(8, 11)


def test_flatten_unflatten_round_trip_with_batch_dims() -> None:
    net = MarkovNetwork(DOMAIN, CLIQUES)
    vec = np.random.default_rng(0).normal(size=(2, 5, net.num_params))
    tables = net.unflatten(vec)
    assert tables[("a", "b", "c")].shape == (2, 5, 2, 3, 4)
    back = net.flatten(tables)
    assert back.shape == (2, 5, net.num_params)
    np.testing.assert_array_equal(back, vec)
    # a plain dict in any key order flattens in the network's clique order
    plain = {c: tables[c] for c in reversed(net.cliques)}
    np.testing.assert_array_equal(net.flatten(plain), vec)
    # zeros
    z = net.zeros()
    assert list(z) == list(net.cliques) and float(net.flatten(z).sum()) == 0.0


def test_layout_errors() -> None:
    net = MarkovNetwork(DOMAIN, CLIQUES)
    with pytest.raises(ValueError, match=r"shape \(37,\).*\(\.\.\., 38\)"):
        net.unflatten(np.zeros(37))
    with pytest.raises(ValueError, match="expects"):
        net.unflatten(np.float64(1.0))
    tables = dict(net.unflatten(np.zeros(38)))
    tables[("c", "a")] = np.zeros((2, 4))  # transposed
    with pytest.raises(ValueError, match=r"clique \('c', 'a'\) has shape \(2, 4\)"):
        net.flatten(tables)
    del tables[("b",)]
    with pytest.raises(KeyError, match=r"missing clique\(s\) \[\('b',\)\]"):
        net.flatten(tables)
    with pytest.raises(KeyError, match="not in the network"):
        net.slice_of(("a", "c"))  # same set, other order: a different table layout


def test_construction_errors() -> None:
    with pytest.raises(KeyError, match="'e'"):
        MarkovNetwork(DOMAIN, [("a", "e")])
    with pytest.raises(ValueError, match="repeats attribute"):
        MarkovNetwork(DOMAIN, [("a", "b", "a")])
    with pytest.raises(ValueError, match="empty clique"):
        MarkovNetwork(DOMAIN, [("a",), ()])
    with pytest.raises(ValueError, match=r"\('b', 'a'\) repeats clique \('a', 'b'\)"):
        MarkovNetwork(DOMAIN, [("a", "b"), ("c",), ("b", "a")])
    with pytest.raises(TypeError, match="sequence of tuples"):
        MarkovNetwork(DOMAIN, "ab")
    with pytest.raises(TypeError, match="sequence of tuples"):
        MarkovNetwork(DOMAIN, 3)
    # a bare string is a one-attribute clique
    assert MarkovNetwork(DOMAIN, ["a", ("b", "c")]).cliques == (("a",), ("b", "c"))


def test_identity_and_graph() -> None:
    net = MarkovNetwork(dict(DOMAIN), CLIQUES)
    same = MarkovNetwork(DOMAIN, list(CLIQUES))
    assert net == same and hash(net) == hash(same)
    assert net != MarkovNetwork(DOMAIN, CLIQUES[::-1])
    assert {frozenset(e) for e in net.graph.edges} == {
        frozenset(e) for e in [("a", "b"), ("a", "c"), ("b", "c"), ("b", "d")]
    }
    assert set(net.graph.nodes) == set(DOMAIN)
    assert net.maximal_cliques == (("a", "b", "c"), ("d", "b"))
    assert net.is_decomposable
    assert not MarkovNetwork(DOMAIN, [("a", "b"), ("b", "c"), ("a", "c")]).is_decomposable
    assert net.with_cliques([("a", "c"), ("b", "d")]) is net
    wider = net.with_cliques([("d", "c"), ("c", "d"), "a", "d"])
    assert wider.cliques == net.cliques + (("d", "c"), ("a",), ("d",))


def test_cell_indices_and_features_against_enumeration() -> None:
    """``θ·φ(x)`` from cell indices equals the brute-force energy of every record."""
    for name in ("nondomain_order", "oneway_beside_twoway", "sizes_1_to_5"):
        ref = reference(name)
        net, exact = ref.network, ref.exact
        records = exact.records()
        idx = np.asarray(net.cell_indices(records))
        assert idx.shape == (len(records), len(net.cliques))
        energy = np.asarray(ref.theta)[idx].sum(axis=-1)
        np.testing.assert_allclose(energy, exact.log_joint.reshape(-1), rtol=1e-13, atol=1e-13)
        # features: per-clique counts of a random batch, by explicit loops
        rng = np.random.default_rng(1)
        batch = records[rng.integers(0, len(records), 57)]
        feats = np.asarray(net.features(batch))
        expected = []
        for c in net.cliques:
            table = np.zeros(net.domain.shape_of(c))
            for x in batch:
                table[tuple(x[net.domain.index(a)] for a in c)] += 1
            expected.append(table.ravel())
        np.testing.assert_array_equal(feats, np.concatenate(expected))
        # leading batch dims of the records are kept by cell_indices
        assert net.cell_indices(batch[:6].reshape(2, 3, -1)).shape == (2, 3, len(net.cliques))


def test_cell_indices_under_jit() -> None:
    ref = reference("cycle4")
    net = ref.network
    x = ref.exact.records()
    theta = jnp.asarray(ref.theta)
    energy = jax.jit(lambda r: jnp.sum(theta[net.cell_indices(r)], axis=-1))(x)
    np.testing.assert_allclose(energy, ref.exact.log_joint.reshape(-1), rtol=1e-13, atol=1e-13)


def test_brute_force_layout_against_explicit_products() -> None:
    """The oracle's joint equals the product of potentials evaluated record by record."""
    net = MarkovNetwork(DOMAIN, CLIQUES)
    theta = np.random.default_rng(3).normal(size=net.num_params)
    exact = BruteForce(net, theta)
    offs = dict(zip(net.cliques, net.offsets, strict=True))
    for x in itertools.product(*(range(k) for k in DOMAIN.shape)):
        rec = dict(zip(DOMAIN.attrs, x, strict=True))
        e = 0.0
        for c in net.cliques:
            flat = 0
            for a in c:
                flat = flat * DOMAIN[a] + rec[a]
            e += theta[offs[c] + flat]
        assert abs(exact.log_joint[x] - e) < 1e-12
