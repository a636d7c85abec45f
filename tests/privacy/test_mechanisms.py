"""Releases of clique tables: sensitivity, calibration, samplers, ledger refusal, N estimation."""

import math

import jax
import numpy as np
import pandas as pd
import pytest

from numpyro_dpgm import Dataset, Domain, MarkovNetwork, count
from numpyro_dpgm.measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
)
from numpyro_dpgm.privacy import (
    ZCDP,
    ApproxDP,
    BudgetExceededError,
    PrivacyLedger,
    PureDP,
    Sensitivity,
    calibrate,
    estimate_total,
    gaussian_sigma_approx,
    marginal_sensitivity,
    release,
    release_tables,
    simulate_noise,
    simulate_release,
)
from numpyro_dpgm.privacy import releases as release_module

DOMAIN = Domain({"a": 2, "b": 3, "c": 2})
CLIQUES = [("a", "b"), ("b", "c")]


@pytest.fixture(scope="module")
def records():
    rng = np.random.default_rng(0)
    return np.stack([rng.integers(0, k, size=500) for k in DOMAIN.shape], axis=1)


def _discrete_gaussian_variance(sigma):
    z = np.arange(-int(40 * sigma) - 1, int(40 * sigma) + 2)
    w = np.exp(-(z**2) / (2 * sigma**2))
    return float(np.sum(z**2 * w) / np.sum(w))


def _discrete_laplace_variance(scale):
    q = math.exp(-1 / scale)
    return 2 * q / (1 - q) ** 2


# ---------------------------------------------------------------------------------------------
# sensitivity and calibration
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 8])
def test_sensitivity_values(k):
    assert marginal_sensitivity(k, "add_remove") == Sensitivity(k, math.sqrt(k))
    assert marginal_sensitivity(k, "replace_one") == Sensitivity(2 * k, math.sqrt(2 * k))
    assert marginal_sensitivity(k, "replace") == marginal_sensitivity(k, "replace_one")
    half = marginal_sensitivity(k, "replace_one", person_bound=0.5)
    assert half.l1 == pytest.approx(k) and half.l2 == pytest.approx(0.5 * math.sqrt(2 * k))


def test_sensitivity_errors():
    with pytest.raises(ValueError, match="at least 1"):
        marginal_sensitivity(0)
    with pytest.raises(ValueError, match="unknown neighbouring relation"):
        marginal_sensitivity(2, "swap")
    with pytest.raises(ValueError, match="person_bound"):
        marginal_sensitivity(2, person_bound=0)


def test_calibrate_closed_forms():
    s = marginal_sensitivity(3, "replace_one")
    spec, g = calibrate("laplace", 0.5, s)
    assert spec == Laplace(6 / 0.5) and g == (PureDP(0.5),)
    spec, g = calibrate("discrete_laplace", PureDP(2.0), s)
    assert spec == DiscreteLaplace(3.0)
    spec, g = calibrate("laplace", ZCDP(0.125), s)  # ε = √(2ρ) = 0.5
    assert spec.scale == pytest.approx(12.0) and g[0].epsilon == pytest.approx(0.5)
    spec, g = calibrate("gaussian", ZCDP(0.3), s)
    assert spec == Gaussian(math.sqrt(6) / math.sqrt(0.6)) and g == (ZCDP(0.3),)
    spec, g = calibrate("discrete_gaussian", ZCDP(0.3), s)
    assert isinstance(spec, DiscreteGaussian) and spec.sigma == pytest.approx(math.sqrt(10))
    spec, g = calibrate("gaussian", ApproxDP(1.0, 1e-6), s)
    assert spec.sigma == pytest.approx(gaussian_sigma_approx(1.0, 1e-6, math.sqrt(6)))
    assert g[0] == ApproxDP(1.0, 1e-6)
    assert g[1].rho == pytest.approx(6 / (2 * spec.sigma**2))
    spec, g = calibrate("discrete_gaussian", ApproxDP(1.0, 1e-6), s)
    assert spec.sigma == pytest.approx(
        gaussian_sigma_approx(1.0, 1e-6, math.sqrt(6), method="zcdp")
    )


def test_calibrate_errors():
    s = marginal_sensitivity(2)
    with pytest.raises(ValueError, match="pure ε-DP"):
        calibrate("laplace", ApproxDP(1.0, 1e-6), s)
    with pytest.raises(ValueError, match="not ε-DP"):
        calibrate("gaussian", 1.0, s)
    with pytest.raises(ValueError, match="continuous"):
        calibrate("discrete_gaussian", ApproxDP(1.0, 1e-6), s, calibration="analytic")
    with pytest.raises(ValueError, match="unknown mechanism"):
        calibrate("exponential", 1.0, s)
    with pytest.raises(TypeError, match="budget"):
        calibrate("laplace", "1.0", s)


