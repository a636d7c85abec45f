"""NLBP (seed 002, Algorithm 1) against the exact MAP of the relaxed CGM posterior.

The reference maximum of ``F(n) = θ·n + H(n) + log p(y | n)`` over ``N·M`` is computed
independently through its Fenchel dual. With ``log p(y | n) = −Σ_i ρ_i((y − L n)_i)`` for a linear
map ``L`` and ``ρ(r) = |r|/b`` (Laplace) or ``r²/(2σ²)`` (Gaussian), writing ``−ρ(r) = min_λ λr +
ρ*(λ)`` and exchanging min and max (concave–convex, λ in a compact box or ρ* strongly convex)
turns ``max_n F`` into

    min_λ  λ·y + Σ_i ρ*_i(λ_i) + N·A(θ − Lᵀλ),   ρ* = 0 on [−1/b, 1/b] (Laplace), σ²λ²/2,

a smooth problem solved by scipy's L-BFGS-B with ``A`` and its gradient by enumerating the
joint. The maximiser is ``n* = N·μ(θ − Lᵀλ*)``; the duality gap ``D(λ*) − F(n*)`` certifies the
reference (L-BFGS-B is restarted until it does, and the test fails if it never does). ``F``
itself is evaluated with the junction-tree entropy written out by hand.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce, features
from scipy.optimize import minimize
from scipy.special import logsumexp, xlogy

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.oracles.nlbp import NLBPResult, nlbp_map

TABLE = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
CHAIN = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])


# ------------------------------------------------------------------------------------------------
# independent reference
# ------------------------------------------------------------------------------------------------


def jt_entropy(net: MarkovNetwork, n: np.ndarray, N: float) -> float:
    """``N·H_JT(n/N)`` for the two networks of this file (junction tree by hand)."""
    h = lambda t: float(-np.sum(xlogy(t / N, t / N)))  # noqa: E731
    if net == TABLE:
        return N * h(n)
    ab, bc = n[:6].reshape(2, 3), n[6:].reshape(3, 2)
    return N * (h(ab) + h(bc) - h(ab.sum(0)))


class Evidence(NamedTuple):
    """``log p(y|n) = −Σ_i w1_i |y_i − (Ln)_i| − Σ_i w2_i (y_i − (Ln)_i)²/2``."""

    L: np.ndarray
    y: np.ndarray
    w1: np.ndarray  # 1/b on Laplace rows, 0 elsewhere
    w2: np.ndarray  # 1/σ² on Gaussian rows, 0 elsewhere

    def args(self) -> tuple:
        return tuple(jnp.asarray(a) for a in self)

    def value(self, n: np.ndarray) -> float:
        r = self.y - self.L @ n
        return float(-np.sum(self.w1 * np.abs(r)) - np.sum(self.w2 * r**2) / 2)


def log_evidence(n, L, y, w1, w2):
    """The same function in JAX, for NLBP (module level: one compiled loop for all tests)."""
    r = y - L @ n
    return -jnp.sum(w1 * jnp.abs(r)) - jnp.sum(w2 * r**2) / 2


class Problem(NamedTuple):
    net: MarkovNetwork
    theta: np.ndarray
    N: float
    ev: Evidence

    def F(self, n: np.ndarray) -> float:
        n = np.asarray(n)
        return float(self.theta @ n) + jt_entropy(self.net, n, self.N) + self.ev.value(n)


class Optimum(NamedTuple):
    F: float
    n: np.ndarray


class BruteForceMarginals:
    """``μ(t)`` by enumerating the joint of ``p.net``."""

    def __init__(self, p: Problem):
        bf = BruteForce(p.net, np.zeros(p.net.num_params))
        self.phi = features(p.net, bf.records())

    def of(self, t: np.ndarray) -> np.ndarray:
        s = self.phi @ t
        return self.phi.T @ np.exp(s - logsumexp(s))


def exact_map(p: Problem) -> Optimum:
    oracle = BruteForceMarginals(p)
    phi, mu = oracle.phi, oracle.of
    L, y, w1, w2 = p.ev
    laplace = w1 > 0

    def dual(lam: np.ndarray) -> tuple[float, np.ndarray]:
        t = p.theta - L.T @ lam
        var = np.where(laplace, 0.0, 1.0 / np.where(laplace, 1.0, w2))
        value = lam @ y + np.sum(var * lam**2) / 2 + p.N * logsumexp(phi @ t)
        return value, y - L @ (p.N * mu(t)) + var * lam

    bounds = [(-w, w) if lap else (None, None) for w, lap in zip(w1, laplace, strict=True)]
    # L-BFGS-B may stop early on a line search ("ABNORMAL_TERMINATION"), which says nothing of
    # the answer: restart it from where it stopped (fresh curvature pairs) until the duality gap
    # certifies the optimum, and fail loudly if it never does
    lam, gap = np.zeros(len(y)), np.inf
    for _ in range(8):
        res = minimize(dual, lam, jac=True, method="L-BFGS-B", bounds=bounds,
                       options=dict(ftol=1e-16, gtol=1e-12, maxiter=10_000, maxcor=30))
        lam = res.x
        n_star = p.N * mu(p.theta - L.T @ lam)
        f_star = p.F(n_star)
        gap = res.fun - f_star
        if -1e-9 <= gap <= 1e-7:
            return Optimum(f_star, n_star)
    raise AssertionError(f"reference not certified: duality gap {gap}")


def block(net: MarkovNetwork, clique: tuple[str, ...]) -> np.ndarray:
    """``L`` selecting one clique's table from ``n``."""
    sl = net.slice_of(clique)
    return np.eye(net.num_params)[sl]


