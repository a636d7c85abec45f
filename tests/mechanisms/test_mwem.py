"""MWEM + PGM: privacy accounting, accuracy against budget, selection, size guard, bad input."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from numpyro_dpgm.data import count
from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.mechanisms import exponential_mechanism, mwem_pgm, workload_error
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.privacy import ZCDP, ApproxDP, BudgetExceededError, PrivacyLedger, PureDP

DOMAIN = {"a": 3, "b": 3, "c": 3, "d": 3, "e": 2}
WORKLOAD = list(itertools.combinations(DOMAIN, 2))


@pytest.fixture(scope="module")
def records() -> np.ndarray:
    """5,000 records from a chain a–b–c–d–e with strong random potentials (fixed seeds)."""
    net = MarkovNetwork(DOMAIN, [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")])
    theta = 1.5 * jax.random.normal(jax.random.key(0), (net.num_params,))
    return np.asarray(MarkovRandomField(net, theta).sample(jax.random.key(1), (5000,)))


def test_ledger_is_spent_exactly_and_refuses_a_second_run(records):
    ledger = PrivacyLedger(ZCDP(0.5))
    fit = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(0.5), rounds=2, rng_key=3,
                   ledger=ledger, iters=30)
    assert ledger.spent == pytest.approx(0.5, rel=1e-12)
    # one selection and one measurement per round, the selection costs f·ρ/T = 0.1·0.25
    assert len(ledger.history) == 4
    assert ledger.history[0].charge == pytest.approx(0.025, rel=1e-12)
    assert ledger.history[1].charge == pytest.approx(0.225, rel=1e-12)
    assert fit.extras["ledger"] is ledger and len(fit.extras["selected"]) == 2
    before = len(ledger.history)
    with pytest.raises(BudgetExceededError):
        mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(0.5), rounds=2, rng_key=4,
                 ledger=ledger, iters=30)
    assert len(ledger.history) == before
    # an (ε, δ) budget is spent in zCDP: the fresh ledger's ρ is used up
    fit = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ApproxDP(1.0, 1e-6), rounds=1,
                   rng_key=5, iters=10)
    own = fit.extras["ledger"]
    assert own.currency == "zcdp" and own.spent == pytest.approx(own.budget, rel=1e-12)
    # pure ε with Laplace noise: ε's add up
    fit = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=PureDP(2.0), rounds=2, rng_key=6,
                   mechanism="laplace", iters=10)
    assert fit.extras["ledger"].spent == pytest.approx(2.0, rel=1e-12)


def test_error_falls_with_budget_and_beats_uniform(records):
    tables = count(records, WORKLOAD, DOMAIN)
    uniform = workload_error(None, {c: tables[c] for c in WORKLOAD})
    low = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(1e-5), rounds=4, rng_key=11,
                   iters=60)
    high = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(1.0), rounds=4, rng_key=11,
                    iters=60)
    assert low.loss_trace[0] == pytest.approx(uniform, rel=1e-12)
    # with ρ = 1 four rounds recover most of the chain: error below a quarter of uniform's
    assert high.loss_trace[-1] < 0.25 * uniform
    assert high.loss_trace[-1] < low.loss_trace[-1]
    assert np.all(np.diff(high.loss_trace) < 0)  # every round helps at this budget
    # the reported error is that of the returned model
    assert workload_error(high.model, {c: tables[c] for c in WORKLOAD}) == pytest.approx(
        high.loss_trace[-1], rel=1e-9)


def test_exponential_mechanism_probabilities_and_large_epsilon():
    scores = np.array([1.0, 3.0, 2.0])
    i, p = exponential_mechanism(scores, 2.0, 1.0, sampler="jax", rng_key=jax.random.key(0))
    expected = np.exp(scores) / np.exp(scores).sum()  # exp(ε·s/(2Δ)) with ε = 2, Δ = 1
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    picks = [exponential_mechanism(scores, 2.0, 1.0, sampler="jax", rng_key=jax.random.key(k))[0]
             for k in range(2000)]
    freq = np.bincount(picks, minlength=3) / 2000
    np.testing.assert_allclose(freq, expected, atol=0.04)  # > 4 standard errors
    big = [exponential_mechanism(scores, 100.0, 1.0, sampler="jax", rng_key=jax.random.key(k))[0]
           for k in range(50)]
    assert big == [1] * 50


def test_first_round_selects_the_worst_fit_marginal_at_large_budget(records):
    n = len(records)
    tables = count(records, WORKLOAD, DOMAIN)
    errs = {c: np.abs(tables[c] - n / tables[c].size).sum() for c in WORKLOAD}
    worst = max(errs, key=errs.get)
    for seed in range(3):
        fit = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(100.0), rounds=1,
                       rng_key=seed, total_count=n, penalty=False, iters=5)
        assert fit.extras["selected"][0] == worst
        assert fit.extras["selection_probability"][0] > 0.99


def test_size_guard_keeps_the_junction_tree_under_the_cap(records):
    fit = mwem_pgm(records, DOMAIN, workload=WORKLOAD, budget=ZCDP(1.0), rounds=5, rng_key=2,
                   max_cells=20, iters=10)
    net = fit.model.network
    assert jt.build_junction_tree(net).num_cells <= 20
    assert all(k <= len(WORKLOAD) for k in fit.extras["num_candidates"])
    assert min(fit.extras["num_candidates"][1:]) < len(WORKLOAD)  # the guard did exclude some


def test_bad_input(records):
    def call(**kw):
        args = {"data": records, "domain": DOMAIN, "workload": WORKLOAD,
                "budget": ZCDP(1.0), "rounds": 1, "rng_key": 0, "iters": 5}
        args.update(kw)
        return mwem_pgm(**args)

    with pytest.raises(ValueError, match="rounds"):
        call(rounds=0)
    with pytest.raises(ValueError, match="empty"):
        call(workload=[])
    with pytest.raises(ValueError, match="twice"):
        call(workload=[("a", "b"), ("b", "a")])
    with pytest.raises(KeyError):
        call(workload=[("a", "zz")])
    with pytest.raises(ValueError, match="not ε-DP"):
        call(budget=PureDP(1.0))
    with pytest.raises(ValueError, match="selection_fraction"):
        call(selection_fraction=1.0)
    with pytest.raises(ValueError, match="mechanism"):
        call(mechanism="cauchy")
    with pytest.raises(ValueError, match="neighbouring"):
        call(neighbours="swap")
    with pytest.raises(ValueError, match="max_cells"):
        call(max_cells=5)
    with pytest.raises(ValueError, match="domain"):
        call(domain=None)
    with pytest.raises(TypeError):
        call(budget="lots")
    with pytest.raises(ValueError, match="currency"):  # a pure ledger cannot pay zCDP
        call(ledger=PrivacyLedger(PureDP(10.0)))
    with pytest.raises(ValueError, match="epsilon"):
        exponential_mechanism([1.0, 2.0], 0.0, 1.0, sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="scores"):
        exponential_mechanism([], 1.0, 1.0, sampler="jax", rng_key=0)
