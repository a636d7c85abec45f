"""CollectiveGraphicalModel against brute-force enumeration of record multisets.

The reference distribution of the count tables ``n = Σ_i φ(x_i)`` of ``N`` i.i.d. records is
built by enumerating every multiset of ``N`` records of the domain (the multinomial over the
joint) and adding up the probabilities of the multisets with the same tables. It uses only the
brute-force joint of ``tests/oracles`` and a feature map written here from the documented layout
(each clique's one-hot table raveled in C order, cliques concatenated in order).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce, features, tv_bound
from scipy.special import gammaln, xlogy

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel
from numpyro_dpgm.distributions.constraints import count_tables, scaled_marginal_polytope

TOL = 1e-10  # probabilities and log densities (float64, tiny models)


# ------------------------------------------------------------------------------------------------
# independent references
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A tiny decomposable model, its junction tree written out by hand, and a population size.

    ``tree`` lists the maximal cliques; ``seps`` the separators of a junction tree over them
    (one per tree edge, with multiplicity); ``free`` the attributes in no clique.
    """

    name: str
    domain: tuple[tuple[str, int], ...]
    cliques: tuple[tuple[str, ...], ...]
    tree: tuple[tuple[str, ...], ...]
    seps: tuple[tuple[str, ...], ...]
    N: int
    free: tuple[str, ...] = ()

    def network(self) -> MarkovNetwork:
        return MarkovNetwork(dict(self.domain), self.cliques)


CASES = (
    Case("chain_2_3_2", (("a", 2), ("b", 3), ("c", 2)), (("a", "b"), ("b", "c")),
         (("a", "b"), ("b", "c")), (("b",),), N=5),
    Case("chain_ternary", (("a", 3), ("b", 3), ("c", 3)), (("a", "b"), ("c", "b")),
         (("a", "b"), ("c", "b")), (("b",),), N=3),
    Case("chain_with_oneway", (("a", 2), ("b", 2), ("c", 3)),
         (("a",), ("a", "b"), ("b",), ("b", "c"), ("c",)),
         (("a", "b"), ("b", "c")), (("b",),), N=4),
    Case("triangle_plus_edge", (("a", 2), ("b", 2), ("c", 2), ("d", 2)),
         (("a", "b", "c"), ("d", "c")), (("a", "b", "c"), ("d", "c")), (("c",),), N=4),
    Case("star_same_separator", (("h", 2), ("x", 2), ("y", 2), ("z", 2)),
         (("h", "x"), ("h", "y"), ("z", "h")), (("h", "x"), ("h", "y"), ("z", "h")),
         (("h",), ("h",)), N=3),
    Case("disconnected", (("a", 2), ("b", 2), ("c", 3)), (("a", "b"), ("c",)),
         (("a", "b"), ("c",)), (), N=5),
    Case("attr_in_no_clique", (("a", 2), ("z", 3), ("b", 2)), (("b", "a"),),
         (("b", "a"),), (), N=6, free=("z",)),
)


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)




def tables_of(net: MarkovNetwork, n: np.ndarray) -> dict[tuple[str, ...], np.ndarray]:
    out, start = {}, 0
    for clique in net.cliques:
        shape = tuple(net.domain[a] for a in clique)
        out[clique] = np.asarray(n)[..., start:start + math.prod(shape)].reshape(
            np.shape(n)[:-1] + shape)
        start += math.prod(shape)
    return out


def project(table: np.ndarray, clique: tuple[str, ...], target: tuple[str, ...]) -> np.ndarray:
    """Sum over the attributes of ``clique`` not in ``target`` (target order)."""
    letters = "abcdefghij"
    src = "".join(letters[i] for i in range(len(clique)))
    dst = "".join(letters[clique.index(a)] for a in target)
    return np.einsum(f"...{src}->...{dst}", table)


