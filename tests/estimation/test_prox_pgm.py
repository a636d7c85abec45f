"""Prox-PGM (seed 003, Algorithm 1) against exact answers.

References used here are independent of the library's inference: the full joint distribution
enumerated with numpy, iterative proportional fitting on that joint (the maximum-entropy
distribution with given marginals; its convergence is asserted), accelerated projected gradient
on the convex problem ``min_{p ∈ Δ} L(M p)`` over the joint, certified by its Frank–Wolfe
duality gap (``oracles.certified``), and scipy's linear programming (HiGHS, its status
asserted) for the L1 loss.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np
import pytest
from oracles.certified import simplex_qp
from scipy.optimize import linprog

from numpyro_dpgm import Domain, MarkovNetwork, MarkovRandomField
from numpyro_dpgm.estimation.prox_pgm import (
    ExactOracle,
    estimate_total,
    measurement_loss,
)
from numpyro_dpgm.estimation.prox_pgm import prox_pgm as prox_pgm_any_stop
from numpyro_dpgm.infer.result import Result, answer_queries
from numpyro_dpgm.measurements import DiscreteLaplace, Gaussian, Laplace, Measurement

#: These tests check the minimiser of Problem 1, so every fit here iterates to it; the default
#: ``stop="auto"`` may return an earlier iterate of the path (tests/estimation/
#: test_prox_pgm_risk.py checks that rule).
prox_pgm = functools.partial(prox_pgm_any_stop, stop="optimum")


# ------------------------------------------------------------------------------------------------
# Brute-force references over the full joint
# ------------------------------------------------------------------------------------------------
def joint_of(net: MarkovNetwork, theta: np.ndarray) -> np.ndarray:
    """``p_θ`` as an array with one axis per domain attribute (domain order)."""
    attrs, shape = net.domain.attrs, net.domain.shape
    logp = np.zeros(shape)
    tables = np.split(np.asarray(theta, dtype=float), np.cumsum(net.sizes)[:-1])
    for clique, flat in zip(net.cliques, tables, strict=True):
        table = flat.reshape([net.domain[a] for a in clique])
        order = sorted(range(len(clique)), key=lambda i: attrs.index(clique[i]))
        table = np.transpose(table, order)
        logp = logp + table.reshape([net.domain[a] if a in clique else 1 for a in attrs])
    p = np.exp(logp - logp.max())
    return p / p.sum()


def marginal_of(joint: np.ndarray, domain: Domain, attrs: tuple[str, ...]) -> np.ndarray:
    """Marginal of a joint over ``attrs`` (axes in the order given)."""
    keep = [domain.attrs.index(a) for a in attrs]
    drop = tuple(i for i in range(joint.ndim) if i not in keep)
    table = joint.sum(axis=drop)
    kept = sorted(keep)
    return np.transpose(table, [kept.index(i) for i in keep])


def marginal_matrix(domain: Domain, attrs: tuple[str, ...]) -> np.ndarray:
    """``M`` with ``M @ joint.ravel()`` = the raveled marginal table over ``attrs``."""
    idx = np.indices(domain.shape).reshape(len(domain), -1)
    sizes = [domain[a] for a in attrs]
    cell = np.ravel_multi_index(tuple(idx[domain.attrs.index(a)] for a in attrs), sizes)
    m = np.zeros((math.prod(sizes), idx.shape[1]))
    m[cell, np.arange(idx.shape[1])] = 1.0
    return m


def ipf(domain: Domain, targets: dict[tuple[str, ...], np.ndarray], sweeps: int = 3000):
    """Iterative proportional fitting from uniform: the max-entropy joint with these marginals."""
    q = np.full(domain.shape, 1.0 / domain.size())
    for _ in range(sweeps):
        for attrs, target in targets.items():
            current = marginal_of(q, domain, attrs)
            ratio = np.where(current > 0, target / current, 0.0)
            ordered = sorted(attrs, key=domain.attrs.index)
            ratio = np.transpose(ratio, [attrs.index(a) for a in ordered])
            q = q * ratio.reshape([domain[a] if a in attrs else 1 for a in domain.attrs])
    return q


def stacked_problem(domain: Domain, measurements: list[Measurement], total: float):
    """``A p − y`` over the joint ``p`` (probability scale) with per-row weights and kinds."""
    rows, ys, ws, l1 = [], [], [], []
    for m in measurements:
        kind, weight = measurement_loss(m, "auto")
        rows.append(m.matrix() @ (total * marginal_matrix(domain, m.clique)))
        ys.append(m.values)
        ws.append(np.full(m.values.size, weight))
        l1.append(np.full(m.values.size, kind == "l1"))
    return np.vstack(rows), np.concatenate(ys), np.concatenate(ws), np.concatenate(l1)


def certified_l2(domain: Domain, measurements: list[Measurement], total: float) -> float:
    """``min_{p ∈ simplex} Σ ½ w (A p − y)²`` over the full joint, certified by its duality gap."""
    a, y, w, l1 = stacked_problem(domain, measurements, total)
    assert not l1.any()
    _, value = simplex_qp(a, y, w, gap_tol=1e-11)
    return value


def lp_l1(domain: Domain, measurements: list[Measurement], total: float) -> float:
    """``min_{p ∈ simplex} Σ w |A p − y|`` over the full joint, as a linear programme."""
    a, y, w, l1 = stacked_problem(domain, measurements, total)
    assert l1.all()
    k, n = a.shape
    c = np.concatenate([np.zeros(n), w])
    a_ub = np.block([[a, -np.eye(k)], [-a, -np.eye(k)]])
    a_eq = np.concatenate([np.ones(n), np.zeros(k)])[None]
    res = linprog(c, A_ub=a_ub, b_ub=np.concatenate([y, -y]), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0, None)] * (n + k), method="highs")
    assert res.status == 0
    return float(res.fun)


def exact_loss(domain: Domain, measurements: list[Measurement], total: float, p: np.ndarray):
    a, y, w, l1 = stacked_problem(domain, measurements, total)
    r = a @ p.ravel() - y
    return float(np.sum(np.where(l1, w * np.abs(r), 0.5 * w * r * r)))


def table_measurements(net, theta, total, noise, rng=None, cliques=None):
    """Measurements of the clique tables of ``p_θ`` scaled to ``total`` (noisy if ``rng``)."""
    joint = joint_of(net, theta)
    out = []
    for c in cliques or net.cliques:
        y = total * marginal_of(joint, net.domain, c).ravel()
        if rng is not None:
            scale = noise.sigma if isinstance(noise, Gaussian) else noise.scale
            draw = rng.normal if isinstance(noise, Gaussian) else rng.laplace
            y = y + draw(scale=scale, size=y.size)
        out.append(Measurement(c, y, noise))
    return out


# Few distinct structures, so that the compiled programs are shared between tests.
CYCLE = MarkovNetwork({"a": 2, "b": 3, "c": 2, "d": 3},
                      [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
CHAIN = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
ITERS = 20000


# ------------------------------------------------------------------------------------------------
# (a) noiseless, consistent measurements
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("net", [CHAIN, CYCLE], ids=["chain", "cycle"])
def test_noiseless_recovers_the_model(net):
    """Decomposable (a chain) and not (a 4-cycle): the marginals and the model come back."""
    rng = np.random.default_rng(0)
    dom = net.domain
    theta = rng.normal(size=net.num_params)
    total = 1000.0
    ms = table_measurements(net, theta, total, Gaussian(1.0))
    fit = prox_pgm(ms, net, total_count=total, max_iters=ITERS)
    assert isinstance(fit, Result) and isinstance(fit.model, MarkovRandomField)
    assert fit.converged and fit.iterations < ITERS
    truth = joint_of(net, theta)
    for c in net.cliques:
        want = marginal_of(truth, dom, c)
        np.testing.assert_allclose(np.asarray(fit.extras["marginals"][c]) / total, want,
                                   atol=1e-6)
        np.testing.assert_allclose(np.asarray(fit.model.marginal(c)), want, atol=1e-6)
    # the family holds the truth, so the fitted distribution is the truth itself
    np.testing.assert_allclose(joint_of(net, np.asarray(fit.theta)), truth, atol=1e-6)
    assert float(fit.loss_trace[-1]) < 1e-8


def test_appgm_on_a_tree_recovers_the_model():
    """APPGM (Convex-GBP oracle): on a tree the local polytope is the marginal polytope, so
    noiseless measurements give the true marginals, and the returned model is their
    maximum-entropy (here: the true) distribution."""
    rng = np.random.default_rng(3)
    theta = rng.normal(size=CHAIN.num_params)
    total = 1000.0
    ms = table_measurements(CHAIN, theta, total, Gaussian(1.0))
    fit = prox_pgm(ms, CHAIN, total_count=total, max_iters=3000, oracle="convex_gbp")
    assert fit.extras["model_fit"] == "max_entropy"
    truth = joint_of(CHAIN, theta)
    for c in CHAIN.cliques:
        want = marginal_of(truth, CHAIN.domain, c)
        np.testing.assert_allclose(np.asarray(fit.extras["marginals"][c]) / total, want,
                                   atol=1e-3)
        np.testing.assert_allclose(np.asarray(fit.model.marginal(c)), want, atol=1e-3)


def test_appgm_model_fit_oracle_keeps_the_oracles_fit():
    """``model_fit="oracle"`` skips the maximum-entropy model: the same iterations and
    pseudo-marginals, the oracle's ``θ̂`` as the model; a bad choice is refused."""
    rng = np.random.default_rng(3)
    ms = table_measurements(CHAIN, rng.normal(size=CHAIN.num_params), 1000.0, Gaussian(1.0))
    options = dict(total_count=1000.0, max_iters=200, oracle="convex_gbp", tol=0.0)
    full = prox_pgm(ms, CHAIN, **options)
    kept = prox_pgm(ms, CHAIN, **options, model_fit="oracle")
    assert kept.extras["model_fit"] == "oracle" and full.extras["model_fit"] == "max_entropy"
    for c in CHAIN.cliques:
        np.testing.assert_array_equal(np.asarray(kept.extras["marginals"][c]),
                                      np.asarray(full.extras["marginals"][c]))
    assert not np.allclose(np.asarray(kept.theta), np.asarray(full.theta))
    with pytest.raises(ValueError, match="model_fit must be one of"):
        prox_pgm(ms, CHAIN, **options, model_fit="mle")