# ---------------------------------------------------------------------------------------------
# release: values, sensitivity wiring, inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("neighbours,factor", [("add_remove", 1), ("replace_one", 2)])
def test_release_laplace_scale_and_order(records, neighbours, factor):
    ledger = PrivacyLedger(PureDP(2.0))
    ms = release(
        records, CLIQUES, 0.5, domain=DOMAIN, neighbours=neighbours, sampler="jax", rng_key=1,
        ledger=ledger,
    )
    assert [m.clique for m in ms] == CLIQUES
    assert all(m.noise == Laplace(factor * 2 / 0.5) for m in ms)
    assert [m.values.size for m in ms] == [6, 6]
    entry = ledger.history[0]
    assert entry.charge == pytest.approx(0.5)
    assert entry.details["sensitivity"] == marginal_sensitivity(2, neighbours)
    assert entry.details["sampler"] == "jax"


def test_release_inputs_agree(records):
    """Array + domain, DataFrame + domain, Dataset and a MarkovNetwork give the same release."""
    frame = pd.DataFrame(records, columns=list(DOMAIN.attrs))
    key = jax.random.key(3)
    a = simulate_release(records, CLIQUES, 1.0, key, domain=DOMAIN)
    b = simulate_release(frame, CLIQUES, 1.0, key, domain=DOMAIN)
    c = simulate_release(Dataset(frame, DOMAIN), CLIQUES, 1.0, key)
    d = simulate_release(frame, MarkovNetwork(DOMAIN, CLIQUES), 1.0, key)
    for x, y, z, w in zip(a, b, c, d, strict=True):
        np.testing.assert_array_equal(x.values, y.values)
        np.testing.assert_array_equal(x.values, z.values)
        np.testing.assert_array_equal(x.values, w.values)
    # reproducible from the key, different for another key
    again = simulate_release(records, CLIQUES, 1.0, jax.random.key(3), domain=DOMAIN)
    np.testing.assert_array_equal(a[0].values, again[0].values)
    other = simulate_release(records, CLIQUES, 1.0, jax.random.key(4), domain=DOMAIN)
    assert not np.array_equal(a[0].values, other[0].values)


def test_release_tables_matches_release(records):
    tables = count(records, CLIQUES, DOMAIN)
    key = jax.random.key(5)
    x = release(records, CLIQUES, ZCDP(0.2), domain=DOMAIN, mechanism="gaussian",
                sampler="jax", rng_key=key)
    y = release_tables(tables, ZCDP(0.2), domain=DOMAIN, mechanism="gaussian",
                       sampler="jax", rng_key=key)
    for m, n in zip(x, y, strict=True):
        np.testing.assert_array_equal(m.values, n.values)
        assert m.noise == n.noise == Gaussian(math.sqrt(2) / math.sqrt(0.4))


def test_weights_scale_sensitivity(records):
    w = np.full(len(records), 0.25)
    ledger = PrivacyLedger(PureDP(10.0))
    ms = release(records, CLIQUES, 1.0, domain=DOMAIN, weights=w, sampler="jax", rng_key=0,
                 ledger=ledger)
    assert ms[0].noise == Laplace(2.0)  # bound 1 per person: same as unweighted
    w2 = np.full(len(records), 1.5)
    ms = release(records, CLIQUES, 1.0, domain=DOMAIN, weights=w2, person_bound=2.0,
                 sampler="jax", rng_key=0, ledger=ledger)
    assert ms[0].noise == Laplace(4.0)
    assert ledger.history[1].details["person_bound"] == 2.0
    with pytest.raises(ValueError, match="per-person bound"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, weights=w2, sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="weighted counts are fractional"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, weights=w, mechanism="discrete_laplace",
                sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="whole number"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, person_bound=1.5,
                mechanism="discrete_laplace", sampler="jax", rng_key=0)


