"""Prox-PGM converges by default, says so when it does not, and compiles once per structure.

The optima are the certified references of ``test_prox_pgm`` (the full joint's simplex QP,
certified by its duality gap); the near-noiseless regression compares the fit's error on the
released marginals with the error of the noisy tables themselves.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from test_prox_pgm import CYCLE, certified_l2, prox_pgm, table_measurements

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.estimation import mirror_descent as md
from numpyro_dpgm.estimation.prox_pgm import ProxPGMConvergenceWarning
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.tables import project_table


@pytest.mark.parametrize("method", ["accelerated", "md"])
def test_both_schemes_reach_the_certified_optimum(method):
    rng = np.random.default_rng(21)
    theta = rng.normal(size=CYCLE.num_params)
    total = 80.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(3.0), rng)
    fit = prox_pgm(ms, CYCLE, total_count=total, max_iters=20000, method=method)
    assert fit.converged and fit.extras["method"] == method
    reference = certified_l2(CYCLE.domain, ms, total)
    assert float(fit.loss_trace[-1]) == pytest.approx(reference, rel=1e-7)
    assert np.all(np.diff(np.asarray(fit.loss_trace)) <= 1e-9 * reference)


def test_the_optimum_is_reached_accelerated_by_default_in_fewer_oracle_calls():
    rng = np.random.default_rng(22)
    theta = 2.0 * rng.normal(size=CYCLE.num_params)
    total = 1000.0
    ms = table_measurements(CYCLE, theta, total, Gaussian(0.5), rng)
    fast = prox_pgm(ms, CYCLE, total_count=total, max_iters=20000)
    slow = prox_pgm(ms, CYCLE, total_count=total, max_iters=20000, method="md")
    assert fast.extras["method"] == "accelerated" and fast.converged
    assert float(fast.loss_trace[-1]) <= float(slow.loss_trace[-1]) * (1 + 1e-7)
    assert fast.iterations < slow.iterations


@pytest.mark.usefixtures("keep_programs")
def test_refit_of_a_known_structure_does_not_recompile():
    rng = np.random.default_rng(23)
    theta = rng.normal(size=CYCLE.num_params)
    first = table_measurements(CYCLE, theta, 100.0, Gaussian(2.0), rng)
    fit = prox_pgm(first, CYCLE, total_count=100.0, max_iters=300)
    sizes = (md._init_at._cache_size(), md._block._cache_size())
    # new values, total, iteration limit, tolerance and a warm start: same programs
    second = table_measurements(CYCLE, rng.normal(size=CYCLE.num_params), 250.0,
                                Gaussian(5.0), rng)
    prox_pgm(second, CYCLE, total_count=250.0, max_iters=1234, tol=1e-6)
    prox_pgm(second, CYCLE, max_iters=77, tol=0.0, init=fit.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProxPGMConvergenceWarning)
        prox_pgm(second, CYCLE, total_count=250.0, max_iters=5, callback=lambda t, f: None,
                 callback_every=2)
    assert (md._init_at._cache_size(), md._block._cache_size()) == sizes


@pytest.mark.usefixtures("keep_programs")
def test_a_start_without_a_host_start_compiles_no_program_of_its_own():
    """Convex-GBP has no host start: its fit's first oracle call is the loop's first iteration,
    so a new structure compiles the loop's program and no start program."""
    from numpyro_dpgm.oracles.protocol import ConvexGBPOracle

    net = MarkovNetwork({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("b", "c"), ("a", "c")])
    rng = np.random.default_rng(26)
    ms = table_measurements(net, rng.normal(size=net.num_params), 200.0, Gaussian(2.0), rng)
    from numpyro_dpgm._jit import programs_held

    before = (programs_held(), md._block._cache_size())
    zero = np.zeros(net.num_params)
    fit = prox_pgm(ms, net, total_count=200.0, max_iters=30, tol=0.0, init=zero,
                   oracle=ConvexGBPOracle(net), model_fit="oracle")
    # one program in all, the loop's (a start program made it two)
    assert (programs_held(), md._block._cache_size()) == (before[0] + 1, before[1] + 1)
    # the trace starts at the loss of the start, computed by that first call: the uniform
    # distribution's marginals (θ = 0 is exact for any oracle)
    uniform = prox_pgm(ms, net, total_count=200.0, max_iters=1, tol=0.0, init=zero)
    assert fit.iterations == 30
    np.testing.assert_allclose(fit.loss_trace[0], uniform.loss_trace[0], rtol=1e-12)


def test_a_fit_stopped_by_the_iteration_limit_warns_with_the_remedy():
    rng = np.random.default_rng(24)
    ms = table_measurements(CYCLE, rng.normal(size=CYCLE.num_params), 100.0, Gaussian(1.0), rng)
    with pytest.warns(ProxPGMConvergenceWarning, match=r"raise max_iters.*init=fit\.model"):
        fit = prox_pgm(ms, CYCLE, total_count=100.0, max_iters=3)
    assert not fit.converged
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProxPGMConvergenceWarning)
        fixed = prox_pgm(ms, CYCLE, total_count=100.0, max_iters=3, tol=0.0)  # asked for 3
        done = prox_pgm(ms, CYCLE, total_count=100.0, max_iters=20000)
    assert fixed.iterations == 3 and done.converged


FOREST = MarkovNetwork({"a": 4, "b": 6, "c": 3, "d": 5, "e": 2, "f": 7},
                       [("a", "b"), ("b", "c"), ("d", "e"), ("f",)])