def cgm_pmf(net: MarkovNetwork, theta: np.ndarray, N: int) -> tuple[np.ndarray, np.ndarray]:
    """Every reachable count table of ``N`` records and its exact log probability.

    Multisets of records ``m`` have probability ``N!/∏ m_x! ∏ p(x)^{m_x}``; tables are
    ``Σ_x m_x φ(x)``.
    """
    bf = BruteForce(net, theta)
    phi = features(net, bf.records())
    logp = np.log(bf.probs())
    k = len(logp)
    combos = np.array(list(itertools.combinations_with_replacement(range(k), N)), dtype=int)
    combos = combos.reshape(-1, N)
    m = np.zeros((len(combos), k))
    for j in range(N):
        np.add.at(m, (np.arange(len(combos)), combos[:, j]), 1.0)
    logw = gammaln(N + 1) - gammaln(m + 1).sum(1) + m @ logp
    tables, group = np.unique(m @ phi, axis=0, return_inverse=True)
    group = group.reshape(-1)
    top = np.full(len(tables), -np.inf)
    np.maximum.at(top, group, logw)
    acc = np.zeros(len(tables))
    np.add.at(acc, group, np.exp(logw - top[group]))
    return tables, top + np.log(acc)


def entropy(t: np.ndarray) -> float:
    """``−Σ ν log ν`` of a probability table."""
    return float(-np.sum(xlogy(t, t)))


def jt_entropy(c: Case, net: MarkovNetwork, nu: np.ndarray) -> float:
    """``Σ_C H(ν_C) − Σ_S H(ν_S)`` over the hand-written junction tree of ``c``."""
    tabs = tables_of(net, nu)
    holder = lambda s: next(q for q in net.cliques if set(s) <= set(q))  # noqa: E731
    h = sum(entropy(project(tabs[holder(q)], holder(q), q)) for q in c.tree)
    return h - sum(entropy(project(tabs[holder(s)], holder(s), s)) for s in c.seps)


def rand_theta(net: MarkovNetwork, seed: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-scale, scale, net.num_params)


@functools.partial(jax.jit, static_argnames=("net", "total", "relaxed", "relaxation"))
def jit_log_prob(theta, value, *, net, total, relaxed=False, relaxation="lgamma"):
    """``log_prob`` under ``jit`` (the distribution must work there; one compile per call
    signature instead of op-by-op dispatch)."""
    cgm = CollectiveGraphicalModel(net, theta, total, relaxed, relaxation=relaxation)
    return cgm.log_prob(value)


@functools.partial(jax.jit, static_argnames=("net", "total", "shape"))
def jit_sample(theta, key, *, net, total, shape):
    return CollectiveGraphicalModel(net, theta, total).sample(key, shape)


def is_consistent(net: MarkovNetwork, n: np.ndarray, N: float, atol: float = 1e-9) -> np.ndarray:
    """Every table sums to ``N`` and tables agree on shared attributes (batched)."""
    tabs = tables_of(net, n)
    ok = np.ones(np.shape(n)[:-1], dtype=bool)
    for c in net.cliques:
        ok &= np.abs(project(tabs[c], c, ()) - N) <= atol
    for c, d in itertools.combinations(net.cliques, 2):
        shared = tuple(a for a in c if a in d)
        if shared:
            diff = project(tabs[c], c, shared) - project(tabs[d], d, shared)
            ok &= np.max(np.abs(diff).reshape(diff.shape[: ok.ndim] + (-1,)), axis=-1) <= atol
    return ok


# ------------------------------------------------------------------------------------------------
# exact pmf
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_exact_log_prob_matches_enumeration(c: Case) -> None:
    net = c.network()
    theta = rand_theta(net, 1)
    tables, log_pmf = cgm_pmf(net, theta, c.N)
    cgm = CollectiveGraphicalModel(net, theta, c.N)
    assert cgm.batch_shape == () and cgm.event_shape == (net.num_params,)
    assert cgm.is_discrete
    lp = np.asarray(jit_log_prob(theta, tables, net=net, total=c.N))
    assert lp.shape == (len(tables),)
    np.testing.assert_allclose(lp, log_pmf, rtol=0, atol=TOL)
    # the enumerated tables are all of N·M ∩ Z (every integer consistent table is reachable
    # on a decomposable network), so the pmf must sum to one over them
    np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=0, atol=TOL)
    # the lgamma relaxation is the same function at integer tables
    relaxed = CollectiveGraphicalModel(net, theta, c.N, relaxed=True)
    assert not relaxed.is_discrete
    np.testing.assert_allclose(
        np.asarray(jit_log_prob(theta, tables, net=net, total=c.N, relaxed=True)), log_pmf,
        rtol=0, atol=TOL)