def test_release_errors(records):
    kw = dict(domain=DOMAIN, sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="positive finite"):
        release(records, CLIQUES, 0.0, **kw)
    with pytest.raises(ValueError, match="positive finite"):
        release(records, CLIQUES, -1.0, **kw)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        release(records, CLIQUES, ApproxDP(1.0, 1.0), mechanism="gaussian", **kw)
    with pytest.raises(ValueError, match="empty list of cliques"):
        release(records, [], 1.0, **kw)
    with pytest.raises(KeyError, match="unknown attribute"):
        release(records, [("a", "z")], 1.0, **kw)
    with pytest.raises(ValueError, match="listed twice"):
        release(records, [("a", "b"), ("b", "a")], 1.0, **kw)
    with pytest.raises(ValueError, match="unknown mechanism"):
        release(records, CLIQUES, 1.0, mechanism="gauss", **kw)
    with pytest.raises(ValueError, match="unknown neighbouring relation"):
        release(records, CLIQUES, 1.0, neighbours="bounded", **kw)
    with pytest.raises(ValueError, match="unknown sampler"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, sampler="numpy")
    with pytest.raises(ValueError, match="cannot be seeded"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, rng_key=0)
    with pytest.raises(ValueError, match="needs rng"):
        release(records, CLIQUES, 1.0, domain=DOMAIN, sampler="jax")
    with pytest.raises(ValueError, match="need their domain"):
        release(records, CLIQUES, 1.0, sampler="jax", rng_key=0)
    frame = pd.DataFrame(records, columns=list(DOMAIN.attrs))
    with pytest.raises(ValueError, match="mismatched domains"):
        release(Dataset(frame, DOMAIN), CLIQUES, 1.0, domain={"a": 2, "b": 4, "c": 2},
                sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="mismatched domains"):
        release(frame, MarkovNetwork({"a": 2, "b": 4, "c": 2}, CLIQUES), 1.0, **kw)
    tables = count(records, CLIQUES, DOMAIN)
    with pytest.raises(ValueError, match="mismatched domains"):
        release_tables(tables, 1.0, domain={"a": 2, "b": 3, "c": 5}, sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="needs integer counts"):
        release_tables(tables * 0.5, 1.0, mechanism="discrete_laplace", sampler="jax", rng_key=0)
    with pytest.raises(ValueError, match="empty list of cliques"):
        release_tables({}, 1.0, sampler="jax", rng_key=0)


# ---------------------------------------------------------------------------------------------
# ledger refusal happens before any noise is drawn
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler,rng", [("jax", 0), ("opendp", None)])
def test_refusal_draws_nothing(records, monkeypatch, sampler, rng):
    draws = []
    real_jax, real_odp = release_module.simulate_noise, release_module.opendp_draw
    monkeypatch.setattr(release_module, "simulate_noise",
                        lambda *a: draws.append(a) or real_jax(*a))
    monkeypatch.setattr(release_module, "opendp_draw", lambda *a: draws.append(a) or real_odp(*a))
    ledger = PrivacyLedger(ZCDP(0.5))
    kw = dict(domain=DOMAIN, sampler=sampler, rng_key=rng, ledger=ledger, mechanism="gaussian")
    release(records, CLIQUES, ZCDP(0.3), **kw)
    assert len(draws) == 1 and len(ledger.history) == 1
    with pytest.raises(BudgetExceededError, match="gaussian release of .*no noise was drawn"):
        release(records, CLIQUES, ZCDP(0.3), **kw)
    assert len(draws) == 1 and len(ledger.history) == 1
    assert ledger.spent == pytest.approx(0.3)
    # a guarantee the ledger cannot hold is refused just as early
    pure = PrivacyLedger(1.0)
    with pytest.raises(ValueError, match="pays only for pure"):
        release(records, CLIQUES, ZCDP(0.01), **{**kw, "ledger": pure})
    assert len(draws) == 1 and not pure.history


def test_pure_ledger_refuses_gaussian(records):
    ledger = PrivacyLedger(1.0)
    with pytest.raises(ValueError, match="pays only for pure"):
        release(records, CLIQUES, ZCDP(0.01), domain=DOMAIN, mechanism="gaussian",
                ledger=ledger)
    assert not ledger.history


def test_gaussian_approx_budget_in_approx_ledger(records):
    ledger = PrivacyLedger(ApproxDP(1.0, 1e-5))
    release(records, CLIQUES, ApproxDP(0.5, 5e-6), domain=DOMAIN, mechanism="gaussian",
            sampler="jax", rng_key=0, ledger=ledger)
    assert ledger.history[0].cost == ApproxDP(0.5, 5e-6)
    assert ledger.history[0].details["calibration"] == "analytic"


# ---------------------------------------------------------------------------------------------
# noise statistics
# ---------------------------------------------------------------------------------------------
N_JAX = 40_000