def test_maximum_entropy_model_that_does_not_converge_says_so():
    """A maximum-entropy fit cut before its tolerance warns and is marked in ``model_fit``."""
    from numpyro_dpgm.estimation.prox_pgm import ProxPGMConvergenceWarning, _max_entropy_model
    from numpyro_dpgm.oracles import junction_tree as jt

    theta = np.random.default_rng(3).normal(size=CHAIN.num_params)
    pseudo = CHAIN.flatten(jt.marginals(CHAIN, jnp.asarray(theta)))
    with pytest.warns(ProxPGMConvergenceWarning, match="did not converge in 2 L-BFGS"):
        _, how = _max_entropy_model(CHAIN, pseudo, jnp.zeros(CHAIN.num_params), max_iters=2)
    assert how == "max_entropy (not converged)"
    fitted, how = _max_entropy_model(CHAIN, pseudo, jnp.zeros(CHAIN.num_params))
    assert how == "max_entropy"  # the same fit with its 1,000 iterations converges


def test_noiseless_measurements_give_the_maximum_entropy_distribution():
    """Pairwise tables of a joint with a 4-way interaction: the fit is the I-projection."""
    rng = np.random.default_rng(1)
    dom = CYCLE.domain
    truth = rng.dirichlet(np.ones(dom.size())).reshape(dom.shape)
    total = 500.0
    ms = [Measurement(c, total * marginal_of(truth, dom, c).ravel(), Gaussian(1.0))
          for c in CYCLE.cliques]
    fit = prox_pgm(ms, dom, total_count=total, max_iters=ITERS)
    assert fit.network == CYCLE  # the measured cliques, attributes in domain order
    maxent = ipf(dom, {c: marginal_of(truth, dom, c) for c in CYCLE.cliques})
    for c in CYCLE.cliques:  # IPF converged: it matches the targets
        np.testing.assert_allclose(marginal_of(maxent, dom, c), marginal_of(truth, dom, c),
                                   atol=1e-12)
    fitted = joint_of(fit.network, np.asarray(fit.theta))
    np.testing.assert_allclose(fitted, maxent, atol=1e-6)
    assert not np.allclose(fitted, truth, atol=1e-3)  # the truth is not the max-ent answer
    # an out-of-model query is answered from the max-entropy distribution
    answers = answer_queries(fit, [("a", "c"), ("d", "b", "a")])
    np.testing.assert_allclose(np.asarray(answers[("a", "c")]),
                               total * marginal_of(maxent, dom, ("a", "c")), atol=1e-3)
    np.testing.assert_allclose(np.asarray(answers[("d", "b", "a")]),
                               total * marginal_of(maxent, dom, ("d", "b", "a")), atol=1e-3)


