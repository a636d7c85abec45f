"""Accuracy measures against brute-force enumeration."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce, assert_close, exact_kl, reference

from numpyro_dpgm import CliqueTables, MarkovNetwork, MarkovRandomField
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.metrics import (
    embed_theta,
    kl_divergence,
    marginal_l1_error,
    noisy_tables_l1,
    total_variation,
)

DOMAIN = {"a": 2, "b": 3, "c": 4, "d": 2}


def _model(cliques: list[tuple[str, ...]], seed: int, scale: float = 1.0
           ) -> tuple[MarkovRandomField, BruteForce]:
    net = MarkovNetwork(DOMAIN, cliques)
    theta = np.random.default_rng(seed).uniform(-scale, scale, net.num_params)
    return MarkovRandomField(net, theta), BruteForce(net, theta)


def test_kl_same_network() -> None:
    for name in ("cycle5", "oneway_beside_twoway"):
        p = reference(name, 1.0, 0)
        q = reference(name, 30.0, 1)
        mp = MarkovRandomField(p.network, p.theta)
        mq = MarkovRandomField(q.network, q.theta)
        assert_close(kl_divergence(mp, mq), exact_kl(p.exact, q.exact), f"{name} KL(p, q)")
        assert_close(kl_divergence(mq, mp), exact_kl(q.exact, p.exact), f"{name} KL(q, p)")
        assert abs(float(kl_divergence(mp, mp))) < 1e-10


def test_kl_models_on_different_cliques() -> None:
    """The union of the cliques carries both models; clique order inside a tuple may differ."""
    chain, chain_bf = _model([("a", "b"), ("b", "c"), ("c", "d")], 0)
    cycle, cycle_bf = _model([("b", "a"), ("c", "b"), ("d", "c"), ("a", "d")], 1, 3.0)
    triple, triple_bf = _model([("c", "a", "d"), ("b",)], 2, 2.0)
    pairs = [((chain, chain_bf), (cycle, cycle_bf)), ((cycle, cycle_bf), (chain, chain_bf)),
             ((cycle, cycle_bf), (triple, triple_bf)), ((triple, triple_bf), (chain, chain_bf))]
    values = []
    for (p, p_bf), (q, q_bf) in pairs:
        kl = kl_divergence(p, q)
        assert_close(kl, exact_kl(p_bf, q_bf), f"KL({p.network.cliques} || {q.network.cliques})")
        assert float(kl) > 0
        values.append(float(kl))
    assert len(set(values)) == len(values)  # asymmetric, and every pair differs


def test_kl_is_zero_between_equal_distributions_on_different_cliques() -> None:
    """A model and its copy embedded in a larger network (extra cliques at zero) coincide."""
    small, small_bf = _model([("a", "b"), ("c",)], 3)
    big_net = MarkovNetwork(DOMAIN, [("d", "c"), ("b", "a"), ("c",), ("a", "c")])
    big = MarkovRandomField(big_net, embed_theta(small.network, small.theta, big_net))
    big_bf = BruteForce(big_net, np.asarray(big.theta))
    assert abs(exact_kl(small_bf, big_bf)) < 1e-12
    assert abs(float(kl_divergence(small, big))) < 1e-10
    assert abs(float(kl_divergence(big, small))) < 1e-10


def test_kl_is_non_negative() -> None:
    rng = np.random.default_rng(5)
    net = MarkovNetwork(DOMAIN, [("a", "b", "c"), ("c", "d")])
    for _ in range(5):
        t1, t2 = rng.normal(0, 2, (2, net.num_params))
        kl = float(kl_divergence(MarkovRandomField(net, t1), MarkovRandomField(net, t2)))
        assert kl >= 0
        assert_close(kl, exact_kl(BruteForce(net, t1), BruteForce(net, t2)))


def test_kl_errors() -> None:
    p, _ = _model([("a", "b")], 0)
    other = MarkovRandomField(MarkovNetwork({"a": 2, "b": 3}, [("a", "b")]), np.zeros(6))
    with pytest.raises(ValueError, match="different domains"):
        kl_divergence(p, other)
    batched = MarkovRandomField(p.network, np.zeros((2, p.network.num_params)))
    with pytest.raises(ValueError, match="unbatched"):
        kl_divergence(p, batched)
    with pytest.raises(TypeError, match="MarkovRandomField"):
        kl_divergence(p, np.zeros(3))


def test_embed_theta_preserves_the_distribution() -> None:
    src = MarkovNetwork(DOMAIN, [("c", "a"), ("b",), ("d", "b")])
    dst = MarkovNetwork(DOMAIN, [("a", "c"), ("b", "d"), ("b",), ("c", "d")])
    theta = np.random.default_rng(7).normal(size=src.num_params)
    moved = embed_theta(src, theta, dst)
    assert moved.shape == (dst.num_params,)
    a, b = BruteForce(src, theta), BruteForce(dst, np.asarray(moved))
    np.testing.assert_allclose(b.log_joint, a.log_joint, rtol=1e-12, atol=1e-12)
    assert_close(moved[dst.slice_of(("c", "d"))], np.zeros(8))
    with pytest.raises(ValueError, match="lacks"):
        embed_theta(dst, moved, src)
    with pytest.raises(ValueError, match="different domains"):
        embed_theta(src, theta, MarkovNetwork({"a": 2}, [("a",)]))


def test_total_variation() -> None:
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(12), size=2)
    assert_close(total_variation(p.reshape(3, 4), q.reshape(3, 4)), 0.5 * np.abs(p - q).sum())
    assert_close(total_variation(p, p), 0.0)
    assert_close(total_variation(np.eye(3)[0], np.eye(3)[1]), 1.0)
    with pytest.raises(ValueError, match="different shapes"):
        total_variation(p, q[:5])


def test_marginal_l1_error() -> None:
    """Mean over tables of the L1 distance to the normalised tables, in and out of the model."""
    ref = reference("cycle5")
    mrf = MarkovRandomField(ref.network, ref.theta)
    rng = np.random.default_rng(1)
    targets = {("c0", "c1"): rng.uniform(1, 5, (3, 2)), ("c3", "c0"): rng.uniform(1, 5, (3, 3))}
    err = marginal_l1_error(mrf, CliqueTables(targets))
    expected = np.mean([np.abs(ref.exact.marginal(c) - t / t.sum()).sum()
                        for c, t in targets.items()])
    assert_close(err, expected)
    exact_tables = CliqueTables({c: 7.0 * jnp.asarray(ref.exact.marginal(c)) for c in targets})
    assert float(marginal_l1_error(mrf, exact_tables)) < 1e-10


def test_noisy_tables_l1_clips_normalises_and_averages_over_measurements() -> None:
    """By hand: (a): y = [4, -2, 0, 4] clips to [.5, 0, 0, .5] against t = [.25, .25, .25, .25]:
    L1 1.0; (b): y = [1, 1] against [3, 1] / 4: 0.5. Mean 0.75."""
    tables = CliqueTables({("a",): np.ones(4), ("b",): np.array([3.0, 1.0])})
    meas = [Measurement(("a",), [4.0, -2.0, 0.0, 4.0], Laplace(1.0)),
            Measurement(("b",), [1.0, 1.0], Gaussian(2.0))]
    assert_close(noisy_tables_l1(meas, tables), 0.75)
    with pytest.raises(ValueError, match="query matrix"):
        noisy_tables_l1([Measurement(("a",), [1.0], Laplace(1.0), query=np.ones((1, 4)))], tables)
    with pytest.raises(ValueError, match="3 values, its table 4 cells"):
        noisy_tables_l1([Measurement(("a",), [1.0, 2.0, 3.0], Laplace(1.0))], tables)