def test_jax_laplace_statistics():
    """Mean and variance of 40 000 seeded Laplace(b = 4) draws added to a known table.

    Tolerances: 4 standard errors, sd(mean) = √(2)b/√n ≈ 0.028, sd(s²)/σ² = √(5/n) ≈ 1.1 %.
    """
    b = 4.0
    tables = {("x",): np.full(N_JAX, 7.0)}
    ms = release_tables(tables, PureDP(0.25), sampler="jax", rng_key=jax.random.key(11))
    assert ms[0].noise == Laplace(b)
    noise = ms[0].values - 7.0
    assert abs(noise.mean()) < 4 * math.sqrt(2) * b / math.sqrt(N_JAX)
    assert noise.var() / (2 * b**2) == pytest.approx(1.0, abs=4 * math.sqrt(5 / N_JAX))
    # Laplace: E|z| = b
    assert np.abs(noise).mean() == pytest.approx(b, rel=0.02)


def test_jax_gaussian_statistics():
    sigma = 3.0
    z = np.asarray(simulate_noise(jax.random.key(12), Gaussian(sigma), N_JAX))
    assert abs(z.mean()) < 4 * sigma / math.sqrt(N_JAX)
    assert z.var() / sigma**2 == pytest.approx(1.0, abs=4 * math.sqrt(2 / N_JAX))


@pytest.mark.parametrize(
    "spec", [DiscreteLaplace(2.5), DiscreteGaussian(0.7), DiscreteGaussian(6.0)]
)
def test_jax_discrete_statistics(spec):
    z = np.asarray(simulate_noise(jax.random.key(13), spec, N_JAX))
    assert np.issubdtype(z.dtype, np.integer)
    var = (
        _discrete_laplace_variance(spec.scale)
        if isinstance(spec, DiscreteLaplace)
        else _discrete_gaussian_variance(spec.sigma)
    )
    assert abs(z.mean()) < 4 * math.sqrt(var / N_JAX)
    # sd(s²)/σ² ≤ √(5/n) (kurtosis ≤ that of the Laplace): 4 sd ≈ 4.5 %
    assert z.var() / var == pytest.approx(1.0, abs=4 * math.sqrt(5 / N_JAX))


N_ODP = 8_000


@pytest.mark.parametrize(
    "mechanism,budget,spec",
    [
        ("discrete_laplace", PureDP(0.2), DiscreteLaplace(5.0)),
        ("discrete_gaussian", ZCDP(0.02), DiscreteGaussian(5.0)),
    ],
)
def test_opendp_discrete_integers_and_scale(mechanism, budget, spec):
    """OpenDP (unseeded, vetted): integer outputs with the stated scale.

    Tolerance on the empirical variance: 12 %, about 5 standard errors
    (sd(s²)/σ² ≈ √(5/8000) = 2.5 % for the discrete Laplace, √(2/8000) = 1.6 % for the discrete
    Gaussian), so a false failure has probability below 1e-6.
    """
    tables = {("x",): np.full(N_ODP, 100.0)}
    ledger = PrivacyLedger(ZCDP(1.0))
    ms = release_tables(tables, budget, mechanism=mechanism, ledger=ledger)
    assert ms[0].noise == spec
    y = ms[0].values
    np.testing.assert_array_equal(y, np.round(y))
    var = (
        _discrete_laplace_variance(spec.scale)
        if isinstance(spec, DiscreteLaplace)
        else _discrete_gaussian_variance(spec.sigma)
    )
    assert abs(y.mean() - 100.0) < 6 * math.sqrt(var / N_ODP)
    assert (y - 100.0).var() / var == pytest.approx(1.0, abs=0.12)
    details = ledger.history[0].details
    assert details["sampler"] == "opendp"
    expected = budget.epsilon if isinstance(budget, PureDP) else budget.rho
    assert details["opendp_map"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "mechanism,budget,spec",
    [("laplace", PureDP(0.5), Laplace(2.0)), ("gaussian", ZCDP(0.125), Gaussian(2.0))],
)
def test_opendp_continuous(mechanism, budget, spec):
    """OpenDP's float samplers: non-integer outputs with the stated scale (tolerance 15 %, > 5
    standard errors at n = 4000)."""
    n = 4000
    ms = release_tables({("x",): np.full(n, 10.0)}, budget, mechanism=mechanism)
    assert ms[0].noise == spec
    y = ms[0].values
    assert not np.all(y == np.round(y))
    assert (y - 10.0).var() / spec.variance == pytest.approx(1.0, abs=0.15)


def test_opendp_release_of_records(records):
    from opendp.mod import GLOBAL_FEATURES

    contrib_before = "contrib" in GLOBAL_FEATURES
    ms = release(records, CLIQUES, 1.0, domain=DOMAIN, mechanism="discrete_laplace",
                 neighbours="replace_one")
    assert [m.noise for m in ms] == [DiscreteLaplace(4.0)] * 2
    assert ("contrib" in GLOBAL_FEATURES) == contrib_before  # the feature flag is restored
    for m in ms:
        np.testing.assert_array_equal(m.values, np.round(m.values))