def test_domain_input_builds_the_network_from_maximal_measured_cliques():
    rng = np.random.default_rng(2)
    dom = Domain({"a": 2, "b": 3, "c": 2, "z": 2})
    net = MarkovNetwork(dom, [("a", "b"), ("b", "c")])
    theta = rng.normal(size=net.num_params)
    total = 200.0
    joint = joint_of(net, theta)
    ms = [
        Measurement(("b", "a"), total * marginal_of(joint, dom, ("b", "a")).ravel(),
                    Gaussian(1.0)),
        Measurement(("c", "b"), total * marginal_of(joint, dom, ("c", "b")).ravel(),
                    Gaussian(2.0)),
        Measurement("b", total * marginal_of(joint, dom, ("b",)), Gaussian(0.5)),
    ]
    fit = prox_pgm(ms, dom, total_count=total, max_iters=ITERS)
    assert fit.network.cliques == (("a", "b"), ("b", "c"))
    for attrs in [("b", "a"), ("c", "b"), ("b",)]:
        np.testing.assert_allclose(np.asarray(fit.model.marginal(attrs)),
                                   marginal_of(joint, dom, attrs), atol=1e-6)
    # "z" is in no measurement: it stays uniform and independent
    np.testing.assert_allclose(np.asarray(fit.model.marginal(("z", "a"))),
                               np.tile(0.5 * marginal_of(joint, dom, ("a",)), (2, 1)), atol=1e-6)