def test_exact_log_prob_strong_potentials() -> None:
    """Large log-potentials (probabilities down to ~e^-40): log-space throughout."""
    c = case("chain_2_3_2")
    net = c.network()
    theta = rand_theta(net, 7, scale=20.0)
    tables, log_pmf = cgm_pmf(net, theta, 4)
    lp = np.asarray(CollectiveGraphicalModel(net, theta, 4).log_prob(tables))  # eager
    np.testing.assert_allclose(lp, log_pmf, rtol=1e-10, atol=1e-9)


def test_exact_log_prob_zero_records() -> None:
    net = case("chain_2_3_2").network()
    lp = CollectiveGraphicalModel(net, rand_theta(net, 0), 0).log_prob(jnp.zeros(net.num_params))
    assert abs(float(lp)) < TOL


def test_non_decomposable_network_is_a_clear_error() -> None:
    net = MarkovNetwork({"a": 2, "b": 2, "c": 2, "d": 2},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    cgm = CollectiveGraphicalModel(net, jnp.zeros(net.num_params), 4)
    n = np.asarray(features(net, np.zeros((4, 4), dtype=int)).sum(0))
    with pytest.raises(ValueError, match="decomposable"):
        cgm.log_prob(n)
    # the θ-dependent part is defined on any network: θ·n − N·A(θ) by enumeration
    theta = rand_theta(net, 3)
    bf = BruteForce(net, theta)
    cll = CollectiveGraphicalModel(net, theta, 4).complete_log_likelihood(n)
    np.testing.assert_allclose(float(cll), theta @ n - 4 * bf.log_z, rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------------------
# relaxed densities
# ------------------------------------------------------------------------------------------------
def stirling_log_density(theta: np.ndarray, n: np.ndarray, N: float, c: Case,
                         net: MarkovNetwork) -> np.ndarray:
    """``θ·n + N·H_JT(n/N) − N·A(θ)`` (seed 002, Eq. 5), written out here from the hand tree."""
    bf = BruteForce(net, theta)
    return np.array([theta @ row + N * jt_entropy(c, net, row / N) - N * bf.log_z
                     for row in np.atleast_2d(n)])


def test_stirling_relaxation_is_refused() -> None:
    """``relaxation="stirling"`` is a ValueError: its density does not integrate to one over
    ``N·M`` and the missing normaliser depends on θ (≈ √(2πN p(1−p)) for one binary attribute:
    5.06 at p = 0.3, N = 20), which would bias inference of θ."""
    net = MarkovNetwork({"a": 2}, [("a",)])
    c = Case("binary", (("a", 2),), (("a",),), (("a",),), (), N=20)
    with pytest.raises(ValueError, match="normaliser depends on θ"):
        CollectiveGraphicalModel(net, jnp.zeros(2), 20, relaxed=True, relaxation="stirling")
    # the reason, by quadrature over N·M = {(x, N − x) : 0 ≤ x ≤ N} (Lebesgue measure on x)
    x, w = np.polynomial.legendre.leggauss(400)
    x = 10.0 * (x + 1.0)
    n = np.stack([x, 20.0 - x], axis=1)
    mass = {}
    for p in (0.3, 0.5):
        theta = np.log([p, 1 - p])
        mass[p] = float(10.0 * np.sum(w * np.exp(stirling_log_density(theta, n, 20.0, c, net))))
    np.testing.assert_allclose(mass[0.3], 5.06, atol=0.01)
    assert mass[0.5] - mass[0.3] > 0.4  # the normaliser moves with θ


def test_lgamma_relaxation_is_stirling_plus_the_next_term() -> None:
    """``log n! = n log n − n + ½ log(2πn) + O(1/n)``: at large counts the lgamma relaxation
    differs from the Stirling form ``θ·n + N·H_JT(n/N) − N·A(θ)`` by
    ``−½[Σ_C Σ log 2πn_C − Σ_S Σ log 2πn_S − log 2πN]`` (junction tree written by hand)."""
    c = case("chain_2_3_2")
    net = c.network()
    theta = rand_theta(net, 4)
    other = BruteForce(net, rand_theta(net, 5))
    nu = features(net, other.records()).T @ other.probs()
    N = 1e6
    n = N * nu
    tabs = tables_of(net, n)
    half_log = lambda t: 0.5 * float(np.sum(np.log(2 * np.pi * t)))  # noqa: E731
    expected = -(half_log(tabs[("a", "b")]) + half_log(tabs[("b", "c")])
                 - half_log(project(tabs[("a", "b")], ("a", "b"), ("b",))) - half_log(N))
    a = jit_log_prob(theta, n, net=net, total=N, relaxed=True)
    b = stirling_log_density(theta, n, N, c, net)[0]
    assert min(n) > 1e4  # so that the O(1/n) remainder is below 1e-4 per cell
    np.testing.assert_allclose(float(a - b), expected, rtol=0, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# sampling and moments
# ------------------------------------------------------------------------------------------------
def test_sample_distribution_matches_enumeration() -> None:
    c = case("chain_2_3_2")
    net = c.network()
    theta = rand_theta(net, 6)
    N, S = 3, 20_000
    tables, log_pmf = cgm_pmf(net, theta, N)
    draws = np.asarray(jit_sample(theta, jax.random.key(0), net=net, total=N, shape=(S,)))
    assert draws.shape == (S, net.num_params)
    np.testing.assert_array_equal(draws, np.round(draws))
    assert np.all(draws >= 0) and np.all(is_consistent(net, draws, N))
    index = {tuple(t): i for i, t in enumerate(tables)}
    counts = np.zeros(len(tables))
    for d in draws:
        counts[index[tuple(d)]] += 1  # KeyError: a table the enumeration says is impossible
    probs = np.exp(log_pmf)
    tv = 0.5 * np.abs(counts / S - probs).sum()
    assert tv < tv_bound(probs, S, delta=1e-6), tv


def test_sample_mean_and_mean_property() -> None:
    c = case("triangle_plus_edge")
    net = c.network()
    theta = rand_theta(net, 8)
    N, S = 50, 4_000
    bf = BruteForce(net, theta)
    mu = features(net, bf.records()).T @ bf.probs()
    cgm = CollectiveGraphicalModel(net, theta, N)
    np.testing.assert_allclose(np.asarray(cgm.mean), N * mu, rtol=1e-10)
    draws = np.asarray(jit_sample(theta, jax.random.key(1), net=net, total=N, shape=(S,)))
    assert np.all(is_consistent(net, draws, N))
    # per cell, the mean of S draws has sd sqrt(N μ(1−μ)/S); allow 5 sd (fixed seed)
    sd = np.sqrt(N * mu * (1 - mu) / S)
    assert np.all(np.abs(draws.mean(0) - N * mu) <= 5 * sd + 1e-12)


def test_sample_with_free_attribute_and_disconnected_pieces() -> None:
    for name in ("attr_in_no_clique", "disconnected"):
        c = case(name)
        net = c.network()
        draws = np.asarray(jit_sample(rand_theta(net, 9), jax.random.key(2), net=net, total=c.N,
                                      shape=(200,)))
        assert np.all(is_consistent(net, draws, c.N))
        np.testing.assert_array_equal(draws, np.round(draws))


def test_complete_log_likelihood() -> None:
    c = case("chain_with_oneway")
    net = c.network()
    theta = rand_theta(net, 10)
    bf = BruteForce(net, theta)
    cgm = CollectiveGraphicalModel(net, theta, c.N)
    tables, log_pmf = cgm_pmf(net, theta, c.N)
    cll = np.asarray(cgm.complete_log_likelihood(tables))
    np.testing.assert_allclose(cll, tables @ theta - c.N * bf.log_z, rtol=0, atol=TOL)
    # log p(n) − (θ·n − N·A(θ)) = log h(n) does not depend on θ
    other = CollectiveGraphicalModel(net, rand_theta(net, 11), c.N)
    np.testing.assert_allclose(
        log_pmf - cll,
        np.asarray(other.log_prob(tables) - other.complete_log_likelihood(tables)),
        rtol=0, atol=TOL)
    # defined on real tables too
    x = tables[0] + 0.25
    np.testing.assert_allclose(float(cgm.complete_log_likelihood(x)),
                               x @ theta - c.N * bf.log_z, rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------------------
# batch shapes
# ------------------------------------------------------------------------------------------------
def test_batched_theta() -> None:
    c = case("chain_2_3_2")
    net = c.network()
    thetas = np.stack([rand_theta(net, s) for s in range(6)]).reshape(2, 3, -1)
    cgm = CollectiveGraphicalModel(net, thetas, c.N)
    assert cgm.batch_shape == (2, 3) and cgm.event_shape == (net.num_params,)
    tables, _ = cgm_pmf(net, thetas[0, 0], c.N)
    probe = tables[:4]
    lp, mean = jax.jit(lambda t, v: (lambda d: (d.log_prob(v), d.mean))(
        CollectiveGraphicalModel(net, t, c.N)))(thetas, probe[:, None, None, :])
    lp, mean = np.asarray(lp), np.asarray(mean)
    assert lp.shape == (4, 2, 3)
    assert mean.shape == (2, 3, net.num_params)
    for i, j in itertools.product(range(2), range(3)):
        _, ref = cgm_pmf_at(net, thetas[i, j], c.N, probe)
        np.testing.assert_allclose(lp[:, i, j], ref, rtol=0, atol=TOL)
        bf = BruteForce(net, thetas[i, j])
        np.testing.assert_allclose(mean[i, j], c.N * features(net, bf.records()).T @ bf.probs(),
                                   rtol=1e-10)
    draws = np.asarray(jax.jit(lambda t, k: CollectiveGraphicalModel(net, t, c.N).sample(
        k, (5,)))(thetas, jax.random.key(3)))
    assert draws.shape == (5, 2, 3, net.num_params)
    assert np.all(is_consistent(net, draws, c.N))


def test_batched_total_count() -> None:
    c = case("chain_with_oneway")
    net = c.network()
    theta = rand_theta(net, 12)
    counts = np.array([2, 3])
    cgm = CollectiveGraphicalModel(net, theta, counts)
    assert cgm.batch_shape == (2,)
    t2, lp2 = cgm_pmf(net, theta, 2)
    t3, lp3 = cgm_pmf(net, theta, 3)
    value = np.stack([t2[:5], t3[:5]], axis=1)  # (5, 2, P)
    # total_count traced under jit (only a concrete count is checked at construction)
    lp, mean = jax.jit(lambda t, n, v: (lambda d: (d.log_prob(v), d.mean))(
        CollectiveGraphicalModel(net, t, n)))(theta, counts, value)
    lp = np.asarray(lp)
    assert lp.shape == (5, 2)
    np.testing.assert_allclose(lp[:, 0], lp2[:5], rtol=0, atol=TOL)
    np.testing.assert_allclose(lp[:, 1], lp3[:5], rtol=0, atol=TOL)
    bf = BruteForce(net, theta)
    mu = features(net, bf.records()).T @ bf.probs()
    np.testing.assert_allclose(np.asarray(mean), counts[:, None] * mu, rtol=1e-10)


def cgm_pmf_at(net: MarkovNetwork, theta: np.ndarray, N: int,
               probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tables, log_pmf = cgm_pmf(net, theta, N)
    index = {tuple(t): i for i, t in enumerate(tables)}
    return probe, log_pmf[[index[tuple(p)] for p in probe]]


def test_log_prob_under_jit_and_vmap() -> None:
    c = case("triangle_plus_edge")
    net = c.network()
    theta = rand_theta(net, 13)
    tables, log_pmf = cgm_pmf(net, theta, c.N)

    @jax.jit
    def f(t, n):
        return CollectiveGraphicalModel(net, t, c.N).log_prob(n)

    lp = np.asarray(jax.vmap(f, in_axes=(None, 0))(theta, tables[:20]))
    np.testing.assert_allclose(lp, log_pmf[:20], rtol=0, atol=TOL)
    # ∇_θ log p(n; θ) = n − N μ(θ)
    bf = BruteForce(net, theta)
    grad = np.asarray(jax.grad(f)(theta, tables[3]))
    mu = features(net, bf.records()).T @ bf.probs()
    np.testing.assert_allclose(grad, tables[3] - c.N * mu, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------------------------
# supports
# ------------------------------------------------------------------------------------------------
def test_count_tables_constraint() -> None:
    c = case("chain_with_oneway")
    net = c.network()
    records = BruteForce(net, np.zeros(net.num_params)).records()  # every record once
    N = len(records)
    support = count_tables(net, N)
    assert support.is_discrete and support.event_dim == 1
    valid = features(net, records).sum(0)
    tabs = tables_of(net, valid)
    ab = net.slice_of(("a", "b")).start
    assert valid[ab + 1] >= 1
    inconsistent = valid.copy()
    # one record moved between cells of (a, b) that differ in b: (b) and (b, c) now disagree
    inconsistent[ab] += 1
    inconsistent[ab + 1] -= 1
    bad = {"inconsistent": inconsistent, "wrong_total": 2 * valid,
           "half_integer": valid + 0.5 * (np.arange(net.num_params) == ab)}
    # a consistent real point that is not integer: N·μ of some model
    bf = BruteForce(net, rand_theta(net, 5))
    real_point = N * features(net, bf.records()).T @ bf.probs()
    # integer, consistent, sums to N, but negative somewhere: a single-table network
    single = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    assert bool(count_tables(single, 5)(np.array([3.0, 1.0, 2.0, -1.0]))) is False
    assert bool(count_tables(single, 5)(np.array([3.0, 1.0, 1.0, 0.0])))
    assert bool(support(valid))
    assert tabs[("a",)].sum() == N
    for what, x in bad.items():
        assert not bool(support(x)), what
    assert not bool(support(real_point))
    assert bool(count_tables(net, 2 * N)(2 * valid))
    # batched values give one answer per table
    out = np.asarray(support(np.stack([valid, bad["inconsistent"], real_point])))
    np.testing.assert_array_equal(out, [True, False, False])
    assert bool(support(support.feasible_like(valid)))


def test_scaled_marginal_polytope_constraint() -> None:
    c = case("triangle_plus_edge")
    net = c.network()
    N = 25.0
    support = scaled_marginal_polytope(net, N)
    assert not support.is_discrete and support.event_dim == 1
    bf = BruteForce(net, rand_theta(net, 14))
    point = N * features(net, bf.records()).T @ bf.probs()
    assert bool(support(point))
    # integer count tables are in N·M too
    records = np.random.default_rng(1).integers(0, 2, size=(25, 4))
    assert bool(support(features(net, records).sum(0)))
    # tolerance is 1e-6 relative to N: a 1e-9 wobble passes, 1e-3 does not
    assert bool(support(point + 1e-9 * np.sin(np.arange(net.num_params))))
    shifted = point.copy()
    shifted[0] += 1e-3
    shifted[1] -= 1e-3
    assert not bool(support(shifted))  # (a, b, c) and (d, c) now disagree on c
    assert not bool(support(1.01 * point))  # wrong total
    negative = point.copy()
    negative[net.offsets[1]] = -1.0  # breaks sums and positivity
    assert not bool(support(negative))
    # a negative cell that keeps every sum and projection: cells of (a, b, c) with the same c
    tilt = point.copy()
    i0 = np.ravel_multi_index((0, 0, 0), (2, 2, 2))
    i1 = np.ravel_multi_index((1, 1, 0), (2, 2, 2))
    tilt[i0] = -0.5
    tilt[i1] += point[i0] + 0.5
    assert not bool(support(tilt))
    assert bool(support(support.feasible_like(point)))
    batch = np.stack([point, shifted, tilt])
    np.testing.assert_array_equal(np.asarray(support(batch)), [True, False, False])


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
def test_errors() -> None:
    net = case("chain_2_3_2").network()
    theta = jnp.zeros(net.num_params)
    for bad in (-1, 2.5, np.array([3, -2]), np.array([1.5])):
        with pytest.raises(ValueError, match="total_count"):
            CollectiveGraphicalModel(net, theta, bad)
    with pytest.raises(ValueError, match="theta"):
        CollectiveGraphicalModel(net, jnp.zeros(net.num_params + 1), 3)
    with pytest.raises(ValueError, match="theta"):
        CollectiveGraphicalModel(net, jnp.zeros(()), 3)
    with pytest.raises(ValueError, match="relaxation"):
        CollectiveGraphicalModel(net, theta, 3, relaxed=True, relaxation="gamma")
    with pytest.raises(TypeError, match="MarkovNetwork"):
        CollectiveGraphicalModel({"a": 2}, theta, 3)
    # theta given as tables is flattened in the network's layout
    tabs = net.unflatten(jnp.arange(net.num_params, dtype=float))
    np.testing.assert_array_equal(
        np.asarray(CollectiveGraphicalModel(net, tabs, 3).theta), np.arange(net.num_params))


def test_out_of_support_is_flagged_when_validating() -> None:
    net = case("chain_2_3_2").network()
    cgm = CollectiveGraphicalModel(net, jnp.zeros(net.num_params), 2, validate_args=True)
    x = np.asarray(features(net, np.zeros((2, 3), dtype=int)).sum(0))
    with pytest.warns(UserWarning, match="support"):
        cgm.log_prob(x * 1.5)