# ---------------------------------------------------------------------------------------------
# estimating N
# ---------------------------------------------------------------------------------------------
def test_estimate_total_closed_form():
    m1 = Measurement(("a",), [60.0, 50.0], Laplace(1.0))  # sum 110, var 2·1·2 = 4
    m2 = Measurement(("b",), [20.0, 30.0, 40.0, 10.0], Gaussian(2.0))  # sum 100, var 4·4 = 16
    value, var = estimate_total([m1, m2], return_variance=True)
    assert var == pytest.approx(1 / (1 / 4 + 1 / 16))
    assert value == pytest.approx((110 / 4 + 100 / 16) * var)
    assert estimate_total([Measurement(("a",), [-5.0, 1.0], Laplace(1.0))]) == 1.0  # clipped
    # a query whose row is the total also estimates N (variance 2·1 = 2)
    q = Measurement(("a",), [104.0], Laplace(1.0), query=[[1.0, 1.0]])
    assert estimate_total([m1, q]) == pytest.approx((110 / 4 + 104 / 2) / (1 / 4 + 1 / 2))
    # a query that cannot express the total contributes nothing; alone it is an error
    r = Measurement(("a",), [1.0], Laplace(1.0), query=[[1.0, -1.0]])
    assert estimate_total([m1, r]) == pytest.approx(110.0)
    with pytest.raises(ValueError, match="determines the number of records"):
        estimate_total([r])


def test_estimate_total_unbiased(records):
    """2000 simulated releases (add/remove Laplace, ε = 0.5 over 2 tables): the mean of N̂ is
    within 4 standard errors of N, and its spread matches the inverse-variance formula."""
    tables = count(records, [("a",), ("a", "b", "c")], DOMAIN)
    n_true = len(records)
    reps = 2000
    spec = release_tables(tables, 0.5, sampler="jax", rng_key=0)[0].noise
    keys = jax.random.split(jax.random.key(21), 2)
    noisy = {
        c: np.asarray(tables[c]).ravel()
        + np.asarray(simulate_noise(k, spec, (reps, np.size(tables[c]))))
        for c, k in zip(tables, keys, strict=True)
    }
    est = np.array(
        [estimate_total([Measurement(c, noisy[c][r], spec) for c in tables]) for r in range(reps)]
    )
    _, var = estimate_total([Measurement(c, noisy[c][0], spec) for c in tables],
                            return_variance=True)
    assert var == pytest.approx(1 / (1 / (2 * 16 * 2) + 1 / (2 * 16 * 12)))
    assert abs(est.mean() - n_true) < 4 * math.sqrt(var / reps)
    assert est.var() / var == pytest.approx(1.0, abs=0.15)


# ---------------------------------------------------------------------------------------------
# release size: refused before anything is counted or spent; sparse tables warned
# ---------------------------------------------------------------------------------------------
def test_release_above_max_cells_is_refused_before_the_ledger_pays(records):
    ledger = PrivacyLedger(PureDP(2.0))
    with pytest.raises(ValueError, match=r"12 cells \(clique \('a', 'b'\) alone 6\).*above "
                                         r"max_cells = 10.*release smaller tables"):
        release(records, CLIQUES, 0.5, domain=DOMAIN, sampler="jax", rng_key=1, ledger=ledger,
                max_cells=10)
    assert len(ledger.history) == 0 and ledger.spent == 0
    with pytest.raises(ValueError, match="max_cells must be positive"):
        release_module.check_release_size(CLIQUES, DOMAIN, max_cells=0)


def test_release_beyond_the_machine_is_refused(monkeypatch):
    # a 100-byte machine; the release needs 12 cells × 64 bytes
    monkeypatch.setattr(release_module, "physical_memory", lambda: 100)
    with pytest.raises(ValueError, match=r"more than this machine's"):
        release_module.check_release_size(CLIQUES, DOMAIN)


def test_a_table_with_more_cells_than_records_warns(records):
    few = records[:5]
    with pytest.warns(release_module.SparseTableWarning,
                      match=r"clique \('a', 'b'\) has 6 cells, 1.2× the 5 records"):
        release(few, CLIQUES, 0.5, domain=DOMAIN, sampler="jax", rng_key=1)
    assert release_module.check_release_size(CLIQUES, DOMAIN, num_records=6) == 12