# ------------------------------------------------------------------------------------------------
# (b) the line search never lets the objective rise
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step_size", [None, 1.0])
def test_loss_trace_is_non_increasing(step_size):
    rng = np.random.default_rng(3)
    theta = rng.normal(size=CYCLE.num_params)
    total = 300.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(5.0), rng)
    fit = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, step_size=step_size)
    trace = np.asarray(fit.loss_trace)
    assert trace.shape == (fit.iterations + 1,)
    assert np.all(np.isfinite(trace))
    assert np.all(np.diff(trace) <= 0.0)
    assert trace[-1] < 0.5 * trace[0]
    if step_size == 1.0:  # far too long a step: the line search must have rejected some
        assert fit.extras["rejected_steps"] > 0
        assert fit.extras["step_size"] < 1.0
    # the trace is the loss of the returned model
    want = exact_loss(CYCLE.domain, ms, total, joint_of(CYCLE, np.asarray(fit.theta)))
    assert float(trace[-1]) == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------------------------------------
# (c) general linear queries: a second solver on the full joint, and the optimality conditions
# ------------------------------------------------------------------------------------------------
def test_general_queries_match_a_second_solver_and_satisfy_optimality():
    rng = np.random.default_rng(4)
    dom = CYCLE.domain
    theta = rng.normal(size=CYCLE.num_params)
    total = 100.0
    truth = joint_of(CYCLE, theta)
    sum_over_c = np.kron(np.ones((1, 2)), np.eye(3))  # (c, d) table -> d marginal
    random_q = rng.normal(size=(4, 6))                 # 4 random linear queries of (b, c)
    specs = [
        (("a", "b"), None, Gaussian(1.0)),
        (("b", "c"), random_q, Gaussian(2.0)),
        (("c", "d"), sum_over_c, Gaussian(0.5)),
        (("d", "a"), None, Gaussian(3.0)),
    ]
    ms = []
    for clique, q, noise in specs:
        table = total * marginal_of(truth, dom, clique).ravel()
        exact = table if q is None else q @ table
        ms.append(Measurement(clique, exact + rng.normal(scale=0.3, size=exact.size), noise, q))
    # the optimum has zero cells: certify first-order optimality to 1e-8 with a tighter tol
    fit = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, tol=1e-13)
    assert fit.converged
    p_hat = joint_of(CYCLE, np.asarray(fit.theta))
    ours = exact_loss(dom, ms, total, p_hat)
    assert ours == pytest.approx(float(fit.loss_trace[-1]), rel=1e-9)
    reference = certified_l2(dom, ms, total)
    assert ours <= reference + 1e-7 * max(1.0, reference)
    assert ours == pytest.approx(reference, rel=1e-6, abs=1e-8)
    # first-order optimality on the simplex: ∂L/∂p(x) equals its mean c where p̂(x) > 0 and is
    # at least c where p̂(x) = 0 (this instance's optimum has zeros; p̂ is ~1e-14 there)
    a, y, w, _ = stacked_problem(dom, ms, total)
    p = p_hat.ravel()
    g = a.T @ (w * (a @ p - y))
    c = g @ p
    scale = np.max(np.abs(a.T @ (w * y)))
    support = p > 1e-8
    assert 0 < np.sum(~support) < p.size
    assert np.max(np.abs(g[support] - c)) < 1e-8 * scale
    assert np.min(g - c) > -1e-8 * scale
    assert np.min(g[~support] - c) > 1e-4 * scale  # strict complementarity


