"""AIM: per-round σ and ε from the paper's formulas, annealing, the ledger, workloads, exact
answers at a huge budget, the Bayesian path on its measurements, refusals."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from mechanism_data import (
    CHAIN,
    chain_records_fixture,  # noqa: F401 (the fixture chain_records)
    refuses,
)

from numpyro_dpgm import MarkovNetwork, count, rubin, synthesize
from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_svi
from numpyro_dpgm.mechanisms import aim, workload_error
from numpyro_dpgm.privacy import ZCDP, ApproxDP, PrivacyLedger, PureDP

ALPHA = 0.9  # the paper's share of a round for measurement


def test_hand_computed_budget_with_one_round_that_uses_the_remainder(chain_records):
    # ρ = 0.5, T = 4: ρ_m = 0.9·0.5/4 = 0.1125 (σ₀ = √(1/0.225)), ρ_s = 0.0125 (ε₀ = √0.1).
    # The 4 one-way marginals cost 0.45; the remaining 0.05 < 2·(0.1125 + 0.0125), so the one
    # round spends it all: ρ_s = 0.005 (ε = 0.2), ρ_m = 0.045 (σ = √(1/0.09)).
    fit = aim(chain_records, CHAIN, budget=ZCDP(0.5), rounds=4, workload=2, rng_key=0,
              sampler="jax", iters=100)
    assert fit.extras["sigma0"] == pytest.approx(math.sqrt(1 / 0.225), rel=1e-12)
    assert fit.extras["epsilon0"] == pytest.approx(math.sqrt(0.1), rel=1e-12)
    ledger = fit.extras["ledger"]
    np.testing.assert_allclose([e.charge for e in ledger.history], [0.45, 0.005, 0.045],
                               rtol=1e-12)
    (only,) = fit.extras["rounds"]
    assert only["epsilon"] == pytest.approx(0.2, rel=1e-12)
    assert only["sigma"] == pytest.approx(math.sqrt(1 / 0.09), rel=1e-12)
    assert ledger.spent == pytest.approx(0.5, rel=1e-12) and fit.extras["unspent"] == 0.0


def test_every_round_follows_the_papers_formulas(chain_records):
    rho, T = 0.5, 20
    fit = aim(chain_records, CHAIN, budget=ZCDP(rho), rounds=T, workload=2, rng_key=1,
              sampler="jax", iters=100)
    ledger, rounds = fit.extras["ledger"], fit.extras["rounds"]
    sigma = math.sqrt(T / (2 * ALPHA * rho))
    eps = math.sqrt(8 * (1 - ALPHA) * rho / T)
    used = 4 * 0.5 / sigma**2
    assert ledger.history[0].charge == pytest.approx(used, rel=1e-12)
    for k, r in enumerate(rounds):
        last = rho - used < 2 * (0.5 / sigma**2 + eps**2 / 8)
        if last:
            sigma = math.sqrt(1 / (2 * ALPHA * (rho - used)))
            eps = math.sqrt(8 * (1 - ALPHA) * (rho - used))
        assert (r["sigma"], r["epsilon"]) == (pytest.approx(sigma, rel=1e-9),
                                              pytest.approx(eps, rel=1e-9))
        assert ledger.history[1 + 2 * k].charge == pytest.approx(eps**2 / 8, rel=1e-9)
        assert ledger.history[2 + 2 * k].charge == pytest.approx(0.5 / sigma**2, rel=1e-9)
        used += eps**2 / 8 + 0.5 / sigma**2
        assert r["rho_used"] == pytest.approx(used, rel=1e-9)
        assert last == (k == len(rounds) - 1)
        if r["annealed"]:  # σ halves and ε doubles
            sigma, eps = sigma / 2, 2 * eps
    assert any(r["annealed"] for r in rounds[:-1])
    assert ledger.spent == pytest.approx(rho, rel=1e-12)
    # the size cap grows with the budget used, up to MAX-SIZE in the last round
    assert rounds[-1]["size_limit"] == pytest.approx(80.0, rel=1e-12)


def test_workloads_weights_and_target(chain_records):
    fit = aim(chain_records, CHAIN, budget=ApproxDP(1.0, 1e-6), rng_key=2, sampler="jax",
              target="d", workload=2, iters=50, rounds=4)
    assert [c for c, _ in fit.extras["workload"]] == [("a", "d"), ("b", "d"), ("c", "d")]
    assert fit.extras["candidates"][("d",)] == 3.0  # d overlaps each workload marginal once
    assert fit.extras["ledger"].spent == pytest.approx(fit.extras["rho"], rel=1e-12)
    fit = aim(chain_records, CHAIN, budget=ZCDP(0.1), rng_key=2, sampler="jax", iters=50,
              rounds=4, workload=[(("a", "b"), 2.0), ("c", "d")])
    assert fit.extras["candidates"][("a", "b")] == 4.0


@pytest.mark.usefixtures("keep_programs")
def test_huge_budget_reproduces_the_workload_exactly(chain_records):
    from numpyro_dpgm.estimation import mirror_descent

    workload = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]
    programs = mirror_descent._block._cache_size()
    fit = aim(chain_records, CHAIN, budget=ZCDP(1e6), rng_key=3, sampler="jax",
              workload=workload)
    tables = count(chain_records, workload, CHAIN)
    assert workload_error(fit.model, tables) < 1e-4
    assert fit.extras["sampling"] == "round"  # synthesize's default for this Result
    # a fit per round; only those that add a clique have a new structure, and only those can
    # compile a new Prox-PGM loop (none where an earlier test in this process compiled it)
    costs = fit.extras["costs"]
    assert len(costs) == len(fit.extras["rounds"]) + 2
    new = [c for c in costs if c["new_structure"]]
    assert len(new) == len(fit.extras["cliques"]) - 3  # the 4 one-way cliques come in one fit
    assert any(not c["new_structure"] for c in costs)
    assert mirror_descent._block._cache_size() - programs <= len(new)


@pytest.mark.parametrize("stop", ["auto", "optimum"])
def test_final_fit_is_prox_pgms_fit_of_the_measurements(chain_records, stop):
    """GENERATE is Prox-PGM's fit of every measurement over the rounds' network: the default
    (``stop="auto"``) is the fit ``prox_pgm`` makes of them from scratch; ``"optimum"``
    continues the rounds' warm-started fit to the same optimum (to the stopping tolerance)."""
    from numpyro_dpgm import prox_pgm
    from numpyro_dpgm.mechanisms.refit import merge_measurements

    fit = aim(chain_records, CHAIN, budget=ZCDP(0.002), rng_key=5, sampler="jax", workload=2,
              iters=400, rounds=8, stop=stop)
    net = MarkovNetwork(CHAIN, list(fit.extras["cliques"]))
    merged = merge_measurements(fit.extras["measurements"])
    options = {"max_iters": 20_000, "tol": 1e-12} if stop == "optimum" else {"max_iters": 400}
    again = prox_pgm(merged, net, stop=stop, compile_mode="quick", **options)
    assert fit.extras["fit"].extras["stop"] == again.extras["stop"]
    if stop == "auto":
        assert again.extras["stop"] == "risk"  # the noise is high: the least-risk iterate
        np.testing.assert_array_equal(np.asarray(fit.model.theta), np.asarray(again.model.theta))
    else:
        ms = list(fit.extras["measurements"])
        assert float(fit.extras["fit"].loss_trace[-1]) == pytest.approx(
            float(again.loss_trace[-1]), rel=1e-6)
        assert len(ms) > len(merge_measurements(ms))  # a clique was measured twice


