"""MST: accounting against hand-computed budgets, the tree, compression, exact answers, errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from mechanism_data import (
    CHAIN,
    chain_records_fixture,  # noqa: F401 (the fixture chain_records)
    refuses,
)

from numpyro_dpgm import Domain, count, synthesize
from numpyro_dpgm.mechanisms import mst
from numpyro_dpgm.oracles.rounding import rounding_order
from numpyro_dpgm.privacy import ZCDP, ApproxDP, PureDP, approx_to_zcdp

FAST = {"sampler": "jax", "iters": 300}


def test_budget_is_split_in_thirds_one_way_then_the_tree(chain_records):
    rho, d = 0.3, 4
    fit = mst(chain_records, CHAIN, budget=ZCDP(rho), rng_key=0, **FAST)
    ledger = fit.extras["ledger"]
    charges = [e.charge for e in ledger.history]
    # one-way tables at ρ/3, d − 1 = 3 edges at ρ/9 each, the tree's pairs at ρ/3
    np.testing.assert_allclose(charges, [0.1, 0.1 / 3, 0.1 / 3, 0.1 / 3, 0.1], rtol=1e-12)
    assert ledger.spent == pytest.approx(rho, rel=1e-12)
    assert fit.extras["sigma"]["one_way"] == pytest.approx(math.sqrt(3 * d / (2 * rho)))
    assert fit.extras["sigma"]["cliques"] == pytest.approx(math.sqrt(3 * (d - 1) / (2 * rho)))
    assert fit.extras["epsilon_selection"] == pytest.approx(math.sqrt(8 * (rho / 3) / (d - 1)))
    assert len(fit.extras["selected"]) == d - 1
    assert [e.details["epsilon"] for e in ledger.history[1:4]] == \
        [pytest.approx(fit.extras["epsilon_selection"])] * 3


def test_initial_cliques_join_components_and_the_split_follows_the_stages(chain_records):
    fit = mst(chain_records, CHAIN, budget=ZCDP(0.3), rng_key=1, initial_cliques=[("a", "b")],
              **FAST)
    charges = [e.charge for e in fit.extras["ledger"].history]
    np.testing.assert_allclose(charges, [0.1, 0.05, 0.05, 0.1], rtol=1e-12)  # r − 1 = 2 edges
    assert ("a", "b") in fit.extras["cliques"]
    # a clique over every attribute leaves nothing to select: halves for the two measurements
    fit = mst(chain_records, CHAIN, budget=ZCDP(0.3), rng_key=1,
              initial_cliques=[("a", "b", "c", "d")], **FAST)
    np.testing.assert_allclose([e.charge for e in fit.extras["ledger"].history], [0.15, 0.15])
    assert fit.extras["selected"] == ()


def test_approx_budget_is_spent_as_its_zcdp_rho(chain_records):
    fit = mst(chain_records, CHAIN, budget=ApproxDP(1.0, 1e-6), rng_key=2, **FAST)
    rho = approx_to_zcdp(1.0, 1e-6, "cks20")
    assert fit.extras["rho"] == rho
    assert fit.extras["ledger"].spent == pytest.approx(rho, rel=1e-12)
    assert fit.extras["ledger"].currency == "zcdp"


def test_huge_budget_finds_the_chain_and_reproduces_its_marginals(chain_records):
    fit = mst(chain_records, CHAIN, budget=ZCDP(1e6), rng_key=3, sampler="jax")
    assert {frozenset(e) for e in fit.extras["selected"]} == \
        {frozenset("ab"), frozenset("bc"), frozenset("cd")}
    assert fit.extras["compression"].compressed == ()
    cliques = [("a",), ("b",), ("c",), ("d",), ("a", "b"), ("b", "c"), ("c", "d")]
    tables = count(chain_records, cliques, CHAIN)
    for c in cliques:
        p = np.asarray(tables[c]) / len(chain_records)
        np.testing.assert_allclose(np.asarray(fit.model.marginal(c)), p, atol=1e-5)
    # its synthetic data are rounded by default: the first attribute's counts within 1 of N·p
    assert fit.extras["sampling"] == "round"
    synth = synthesize(fit, len(chain_records), rng_key=0)
    pd.testing.assert_frame_equal(
        synth, synthesize(fit, len(chain_records), rng_key=0, sampling="round"))
    first = rounding_order(fit.model.network)[0][0]
    expected = len(chain_records) * np.asarray(fit.model.marginal((first,)))
    assert np.all(np.abs(np.bincount(synth[first], minlength=2) - expected) < 1)


def test_final_fit_at_the_least_estimated_risk(chain_records):
    """``stop="risk"``: the final fit is the mirror-descent path's iterate of least estimated
    risk, from the uniform start; the budget is the same as with the default."""
    fit = mst(chain_records, CHAIN, budget=ZCDP(0.3), rng_key=0, stop="risk", sampler="jax",
              iters=5000)
    final = fit.extras["fit"]
    assert final.extras["stopped_by"] in ("risk", "tolerance")
    assert 1 <= final.extras["selected_iteration"] <= final.iterations
    assert fit.extras["ledger"].spent == pytest.approx(0.3, rel=1e-12)


def test_compression_merges_rare_values_and_the_model_covers_the_original_domain():
    rng = np.random.default_rng(3)
    dom = Domain({"x": 6, "y": 2})
    # x takes values 0 and 1 only: values 2..5 have true count zero
    x = rng.integers(0, 2, 2000)
    records = np.stack([x, x ^ (rng.random(2000) < 0.2)], axis=1)
    fit = mst(records, dom, budget=ZCDP(50.0), rng_key=4, sampler="jax", iters=2000)
    comp = fit.extras["compression"]
    assert comp.groups["x"] == ((0,), (1,), (2, 3, 4, 5))
    assert fit.extras["domain"] == Domain({"x": 3, "y": 2})
    assert fit.model.network.domain == dom
    px = np.asarray(fit.model.marginal(("x",)))
    np.testing.assert_allclose(px[2:], px[2], rtol=1e-9)  # merged values share their mass
    np.testing.assert_allclose(px[:2], np.bincount(x, minlength=2) / 2000, atol=0.01)
    m = fit.extras["measurements"][0]
    assert m.clique == ("x",) and m.query is not None  # an ordinary Measurement with a query


def test_bad_input_spends_nothing(chain_records):
    assert "rho" in refuses(mst, chain_records, budget=0.0)
    assert "rho" in refuses(mst, chain_records, budget=-1.0)
    assert "not ε-DP" in refuses(mst, chain_records, budget=PureDP(1.0))
    assert "exceeded" in refuses(mst, chain_records, budget=ZCDP(2.0))
    assert "rng_key" in refuses(mst, chain_records, rng_key=None)
    assert "cannot be seeded" in refuses(mst, chain_records, sampler="opendp")
    assert "zz" in refuses(mst, chain_records, initial_cliques=[("a", "zz")])
    assert "neighbouring" in refuses(mst, chain_records, neighbours="swap")
    assert "iters" in refuses(mst, chain_records, iters=0)
    assert "unknown stop 'best'" in refuses(mst, chain_records, stop="best")
    assert "compile_mode" in refuses(mst, chain_records, compile_mode="fast")
    with pytest.raises(ValueError, match="delta"):
        ApproxDP(1.0, 1.5)
    with pytest.raises(ValueError, match="epsilon"):
        ApproxDP(0.0, 1e-6)


def test_independent_fit_is_the_optimum_prox_pgm_approaches():
    from numpyro_dpgm import Domain, Gaussian, Measurement, prox_pgm
    from numpyro_dpgm.estimation import estimate_total
    from numpyro_dpgm.mechanisms.compression import compress_domain
    from numpyro_dpgm.mechanisms.mst import independent_fit

    rng = np.random.default_rng(5)
    dom = Domain({"x": 6, "y": 3})
    counts = {"x": np.array([400.0, 300.0, 5.0, 0.0, 2.0, 250.0]),
              "y": np.array([500.0, 450.0, 10.0])}
    ms = [Measurement((a,), counts[a] + 8.0 * rng.standard_normal(dom[a]), Gaussian(8.0))
          for a in dom.attrs]
    comp, ms = compress_domain(ms, dom)  # x merges its rare values: a query with 1/√k
    assert ms[0].query is not None
    total = estimate_total(ms)
    p = independent_fit(ms, total)
    fit = prox_pgm(ms, comp.domain, total_count=total, max_iters=20_000, stop="optimum")

    def loss(q):
        out = 0.0
        for m in ms:
            pred = total * q[m.clique[0]]
            pred = pred if m.query is None else m.query @ pred
            out += 0.5 * np.sum((pred - m.values) ** 2) / 64.0
        return out

    fitted = {a: np.asarray(fit.model.marginal((a,))) for a in dom.attrs}
    assert loss(p) <= loss(fitted) * (1 + 1e-9)  # the exact optimum
    for a in dom.attrs:
        np.testing.assert_allclose(p[a], fitted[a], atol=1e-3)