def test_l2_on_laplace_noise_uses_the_variance():
    kind, weight = measurement_loss(Measurement(("a",), [1.0, 2.0], Laplace(3.0)), "l2")
    assert kind == "l2" and weight == pytest.approx(1.0 / 18.0)
    kind, weight = measurement_loss(Measurement(("a",), [1.0, 2.0], Gaussian(3.0)), "auto")
    assert kind == "l2" and weight == pytest.approx(1.0 / 9.0)
    kind, weight = measurement_loss(Measurement(("a",), [1.0, 2.0], Gaussian(3.0)), "l1")
    assert kind == "l1" and weight == pytest.approx(1.0 / 3.0)
    kind, weight = measurement_loss(Measurement(("a",), [1.0, 2.0], DiscreteLaplace(2.0)))
    assert kind == "l1" and weight == pytest.approx(0.5)


def test_explicit_l2_on_laplace_measurements_matches_the_certified_qp():
    rng = np.random.default_rng(5)
    net = CHAIN
    theta = rng.normal(size=net.num_params)
    total = 60.0
    ms = table_measurements(net, theta, total, Laplace(2.0), rng)
    fit = prox_pgm(ms, net, total_count=total, max_iters=ITERS, loss="l2")
    assert fit.extras["loss_kinds"] == ("l2", "l2")
    reference = certified_l2(net.domain, [dataclasses.replace(m, noise=Gaussian(math.sqrt(8.0)))
                                      for m in ms], total)
    assert float(fit.loss_trace[-1]) == pytest.approx(reference, rel=1e-6, abs=1e-8)


# ------------------------------------------------------------------------------------------------
# (d) the L1 loss against linear programming
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [6, 7])
def test_l1_loss_matches_linear_programming(seed):
    rng = np.random.default_rng(seed)
    net = CHAIN
    theta = rng.normal(size=net.num_params)
    total = 100.0
    ms = table_measurements(net, theta, total, Laplace(2.0), rng)
    ms += table_measurements(net, theta, total, Laplace(4.0), rng, cliques=[("c",)])
    fit = prox_pgm(ms, net, total_count=total, max_iters=ITERS, loss="auto")
    assert fit.extras["loss_kinds"] == ("l1", "l1", "l1")
    assert fit.converged
    reference = lp_l1(net.domain, ms, total)
    ours = exact_loss(net.domain, ms, total, joint_of(net, np.asarray(fit.theta)))
    assert ours == pytest.approx(float(fit.loss_trace[-1]), rel=1e-9)
    # first-order method on a non-smooth problem whose optimum has a zero cell: ~1e-7 of the
    # linear programme's optimum (never below it)
    assert reference - 1e-9 <= ours <= reference * (1 + 1e-6)
    # the exact L1 loss may rise only by the Huber smoothing gap of the stage it is in
    assert np.all(np.diff(np.asarray(fit.loss_trace)) <= 0.5 * 15 * 1.0 + 1e-9)
    assert np.all(np.diff(np.asarray(fit.extras["objective_trace"])) <= 0.5 * 15 * 1.0 + 1e-9)