def make(net: MarkovNetwork, N: float, rows: list[tuple[np.ndarray, str, float]],
         seed: int) -> Problem:
    """Truth ``θ``, records' expected counts, and noisy answers of the linear maps ``rows``."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-1, 1, net.num_params)
    bf = BruteForce(net, theta)
    n_true = N * features(net, bf.records()).T @ bf.probs()
    Ls, ys, w1, w2 = [], [], [], []
    for L, kind, scale in rows:
        m = L.shape[0]
        noise = rng.laplace(0, scale, m) if kind == "laplace" else rng.normal(0, scale, m)
        Ls.append(L)
        ys.append(L @ n_true + noise)
        w1.append(np.full(m, 1 / scale if kind == "laplace" else 0.0))
        w2.append(np.full(m, 1 / scale**2 if kind == "gaussian" else 0.0))
    # the model's θ differs from the truth, so the evidence has something to correct
    theta0 = rng.uniform(-1, 1, net.num_params)
    ev = Evidence(np.concatenate(Ls), np.concatenate(ys), np.concatenate(w1), np.concatenate(w2))
    return Problem(net, theta0, N, ev)


def run(p: Problem, **kw) -> NLBPResult:
    return nlbp_map(p.net, jnp.asarray(p.theta), p.N, log_evidence, p.ev.args(), **kw)


# marginalising query: the one-way table of "a" from the (a, b) table of CHAIN
Q_A = np.kron(np.eye(2), np.ones((1, 3))) @ block(CHAIN, ("a", "b"))

PROBLEMS = {
    "table_laplace": make(TABLE, 100.0, [(np.eye(4), "laplace", 2.0)], seed=0),
    "chain_laplace": make(CHAIN, 200.0, [(np.eye(12), "laplace", 3.0)], seed=1),
    "chain_gaussian": make(CHAIN, 200.0, [(np.eye(12), "gaussian", 4.0)], seed=2),
    "chain_mixed": make(CHAIN, 200.0, [(block(CHAIN, ("a", "b")), "laplace", 2.0),
                                       (block(CHAIN, ("b", "c")), "gaussian", 3.0)], seed=3),
    "chain_partial_query": make(CHAIN, 200.0, [(Q_A, "laplace", 3.0)], seed=4),
}


@pytest.fixture(scope="module")
def optima() -> dict[str, Optimum]:
    return {k: exact_map(p) for k, p in PROBLEMS.items()}


def on_scaled_polytope(net: MarkovNetwork, n: np.ndarray, N: float, atol: float = 1e-8) -> bool:
    """Positive, every table sums to N, tables agree on shared attributes."""
    n = np.asarray(n)
    if np.any(n <= 0):
        return False
    sl = [net.slice_of(c) for c in net.cliques]
    if any(abs(n[s].sum() - N) > atol for s in sl):
        return False
    if net == CHAIN:
        b_from_ab = n[sl[0]].reshape(2, 3).sum(0)
        b_from_bc = n[sl[1]].reshape(3, 2).sum(1)
        return bool(np.max(np.abs(b_from_ab - b_from_bc)) <= atol)
    return True


# ------------------------------------------------------------------------------------------------
# the MAP
# ------------------------------------------------------------------------------------------------
# Natural-space NLBP with its default α_t = 1/(1+t) is entropic mirror descent with averaged
# targets: on these models F* − F(n_T) fell from ~1e-2 nats (T = 200) to ~1e-4 (T = 20,000) with
# Laplace evidence; Gaussian evidence is exact to round-off within a few hundred iterations.
NATURAL_ITERS = 20_000
NATURAL_ABS = 1e-3  # nats
NATURAL_REL = 1e-6  # of |F*|


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_natural_space_reaches_the_exact_map(name: str, optima: dict[str, Optimum]) -> None:
    p, opt = PROBLEMS[name], optima[name]
    res = run(p, max_iters=NATURAL_ITERS, tol=0.0)
    n = np.asarray(res.n)
    f = p.F(n)
    # the reported objective is F at the returned n (exact in natural space)
    np.testing.assert_allclose(float(res.objective), f, rtol=1e-12, atol=1e-9)
    assert f <= opt.F + 1e-8  # nothing beats the optimum on N·M
    assert opt.F - f <= min(NATURAL_ABS, NATURAL_REL * abs(opt.F)), (opt.F, f)
    assert on_scaled_polytope(p.net, n, p.N)
    # F is strictly concave on N·M (entropy), so n itself approaches the unique maximiser
    # (measured: ≤ 2e-3 counts on every problem here)
    assert np.max(np.abs(n - opt.n)) <= 2e-2


def test_gaussian_evidence_converges_fast(optima: dict[str, Optimum]) -> None:
    p, opt = PROBLEMS["chain_gaussian"], optima["chain_gaussian"]
    res = run(p, max_iters=2000, tol=1e-12, damping=0.2)
    assert bool(res.converged) and int(res.iterations) < 2000
    np.testing.assert_allclose(np.asarray(res.n), opt.n, rtol=0, atol=1e-6)
    np.testing.assert_allclose(p.F(np.asarray(res.n)), opt.F, rtol=1e-12, atol=1e-8)


@pytest.mark.parametrize("name", ["chain_laplace", "chain_gaussian", "chain_partial_query"])
def test_count_space_reaches_the_same_fixed_point(name: str, optima: dict[str, Optimum]) -> None:
    """Seed 002's Algorithm 1 as printed (damping in count space, α_t = 0.5/(1+t/10))."""
    p, opt = PROBLEMS[name], optima[name]
    res = run(p, space="counts", max_iters=NATURAL_ITERS, tol=0.0)
    n = np.asarray(res.n)
    assert on_scaled_polytope(p.net, n, p.N)
    # measured: ≤ 4e-3 nats and 5e-3 counts after 20,000 iterations
    assert -1e-8 <= opt.F - p.F(n) <= 2e-2
    assert np.max(np.abs(n - opt.n)) <= 5e-2


