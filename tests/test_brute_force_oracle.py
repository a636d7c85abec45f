"""The brute-force reference itself, against closed forms computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
from oracles.brute_force import (
    MAX_STATES,
    STRUCTURES,
    BruteForce,
    chi_square_pvalue,
    empirical_tv,
    exact_kl,
    reference,
    split_theta,
    tv_bound,
)
from scipy.special import logsumexp, softmax

from numpyro_dpgm import MarkovNetwork


def test_single_table_is_its_own_joint() -> None:
    p = np.array([[0.1, 0.2, 0.05], [0.3, 0.15, 0.2]])
    net = MarkovNetwork({"a": 2, "b": 3}, [("b", "a")])  # table axes (b, a)
    exact = BruteForce(net, np.log(p.T).ravel())
    assert abs(exact.log_z) < 1e-15
    np.testing.assert_allclose(exact.joint, p, rtol=1e-14)
    np.testing.assert_allclose(exact.marginal(("b", "a")), p.T, rtol=1e-14)
    np.testing.assert_allclose(exact.marginal("a"), p.sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(exact.mean(), [p.sum(axis=1) @ [0, 1], p.sum(axis=0) @ [0, 1, 2]])
    records = exact.records()
    assert records.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    np.testing.assert_allclose(np.exp(exact.log_prob(records)), exact.probs(), rtol=1e-14)
    np.testing.assert_allclose(exact.probs(), p.ravel(), rtol=1e-14)


def test_independent_model_closed_form() -> None:
    rng = np.random.default_rng(0)
    ta, tb, tc = rng.normal(size=3), rng.normal(size=2), rng.normal(size=4)
    net = MarkovNetwork({"a": 3, "b": 2, "c": 4}, [("c",), ("a",), ("b",)])
    exact = BruteForce(net, np.concatenate([tc, ta, tb]))
    assert abs(exact.log_z - (logsumexp(ta) + logsumexp(tb) + logsumexp(tc))) < 1e-13
    np.testing.assert_allclose(exact.marginal(("c", "a")),
                               np.outer(softmax(tc), softmax(ta)), rtol=1e-13)
    # KL of product distributions is the sum of the factors' KLs
    ua, ub, uc = rng.normal(size=3), rng.normal(size=2), rng.normal(size=4)
    other = BruteForce(net, np.concatenate([uc, ua, ub]))

    def kl(t: np.ndarray, u: np.ndarray) -> float:
        p, q = softmax(t), softmax(u)
        return float(np.sum(p * np.log(p / q)))

    expected = kl(ta, ua) + kl(tb, ub) + kl(tc, uc)
    assert abs(exact_kl(exact, other) - expected) < 1e-13
    assert abs(exact_kl(exact, exact)) < 1e-15


def test_split_theta_and_limits() -> None:
    net = MarkovNetwork({"a": 2, "b": 3}, [("b", "a"), ("a",)])
    tables = split_theta(net, np.arange(8.0))
    np.testing.assert_array_equal(tables[("b", "a")], np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(tables[("a",)], [6.0, 7.0])
    with pytest.raises(ValueError, match="cliques need 8"):
        split_theta(net, np.arange(9.0))
    big = MarkovNetwork({f"x{i}": 5 for i in range(7)}, [("x0",)])
    with pytest.raises(ValueError, match="oracle stops"):
        BruteForce(big, np.zeros(5))
    assert all(s.num_states <= MAX_STATES for s in STRUCTURES)
    assert len({s.name for s in STRUCTURES}) == len(STRUCTURES)


def test_catalogue_covers_the_required_shapes() -> None:
    sizes = {k for s in STRUCTURES for _, k in s.domain}
    assert {1, 2, 3, 4, 5} <= sizes
    names = {s.name for s in STRUCTURES}
    assert {"chain3", "chain6", "tree", "star", "cycle4", "cycle5", "grid3x3",
            "clique3_plus_edges", "triangles_sharing_edge", "disconnected", "attr_in_no_clique",
            "nondomain_order", "oneway_beside_twoway", "sizes_1_to_5"} <= names
    free = reference("attr_in_no_clique").network
    assert any(not any(a in c for c in free.cliques) for a in free.domain)
    # random models are reproducible and scaled
    r1, r2 = reference("grid3x3", 30.0), reference("grid3x3", 30.0, 1)
    assert np.abs(r1.theta).max() <= 30 and np.abs(r1.theta).max() > 25
    assert not np.array_equal(r1.theta, r2.theta)
    assert r1 is reference("grid3x3", 30.0)


def test_sample_statistics_accept_exact_frequencies_and_reject_wrong_ones() -> None:
    p = np.array([[0.1, 0.2], [0.3, 0.4]])
    n = 10_000
    counts = np.round(p.ravel() * n).astype(int)
    samples = np.repeat(np.indices((2, 2)).reshape(2, -1).T, counts, axis=0)
    assert empirical_tv(samples, p, (2, 2)) < 1e-12
    assert chi_square_pvalue(samples, p, (2, 2)) > 0.99
    q = np.array([[0.15, 0.15], [0.3, 0.4]])
    assert empirical_tv(samples, q, (2, 2)) == pytest.approx(0.05)
    assert empirical_tv(samples, q, (2, 2)) > tv_bound(q.ravel(), n)
    assert chi_square_pvalue(samples, q, (2, 2)) < 1e-6
    # the bound shrinks like n^(-1/2)
    assert tv_bound(p.ravel(), 4 * n) == pytest.approx(tv_bound(p.ravel(), n) / 2)