def test_explicit_l1_on_gaussian_measurements_matches_linear_programming():
    rng = np.random.default_rng(8)
    net = CHAIN
    theta = rng.normal(size=net.num_params)
    total = 50.0
    ms = table_measurements(net, theta, total, Gaussian(1.5), rng)
    ms += table_measurements(net, theta, total, Gaussian(0.5), rng, cliques=[("c",)])
    fit = prox_pgm(ms, net, total_count=total, loss="l1", max_iters=ITERS)
    assert fit.extras["loss_kinds"] == ("l1", "l1", "l1")
    assert fit.converged
    as_laplace = [dataclasses.replace(m, noise=Laplace(m.noise.sigma)) for m in ms]
    assert float(fit.loss_trace[-1]) == pytest.approx(
        lp_l1(net.domain, as_laplace, total), rel=1e-6)


# ------------------------------------------------------------------------------------------------
# (e) total estimation
# ------------------------------------------------------------------------------------------------
def test_total_is_the_inverse_variance_estimate():
    rng = np.random.default_rng(9)
    net = CHAIN
    theta = rng.normal(size=net.num_params)
    n_true = 400.0
    m1 = table_measurements(net, theta, n_true, Gaussian(4.0), rng, cliques=[("a", "b")])[0]
    m2 = table_measurements(net, theta, n_true, Laplace(2.0), rng, cliques=[("b", "c")])[0]
    # a (b, c) query whose rows can express the total: the b marginal (sums of c)
    q = np.kron(np.eye(3), np.ones((1, 2)))
    table = n_true * marginal_of(joint_of(net, theta), net.domain, ("b", "c")).ravel()
    m3 = Measurement(("b", "c"), q @ table + rng.normal(size=3), Gaussian(1.0), q)
    # random queries cannot express the total: ignored by the estimator
    q4 = rng.normal(size=(2, 6))
    m4 = Measurement(("b", "c"), q4 @ table, Gaussian(1.0), q4)
    ests = np.array([m1.values.sum(), m2.values.sum(), m3.values.sum()])
    variances = np.array([16.0 * 6, 8.0 * 6, 1.0 * 3])
    want = np.sum(ests / variances) / np.sum(1.0 / variances)
    assert estimate_total([m1, m2, m3, m4]) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="determines the number of records"):
        estimate_total([m4])

    fit = prox_pgm([m1, m2, m3, m4], net, max_iters=300, loss="l2")
    assert fit.extras["total_count_estimated"]
    assert fit.extras["total_count"] == pytest.approx(want, rel=1e-12)
    for c in net.cliques:
        assert float(jnp.sum(fit.extras["marginals"][c])) == pytest.approx(want, rel=1e-10)
    fixed = prox_pgm([m1, m2, m3, m4], net, total_count=n_true, max_iters=300, loss="l2")
    assert fixed.extras["total_count"] == n_true and not fixed.extras["total_count_estimated"]


def test_total_estimate_is_clipped_at_one():
    ms = [Measurement(("a",), [-3.0, 0.5], Gaussian(1.0))]
    assert estimate_total(ms) == 1.0
    fit = prox_pgm(ms, {"a": 2}, max_iters=50)
    assert fit.extras["total_count"] == 1.0


def test_total_needed_when_no_query_determines_it():
    q = np.array([[1.0, -1.0]])
    ms = [Measurement(("a",), [3.0], Gaussian(1.0), q)]
    with pytest.raises(ValueError, match="total_count"):
        prox_pgm(ms, {"a": 2})
    fit = prox_pgm(ms, {"a": 2}, total_count=10.0, max_iters=2000)
    np.testing.assert_allclose(np.asarray(fit.extras["marginals"][("a",)]), [6.5, 3.5],
                               atol=1e-6)