@pytest.mark.parametrize("epsilon", [1.0, 1000.0])
def test_error_on_released_marginals_falls_with_the_noise(epsilon):
    """With almost no noise the fit is as good as the noisy tables (the bug: 0.83 mean L1)."""
    rng = np.random.default_rng(25)
    total = 135_727
    theta = 2.5 * rng.normal(size=FOREST.num_params)
    truth = {m.clique: m.values for m in table_measurements(FOREST, theta, float(total),
                                                           Gaussian(1.0))}
    b = len(FOREST.cliques) / epsilon
    ms = [Measurement(c, t + rng.laplace(scale=b, size=t.size), Laplace(b))
          for c, t in truth.items()]

    def error(tables: dict) -> float:
        return float(np.mean([np.abs(tables[c] / tables[c].sum() - t / total).sum()
                              for c, t in truth.items()]))

    noisy = error({m.clique: np.clip(m.values, 0, None) for m in ms})
    fit = prox_pgm(ms, FOREST.domain, max_iters=1000)
    tables = fit.extras["marginals"]
    net = fit.model.network
    ours = error({c: np.ravel(project_table(tables[p], p, c)) for c in truth
                  for p in net.cliques if set(c) <= set(p)})
    # the sampling error of the noisy tables: ~ b·sqrt(cells)/N per table
    slack = 2.0 * b * math.sqrt(max(t.size for t in truth.values())) / total
    assert ours <= noisy + slack
    assert ours <= 1e-3 if epsilon > 100 else ours <= 0.02


@pytest.mark.usefixtures("keep_programs")
def test_an_appgm_refit_with_new_values_does_not_recompile():
    from numpyro_dpgm.oracles import gbp
    from numpyro_dpgm.oracles.protocol import ConvexGBPOracle

    rng = np.random.default_rng(25)
    oracle = ConvexGBPOracle(CYCLE)
    first = table_measurements(CYCLE, rng.normal(size=CYCLE.num_params), 100.0, Gaussian(2.0),
                               rng)
    fit = prox_pgm(first, CYCLE, total_count=100.0, max_iters=20, tol=0.0, oracle=oracle)
    sizes = (md._init_at._cache_size(), md._block._cache_size(), gbp._solve._cache_size())
    second = table_measurements(CYCLE, rng.normal(size=CYCLE.num_params), 300.0,
                                Gaussian(0.5), rng)
    again = prox_pgm(second, CYCLE, total_count=300.0, max_iters=7, tol=0.0,
                     oracle=ConvexGBPOracle(CYCLE), init=fit.model.theta)
    assert (md._init_at._cache_size(), md._block._cache_size(),
            gbp._solve._cache_size()) == sizes
    assert again.iterations == 7


def test_the_region_graph_and_the_measurements_are_data_of_the_loop_not_constants():
    import jax
    import jax.numpy as jnp

    from numpyro_dpgm.estimation.losses import build_terms, group_terms, terms_loss
    from numpyro_dpgm.oracles.protocol import (
        ConvexGBPOracle,
        ExactOracle,
        apply_oracle,
        oracle_operands,
    )

    net = MarkovNetwork({f"x{i}": 3 for i in range(6)},
                        [("x0", "x1", "x2"), ("x1", "x2", "x3"), ("x2", "x4"), ("x4", "x5")])
    oracle = ConvexGBPOracle(net)
    ops = oracle_operands(oracle)
    theta = jnp.asarray(np.random.default_rng(26).normal(size=net.num_params))
    traced = jax.make_jaxpr(lambda o, th, st: apply_oracle(oracle, o, th, st))(
        ops, theta, oracle.init_state())
    assert sum(np.size(c) for c in traced.consts) <= 1
    # the same values as the oracle with its cached tables
    direct, with_ops = oracle(theta, None), apply_oracle(oracle, ops, theta, None)
    np.testing.assert_array_equal(np.asarray(direct[0]), np.asarray(with_ops[0]))
    # measurements of the cliques, of a sub-clique (attributes reordered), through a query,
    # and through diagonal queries (Gaussian and Laplace noise)
    ms = table_measurements(net, np.asarray(theta), 50.0, Gaussian(1.0))
    diag = np.linspace(0.5, 2.0, 9)
    ms += [Measurement(("x2", "x0"), np.arange(9.0), Laplace(2.0)),
           Measurement(("x5", "x4"), np.ones(2), Gaussian(3.0), np.eye(2, 9)),
           Measurement(("x2", "x4"), np.arange(9.0) - 3.0, Gaussian(2.0), np.diag(diag)),
           Measurement(("x4", "x5"), np.arange(9.0) + 1.0, Laplace(1.5), np.diag(-diag))]
    terms, data = build_terms(net, ms, "auto")
    kinds, groups = group_terms(net, terms, data)
    # one row of every table read cell by cell (27- and 9-cell tables and the Gaussian
    # diagonal query together), the L1 sub-clique, the query, the L1 diagonal query
    assert kinds == ("l2", "l1", "l2", "l1")
    assert groups[0].values.shape == (1, 2 * 27 + 2 * 9 + 9)
    loss, mu = md.MarginalLoss(kinds), 50.0 * direct[0]
    for smooth in (0.0, 0.3):
        want = terms_loss(net, terms, mu, data, jnp.asarray(smooth))
        assert float(loss(mu, groups, jnp.asarray(smooth))) == pytest.approx(float(want),
                                                                             rel=1e-13)
    traced = jax.make_jaxpr(lambda m, g: loss(m, g, jnp.zeros(())))(mu, groups)
    assert sum(np.size(c) for c in traced.consts) <= 1
    assert oracle_operands(ExactOracle(net)) == ()