def test_measurements_feed_the_noise_aware_posterior_and_rubin(chain_records):
    fit = aim(chain_records, CHAIN, budget=ZCDP(0.5), rng_key=4, sampler="jax", workload=2,
              iters=200, rounds=8)
    net = MarkovNetwork(CHAIN, list(fit.extras["cliques"]))
    n = len(chain_records)
    model = noisy_marginals_model(net, fit.extras["measurements"], n, triangulate=True)
    post = run_svi(model, jax.random.key(0), num_steps=150, num_samples=20)
    sets = synthesize(post, None, num_datasets=5, rng_key=1)
    assert len(sets) == 5 and all(s.shape == (n, 4) for s in sets)
    means = np.array([s["a"].mean() for s in sets])
    combined = rubin(means, means * (1 - means) / n)
    assert abs(float(combined.estimate) - chain_records["a"].mean()) < 0.1


def test_bad_input_spends_nothing(chain_records):
    assert "rho" in refuses(aim, chain_records, budget=0.0)
    assert "not ε-DP" in refuses(aim, chain_records, budget=PureDP(1.0))
    assert "exceeded" in refuses(aim, chain_records, budget=ZCDP(1.5))
    assert "unknown target column 'zz'" in refuses(aim, chain_records, target="zz")
    assert "zz" in refuses(aim, chain_records, workload=[("a", "zz")])
    assert "twice" in refuses(aim, chain_records, workload=[("a", "b"), ("b", "a")])
    assert "degree" in refuses(aim, chain_records, target="a", workload=[("a", "b")])
    assert "max_model_size" in refuses(aim, chain_records, max_model_size=0.0)
    assert "max_model_size" in refuses(aim, chain_records, max_model_size=1e-9)
    assert "rounds" in refuses(aim, chain_records, rounds=0)
    assert "unknown stop 'best'" in refuses(aim, chain_records, stop="best")
    assert "compile_mode" in refuses(aim, chain_records, compile_mode="fast")
    assert "rng_key" in refuses(aim, chain_records, rng_key=None)
    assert "cannot be seeded" in refuses(aim, chain_records, sampler="opendp")
    with pytest.raises(ValueError, match="currency"):  # an (ε, δ) ledger cannot pay in ρ
        aim(chain_records, CHAIN, budget=ZCDP(0.1), rng_key=0, sampler="jax",
            ledger=PrivacyLedger(ApproxDP(1.0, 1e-6)))