# ------------------------------------------------------------------------------------------------
# out-of-model queries (Problem 4), oracles, warm starts, custom losses
# ------------------------------------------------------------------------------------------------
def test_out_of_model_queries_are_exact_marginals_of_the_fit():
    rng = np.random.default_rng(10)
    theta = rng.normal(size=CYCLE.num_params)
    total = 250.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(3.0), rng)
    fit = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS)
    joint = joint_of(CYCLE, np.asarray(fit.theta))
    queries = [("a", "c"), ("b", "d"), ("c", "a", "d"), ("a",), ("d", "a")]
    answers = answer_queries(fit, queries)
    assert list(answers) == queries
    for q in queries:
        np.testing.assert_allclose(np.asarray(answers[q]), total * marginal_of(joint, CYCLE.domain,
                                                                               q), atol=1e-9)
    probs = answer_queries(fit.model, [("b", "d")])
    np.testing.assert_allclose(np.asarray(probs[("b", "d")]),
                               marginal_of(joint, CYCLE.domain, ("b", "d")), atol=1e-12)
    with pytest.raises(KeyError, match="unknown attribute"):
        answer_queries(fit, [("a", "nope")])
    with pytest.raises(ValueError, match="total"):
        answer_queries(fit, [("a",)], total=-1.0)


@dataclasses.dataclass(frozen=True)
class CountingOracle:
    """An exact oracle with a state (a call counter) to check that state is threaded."""

    network: MarkovNetwork

    def init_state(self):
        return jnp.zeros((), dtype=jnp.int32)

    def __call__(self, theta, state):
        mu, log_z, _ = ExactOracle(self.network)(theta, ())
        return mu, log_z, state + 1


def test_pluggable_oracle_state_is_threaded_and_reverted_on_rejection():
    rng = np.random.default_rng(11)
    theta = rng.normal(size=CYCLE.num_params)
    total = 100.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(2.0), rng)
    exact = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, step_size=0.5, method="md")
    counted = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, step_size=0.5,
                       oracle=CountingOracle)
    assert counted.extras["method"] == "md"  # the default for an oracle other than the exact
    # the exact oracle's fit starts from the calibrated tree's program (ExactOracle.host_start),
    # equal to the oracle's own output to rounding: the paths agree to rounding, and the
    # tolerance rule (once the loss changes by less than the rounding of the Armijo tests) may
    # end them some iterations apart, at the same loss to that tolerance (near the optimum an
    # Armijo test decided by rounding can take a step one path rejects: 1e-9 apart at 6.36)
    a, b = np.asarray(counted.loss_trace), np.asarray(exact.loss_trace)
    np.testing.assert_allclose(a[:100], b[:100], rtol=1e-8)
    assert a[-1] == pytest.approx(b[-1], rel=1e-6)
    rejected = counted.extras["rejected_steps"]
    assert rejected > 0
    # one call at the start, one per accepted step (rejected trials restore the old state)
    assert int(counted.extras["oracle_state"]) == 1 + counted.iterations - rejected
    by_object = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, step_size=0.5,
                         oracle=ExactOracle(CYCLE), method="md")
    assert by_object.extras["oracle"] == exact.extras["oracle"] == ExactOracle(CYCLE)
    np.testing.assert_array_equal(np.asarray(by_object.theta), np.asarray(exact.theta))
    with pytest.raises(ValueError, match="triangulation"):
        ExactOracle(CYCLE, "min_degree")
    with pytest.raises(ValueError, match="network"):
        prox_pgm(ms, CYCLE, total_count=total, oracle=ExactOracle(MarkovNetwork(
            CYCLE.domain, [("a", "b")])))


def test_callable_loss_and_warm_start_and_callback():
    rng = np.random.default_rng(12)
    theta = rng.normal(size=CYCLE.num_params)
    total = 100.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(2.0), rng)

    def l2(marginals):
        out = 0.0
        for m in ms:
            r = jnp.ravel(marginals.project(m.clique)) - m.values
            out = out + 0.5 * jnp.vdot(r, r) / m.noise.variance
        return out

    seen = []
    builtin = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS)
    custom = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, loss=l2,
                      callback=lambda t, loss: seen.append((t, loss)), callback_every=50)
    assert custom.extras["loss_kinds"] == ("custom",)
    assert float(custom.loss_trace[-1]) == pytest.approx(float(builtin.loss_trace[-1]),
                                                         rel=1e-8)
    assert seen[0][0] == 0 and seen[1][0] == 50 and seen[-1][0] == custom.iterations
    assert all(b[1] <= a[1] for a, b in zip(seen, seen[1:], strict=False))
    warm = prox_pgm(ms, CYCLE, total_count=total, max_iters=ITERS, init=builtin.model)
    assert float(warm.loss_trace[0]) == pytest.approx(float(builtin.loss_trace[-1]), rel=1e-12)
    assert warm.iterations < builtin.iterations


