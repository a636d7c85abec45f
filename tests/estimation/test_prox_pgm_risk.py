"""``prox_pgm(stop="risk")``: the mirror-descent path from the maximum-entropy point, stopped at
its iterate of least estimated risk (SURE, with a divergence by forward-mode differentiation)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_prox_pgm import table_measurements

from numpyro_dpgm import MarkovNetwork, MarkovRandomField
from numpyro_dpgm.estimation import risk_stop
from numpyro_dpgm.estimation.losses import build_terms, group_answers, group_terms
from numpyro_dpgm.estimation.mirror_descent import MarginalLoss
from numpyro_dpgm.estimation.prox_pgm import ProxPGMConvergenceWarning, prox_pgm
from numpyro_dpgm.estimation.risk_stop import risk_path
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.oracles.protocol import ExactOracle

TREE = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])


def _setup(net, ms):
    terms, data = build_terms(net, ms, "l2")
    kinds, groups = group_terms(net, terms, data)
    return MarginalLoss(kinds), groups


def _path(net, ms, total, *, level, iters, tol=0.0, **options):
    loss_fn, groups = _setup(net, ms)
    alpha = 1.0 / (total * max(1.0 / m.noise.variance for m in ms) * 6)
    return risk_path(ExactOracle(net), loss_fn, jnp.zeros(net.num_params), groups, total,
                     iters=iters, alpha=alpha, tol=tol, window=10, level=level, **options)


def _unit_probes(groups):
    """``√m`` times the ``m`` unit vectors of the answers: the probe estimate is then exactly
    ``Σ_i ∂ŷ_i/∂y_i``."""
    sizes = [int(g.values.size) for g in groups]
    m = sum(sizes)
    flat = math.sqrt(m) * np.eye(m)
    parts = np.split(flat, np.cumsum(sizes)[:-1], axis=1)
    return tuple(jnp.asarray(p.reshape(m, *g.values.shape))
                 for p, g in zip(parts, groups, strict=True))


def test_divergence_of_the_saturated_optimum_is_its_trace():
    """One 2×2 table, the model saturated: the optimum is ``y + (N − Σy)/4`` (interior), whose
    Jacobian ``I − 11ᵀ/4`` has trace 3; the tangents of the converged path give it."""
    net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    ms = [Measurement(("a", "b"), np.array([30.0, 10.0, 20.0, 45.0]), Gaussian(1.0))]
    state, _, _ = _path(net, ms, 100.0, level=-math.inf, iters=5000, tol=-1.0,
                        probes=_unit_probes(_setup(net, ms)[1]))
    answers = np.concatenate([np.ravel(a) for a in group_answers(state.md.mu,
                                                                  _setup(net, ms)[1])])
    np.testing.assert_allclose(answers, [28.75, 8.75, 18.75, 43.75], atol=1e-8)
    # the path stops moving once no step decreases the loss in floating point, and with it
    # the tangents (updated by accepted steps only): to 2e-6 here (1.2e-6 measured)
    assert float(state.df) == pytest.approx(3.0, abs=2e-6)


def test_divergence_matches_finite_differences_of_the_optimum():
    """A tree of two tables and a one-way table: the path's divergence at its end equals the
    trace of the optimum's Jacobian by central differences of fits to perturbed measurements,
    and both equal 8, the dimension of the tree's consistent marginals (2·3 + 3·2 − 3 − 1; an
    interior least-squares optimum with equal variances is the projection onto them)."""
    rng = np.random.default_rng(5)
    theta = rng.normal(size=TREE.num_params)
    noise = Gaussian(2.0)
    ms = table_measurements(TREE, theta, 200.0, noise, rng, [("a", "b"), ("b", "c"), ("b",)])

    def answer(measurements, k, i):
        fit = prox_pgm(measurements, TREE, total_count=200.0, tol=0.0, max_iters=20000,
                       stop="optimum")
        return 200.0 * float(np.ravel(fit.model.marginal(measurements[k].clique))[i])

    h, trace = 0.5, 0.0  # the interior optimum is affine in y: central differences are exact
    for k, m in enumerate(ms):
        for i in range(m.values.size):
            sides = []
            for sign in (1.0, -1.0):
                y = np.array(m.values, dtype=float)
                y[i] += sign * h
                sides.append(answer([*ms[:k], Measurement(m.clique, y, m.noise), *ms[k + 1:]],
                                    k, i))
            trace += (sides[0] - sides[1]) / (2 * h)
    state, _, _ = _path(TREE, ms, 200.0, level=-math.inf, iters=20000, tol=-1.0,
                        probes=_unit_probes(_setup(TREE, ms)[1]))
    df = float(state.df)
    assert df == pytest.approx(trace, abs=1e-5)
    assert df == pytest.approx(8.0, abs=1e-5)  # the dimension of the tree's marginals


def test_risk_estimate_is_unbiased_under_gaussian_noise():
    """Stein: over 400 releases (new probes each), the mean of ``R̂_t`` at a fixed iteration
    equals the mean whitened squared error of that iterate within 4 standard errors."""
    rng = np.random.default_rng(11)
    theta = 0.8 * rng.normal(size=TREE.num_params)
    noise, total = Gaussian(5.0), 300.0
    clean = table_measurements(TREE, theta, total, noise)
    _, clean_groups = _setup(TREE, clean)
    truth = np.concatenate([np.ravel(g.values) for g in clean_groups])
    gaps = []
    for r in range(400):
        ms = table_measurements(TREE, theta, total, noise, rng)
        state, _, _ = _path(TREE, ms, total, level=math.inf, iters=20,
                            rng_key=jax.random.key(r))
        assert int(state.md.t) == 20 and int(state.pilot) == 1
        _, groups = _setup(TREE, ms)
        fit = np.concatenate([np.ravel(a) for a in group_answers(state.md.mu, groups)])
        gaps.append(float(state.risk) - float(np.sum((fit - truth) ** 2)) / noise.variance)
    assert abs(np.mean(gaps)) <= 4 * np.std(gaps) / math.sqrt(len(gaps))


@pytest.mark.parametrize(("total", "share_binds"), [(500.0, False), (1e5, True)])
def test_path_waits_a_share_of_the_way_from_the_noise_level_to_the_best_iterate(total,
                                                                                  share_binds):
    rng = np.random.default_rng(12)
    theta = 2.0 * rng.normal(size=TREE.num_params)
    ms = table_measurements(TREE, theta, total, Laplace(20.0), rng)
    fit = prox_pgm(ms, TREE, total_count=total, stop="risk", max_iters=5000)
    x = fit.extras
    assert x["stopped_by"] == "risk"
    best, pilot = x["selected_iteration"], x["pilot_iteration"]
    share = risk_stop.PATIENCE_SHARE * (best - pilot)
    assert (share > risk_stop.PATIENCE) == share_binds
    assert fit.iterations - best == math.ceil(max(risk_stop.PATIENCE, share))


def test_fit_is_the_selected_iterate_of_least_estimated_risk():
    rng = np.random.default_rng(12)
    theta = rng.normal(size=TREE.num_params)
    ms = table_measurements(TREE, theta, 500.0, Laplace(20.0), rng)
    fit = prox_pgm(ms, TREE, total_count=500.0, stop="risk", max_iters=5000)
    x = fit.extras
    assert fit.converged and x["stopped_by"] in ("risk", "tolerance")
    assert x["pilot_iteration"] is not None
    assert x["pilot_iteration"] <= x["selected_iteration"] <= fit.iterations
    risk = np.asarray(x["risk_trace"])
    assert np.isnan(risk[: x["pilot_iteration"]]).all()
    assert np.nanmin(risk) == pytest.approx(x["risk"], rel=1e-12)
    assert int(np.nanargmin(risk)) == x["selected_iteration"]
    # the fit is the model at the selected iterate: its own marginals are the reported ones
    model = MarkovRandomField(TREE, fit.model.theta)
    for c in TREE.cliques:
        np.testing.assert_allclose(500.0 * np.asarray(model.marginal(c)),
                                   np.asarray(x["marginals"][c]), rtol=1e-9, atol=1e-9)
    # the loss at the selected iterate is on the trace
    assert float(fit.loss_trace[x["selected_iteration"]]) == pytest.approx(
        float(np.nanmin(np.where(np.isnan(risk), np.inf, risk)) - 2 * x["degrees_of_freedom"]
              + sum(np.size(m.values) for m in ms)) / 2, rel=1e-9)


def test_probes_follow_rng_key_an_int_being_a_seed():
    rng = np.random.default_rng(14)
    ms = table_measurements(TREE, rng.normal(size=TREE.num_params), 500.0, Laplace(20.0), rng)
    fits = [prox_pgm(ms, TREE, total_count=500.0, stop="risk", max_iters=5000, rng_key=k)
            for k in (3, jax.random.key(3), None, jax.random.key(0))]
    assert fits[0].extras["risk"] == fits[1].extras["risk"]
    assert fits[2].extras["risk"] == fits[3].extras["risk"]
    assert fits[0].extras["degrees_of_freedom"] != fits[2].extras["degrees_of_freedom"]


def test_iteration_limit_warns_and_returns_the_best_so_far():
    rng = np.random.default_rng(13)
    ms = table_measurements(TREE, rng.normal(size=TREE.num_params), 500.0, Laplace(5.0), rng)
    with pytest.warns(ProxPGMConvergenceWarning, match="raise max_iters"):
        fit = prox_pgm(ms, TREE, total_count=500.0, stop="risk", max_iters=3)
    assert not fit.converged and fit.extras["stopped_by"] == "iteration limit"
    assert fit.iterations == 3


def test_bad_options():
    ms = [Measurement(("a", "b"), np.ones(6), Gaussian(1.0))]
    with pytest.raises(ValueError, match="use loss='l2'"):
        prox_pgm(ms, TREE, stop="risk", loss="l1")
    with pytest.raises(ValueError, match="mirror-descent path"):
        prox_pgm(ms, TREE, stop="risk", method="accelerated")
    with pytest.raises(ValueError, match="exact oracle"):
        prox_pgm(ms, TREE, stop="risk", oracle="convex_gbp")


def _same_fit(a, b):
    np.testing.assert_array_equal(np.asarray(a.model.theta), np.asarray(b.model.theta))


def test_auto_is_the_risk_fit_where_the_path_reaches_the_noise_level_in_time():
    rng = np.random.default_rng(15)
    ms = table_measurements(TREE, rng.normal(size=TREE.num_params), 500.0, Laplace(20.0), rng)
    risk = prox_pgm(ms, TREE, total_count=500.0, stop="risk", max_iters=5000)
    assert risk.extras["pilot_iteration"] < 5000 // 3
    auto = prox_pgm(ms, TREE, total_count=500.0, max_iters=5000)
    _same_fit(auto, risk)
    assert auto.extras["stop"] == "risk" and auto.extras["risk_path_iterations"] is None
    # deterministic: the default takes the probes of key 0, whatever rng_key says
    _same_fit(prox_pgm(ms, TREE, total_count=500.0, max_iters=5000, rng_key=7), auto)


def test_auto_fits_the_optimum_where_the_path_spends_its_budget():
    rng = np.random.default_rng(16)
    ms = table_measurements(TREE, 2.0 * rng.normal(size=TREE.num_params), 1e5, Gaussian(0.1),
                            rng)
    risk = prox_pgm(ms, TREE, total_count=1e5, stop="risk", max_iters=3000)
    assert risk.extras["pilot_iteration"] is None or risk.extras["pilot_iteration"] > 100
    auto = prox_pgm(ms, TREE, total_count=1e5, max_iters=300)
    optimum = prox_pgm(ms, TREE, total_count=1e5, max_iters=300, stop="optimum")
    _same_fit(auto, optimum)
    # given up before its budget of 100 iterations: the loss falls too slowly to get there
    assert auto.extras["stop"] == "optimum" and 0 < auto.extras["risk_path_iterations"] < 100
    assert auto.iterations == optimum.iterations
    # a budget shorter than the rule's look-back is spent to its end
    short = prox_pgm(ms, TREE, total_count=1e5, max_iters=60)
    assert short.extras["stop"] == "optimum" and short.extras["risk_path_iterations"] == 20


def test_out_of_reach_extrapolates_a_geometric_decrease_speedup_times_as_fast():
    from numpyro_dpgm.estimation.risk_stop import LOOKBACK, NEAR, SPEEDUP, _out_of_reach

    level = 1000.0
    # the excess fell from 99 to 9 over LOOKBACK iterations; at that rate it reaches NEAR after
    # LOOKBACK·log(NEAR/9)/log(9/99) iterations, SPEEDUP times fewer with the speed-up
    need = LOOKBACK * math.log(NEAR / 9.0) / math.log(9.0 / 99.0) / SPEEDUP
    loss, then = level * 10.0, level * 100.0
    assert bool(_out_of_reach(loss, then, level, math.floor(need)))
    assert not bool(_out_of_reach(loss, then, level, math.ceil(need)))
    assert bool(_out_of_reach(loss, loss, level, 10**6))  # not falling: never
    assert not bool(_out_of_reach(level * (1 + NEAR / 2), then, level, 0))  # near enough


def test_auto_gives_the_budget_up_early_where_the_level_is_out_of_reach():
    # two measurements of a's table that disagree by 20,000 counts at σ = 1: the least loss is
    # 2·10⁸, far above the noise level m/2 = 2; the path gets there in a few iterations, then
    # its loss stops falling (tol=0: no tolerance ends it), and the budget of 1,000 iterations
    # is given up
    ms = [Measurement(("a",), np.array([8e4, 2e4]), Gaussian(1.0)),
          Measurement(("a",), np.array([6e4, 4e4]), Gaussian(1.0))]
    auto = prox_pgm(ms, TREE, total_count=1e5, max_iters=3000, tol=0.0)
    optimum = prox_pgm(ms, TREE, total_count=1e5, max_iters=3000, stop="optimum", tol=0.0)
    assert auto.extras["stop"] == "optimum" and auto.extras["risk_path_iterations"] < 50
    _same_fit(auto, optimum)
    # with the default tolerance the path reaches that optimum first (its loss stops moving
    # within a few dozen iterations): no iterate at the noise level, no risk compared, and the
    # fit is labelled the optimum it is
    path = prox_pgm(ms, TREE, total_count=1e5, max_iters=3000)
    assert path.extras["stop"] == "optimum" and path.extras["pilot_iteration"] is None
    assert path.iterations < 50 and path.converged
    np.testing.assert_allclose(np.asarray(path.extras["marginals"][("a", "b")]).sum(axis=1),
                               [7e4, 3e4], rtol=1e-6)


@pytest.mark.parametrize("option", [dict(loss="l1"), dict(method="accelerated"),
                                    dict(init="warm"), dict(oracle="convex_gbp")])
def test_auto_fits_the_optimum_where_the_risk_rule_does_not_apply(option):
    rng = np.random.default_rng(17)
    ms = table_measurements(TREE, rng.normal(size=TREE.num_params), 500.0, Laplace(20.0), rng)
    if option.get("init") == "warm":
        option = dict(init=prox_pgm(ms, TREE, total_count=500.0, stop="optimum").model)
    auto = prox_pgm(ms, TREE, total_count=500.0, **option)
    assert auto.extras["stop"] == "optimum"
    _same_fit(auto, prox_pgm(ms, TREE, total_count=500.0, stop="optimum", **option))


@pytest.mark.usefixtures("keep_programs")
def test_the_path_compiles_once_per_structure_whatever_its_blocks():
    from numpyro_dpgm.estimation import risk_stop

    net = MarkovNetwork({"a": 2, "b": 5, "c": 3}, [("a", "b"), ("b", "c")])  # new to the process
    rng = np.random.default_rng(18)
    ms = table_measurements(net, rng.normal(size=net.num_params), 500.0, Laplace(20.0), rng)
    before = risk_stop._risk_block._cache_size()
    with pytest.warns(ProxPGMConvergenceWarning):  # 10 iterations in five blocks of two
        prox_pgm(ms, net, total_count=500.0, stop="risk", max_iters=10, tol=0.0,
                 callback=lambda t, f: None, callback_every=2)
    assert risk_stop._risk_block._cache_size() == before + 1
    again = table_measurements(net, rng.normal(size=net.num_params), 900.0, Gaussian(9.0), rng)
    prox_pgm(again, net, total_count=900.0, stop="risk", max_iters=4000)
    assert risk_stop._risk_block._cache_size() == before + 1


@pytest.mark.parametrize("cliques", [[("a", "b"), ("b", "c")], [("a", "b"), ("c",)], [("b",)]])
def test_the_uniform_start_in_closed_form_is_the_oracle_at_zero(cliques):
    from numpyro_dpgm.estimation.risk_stop import _uniform

    net = MarkovNetwork({"a": 2, "b": 3, "c": 4}, cliques)
    p, log_z, _ = ExactOracle(net)(jnp.zeros(net.num_params), ())
    q, log_q = _uniform(ExactOracle(net), jnp.float64)
    np.testing.assert_allclose(np.asarray(q), np.asarray(p), rtol=1e-12)
    assert float(log_q) == pytest.approx(float(log_z), rel=1e-12)