# ------------------------------------------------------------------------------------------------
# iterates, trace, best iterate
# ------------------------------------------------------------------------------------------------
def brute_nlbp(p: Problem, space: str, steps: int) -> tuple[list[np.ndarray], list[float]]:
    """Algorithm 1 with the brute-force marginal oracle: n per iteration and F per trace entry.

    Natural space: ``η ← (1−α)η + α(θ + g(n))``, ``n = Nμ(η)``, α_t = 1/(1+t); trace F(n).
    Count space: ``n' = Nμ(θ + g(n))``, ``n ← (1−α)n + αn'``, α_t = 0.5/(1+t/10); trace F(n').
    """
    mu = BruteForceMarginals(p).of
    L, y, w1, w2 = p.ev

    def grad(n):
        r = y - L @ n
        return L.T @ (w1 * np.sign(r) + w2 * r)

    eta, n = p.theta.copy(), p.N * mu(p.theta)
    ns, fs = [], []
    for t in range(steps):
        target = p.theta + grad(n)
        if space == "natural":
            a = 1.0 / (1 + t)
            eta = (1 - a) * eta + a * target
            n = p.N * mu(eta)
            fs.append(p.F(n))
        else:
            a = 0.5 / (1 + t / 10)
            n_bp = p.N * mu(target)
            n = (1 - a) * n + a * n_bp
            fs.append(p.F(n_bp))
        ns.append(n)
    return ns, fs