# ------------------------------------------------------------------------------------------------
# (f) bad input
# ------------------------------------------------------------------------------------------------
def test_errors_on_bad_input():
    dom = {"a": 2, "b": 3}
    good = [Measurement(("a", "b"), np.ones(6), Gaussian(1.0))]
    with pytest.raises(KeyError, match="unknown attribute"):
        prox_pgm([Measurement(("a", "x"), np.ones(6), Gaussian(1.0))], dom)
    with pytest.raises(ValueError, match="has 5 values"):
        prox_pgm([Measurement(("a", "b"), np.ones(5), Gaussian(1.0))], dom)
    with pytest.raises(ValueError, match="columns"):
        prox_pgm([Measurement(("a", "b"), np.ones(2), Gaussian(1.0), np.ones((2, 5)))], dom)
    with pytest.raises(ValueError, match="repeats"):
        prox_pgm([Measurement(("a", "a"), np.ones(4), Gaussian(1.0))], dom)
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="total_count"):
            prox_pgm(good, dom, total_count=bad)
    with pytest.raises(TypeError, match="total_count"):
        prox_pgm(good, dom, total_count="many")
    with pytest.raises(ValueError, match="unknown loss"):
        prox_pgm(good, dom, loss="huber")
    with pytest.raises(ValueError, match="unknown oracle"):
        prox_pgm(good, dom, oracle="bethe-ish")
    with pytest.raises(ValueError, match="not contained"):
        prox_pgm(good, MarkovNetwork(dom, [("a",), ("b",)]))
    with pytest.raises(ValueError, match="iters"):
        prox_pgm(good, dom, max_iters=0)
    with pytest.raises(ValueError, match="step_size"):
        prox_pgm(good, dom, step_size=-1.0)
    with pytest.raises(ValueError, match="no measurements"):
        prox_pgm([], dom)
    with pytest.raises(TypeError, match="Measurement"):
        prox_pgm([("a", "b")], dom)
    with pytest.raises(TypeError, match="network_or_domain"):
        prox_pgm(good, [("a", "b")])
    with pytest.raises(ValueError, match="init"):
        prox_pgm(good, dom, init=np.zeros(3))


# ------------------------------------------------------------------------------------------------
# compile modes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stop", ["optimum", "risk"])
def test_quick_compile_mode_fits_as_the_optimized_one(stop):
    """``compile_mode="quick"`` changes how XLA compiles the loop, not what it computes: the
    fits agree to 1e-9 (the optimum reaches the certified minimum of the L2 loss), and each
    mode compiles its own program."""
    from numpyro_dpgm.estimation import mirror_descent, risk_stop

    rng = np.random.default_rng(3)
    theta = rng.normal(size=CYCLE.num_params)
    ms = table_measurements(CYCLE, theta, 500.0, Gaussian(5.0), rng)
    block = mirror_descent._block if stop == "optimum" else risk_stop._risk_block
    before = block._cache_size()
    fits = {mode: prox_pgm_any_stop(ms, CYCLE, total_count=500.0, max_iters=ITERS, stop=stop,
                                    compile_mode=mode)
            for mode in ("optimized", "quick")}
    assert block._cache_size() - before <= 2
    a, b = (np.asarray(f.model.theta) for f in fits.values())
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)
    assert fits["quick"].iterations == fits["optimized"].iterations
    if stop == "optimum":
        p = joint_of(CYCLE, b)
        assert exact_loss(CYCLE.domain, ms, 500.0, p) == pytest.approx(
            certified_l2(CYCLE.domain, ms, 500.0), rel=1e-8, abs=1e-8)
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        prox_pgm_any_stop(ms, CYCLE, total_count=500.0, compile_mode="fast")