@pytest.mark.parametrize("space", ["natural", "counts"])
def test_trace_and_best_iterate_semantics(space: str) -> None:
    p = PROBLEMS["chain_mixed"]
    steps = 25
    ns, fs = brute_nlbp(p, space, steps)
    res = run(p, space=space, max_iters=steps, tol=0.0)
    trace = np.asarray(res.trace)
    assert trace.shape == (steps,) and int(res.iterations) == steps
    assert not bool(res.converged)
    np.testing.assert_allclose(trace, fs, rtol=1e-9, atol=1e-7)
    f0 = p.F(p.N * np.asarray(BruteForceMarginals(p).of(p.theta)))
    if space == "natural":
        # the best iterate (initial point included) is returned, with its F and its η
        best = int(np.argmax(fs))
        assert float(res.objective) == pytest.approx(max(f0, max(fs)), rel=1e-12)
        if fs[best] > f0:
            np.testing.assert_allclose(np.asarray(res.n), ns[best], rtol=1e-9, atol=1e-8)
        np.testing.assert_allclose(
            p.N * BruteForceMarginals(p).of(np.asarray(res.eta)), np.asarray(res.n),
            rtol=1e-9, atol=1e-8)
    else:
        # the final damped n is returned; the objective is F of the last BP output
        np.testing.assert_allclose(np.asarray(res.n), ns[-1], rtol=1e-9, atol=1e-8)
        assert float(res.objective) == pytest.approx(fs[-1], rel=1e-12)
    # with more room than needed, the trace is nan after the last iteration
    res = run(PROBLEMS["chain_gaussian"], space=space, max_iters=400, tol=1e-6)
    k = int(res.iterations)
    assert bool(res.converged) and 0 < k < 400
    trace = np.asarray(res.trace)
    assert np.all(np.isfinite(trace[:k])) and np.all(np.isnan(trace[k:]))


@pytest.mark.parametrize("space", ["natural", "counts"])
def test_every_iterate_stays_on_the_scaled_polytope(space: str) -> None:
    """Every point NLBP evaluates the evidence at (its iterates and BP outputs) is in N·M."""
    p = PROBLEMS["chain_laplace"]
    seen: list[np.ndarray] = []

    def spy(n, L, y, w1, w2):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), n)
        return log_evidence(n, L, y, w1, w2)

    nlbp_map(p.net, jnp.asarray(p.theta), p.N, spy, p.ev.args(), space=space, max_iters=60,
             tol=0.0)
    assert len(seen) >= 60
    for n in seen:
        assert on_scaled_polytope(p.net, n, p.N, atol=1e-8)


def test_converged_flag_and_warm_start(optima: dict[str, Optimum]) -> None:
    p = PROBLEMS["chain_gaussian"]
    short = run(p, max_iters=3, tol=1e-12, damping=0.2)
    assert not bool(short.converged) and int(short.iterations) == 3
    full = run(p, max_iters=500, tol=1e-10, damping=0.2)
    assert bool(full.converged) and int(full.iterations) < 500
    # a warm start at the answer (shifted by a gauge constant per clique) stays there
    gauge = np.concatenate([np.full(s, 0.7 * (i + 1)) for i, s in enumerate(p.net.sizes)])
    warm = run(p, max_iters=500, tol=1e-10, damping=0.2,
               eta0=jnp.asarray(np.asarray(full.eta) + gauge))
    assert bool(warm.converged) and int(warm.iterations) < int(full.iterations) / 3
    np.testing.assert_allclose(np.asarray(warm.n), optima["chain_gaussian"].n, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
def test_errors() -> None:
    p = PROBLEMS["table_laplace"]
    with pytest.raises(ValueError, match="space"):
        run(p, space="dual")
    for bad in (0.0, -0.2, 1.5):
        with pytest.raises(ValueError, match="damping"):
            run(p, damping=bad)
    with pytest.raises(ValueError, match="max_iters"):
        run(p, max_iters=0)
    # damping = 1 is allowed (undamped)
    res = run(p, damping=1.0, max_iters=2)
    assert int(res.iterations) == 2
