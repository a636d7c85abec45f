"""Accounting: closed forms, conversions, calibration, ledger; cross-checked with dp-accounting
and OpenDP."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as dpa_gaussian
from dp_accounting.pld import privacy_loss_mechanism as dpa_plm
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

from numpyro_dpgm.privacy import (
    ZCDP,
    ApproxDP,
    BudgetExceededError,
    PrivacyBudget,
    PrivacyLedger,
    PureDP,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    approx_to_zcdp,
    compose,
    gaussian_rho,
    gaussian_sigma_approx,
    gaussian_sigma_zcdp,
    laplace_scale,
    pure_to_zcdp,
    zcdp_to_approx,
)

# dense RDP orders for dp-accounting's discrete minimisation over α
ORDERS = np.concatenate([np.linspace(1.02, 20, 4000), np.geomspace(20, 1e5, 4000)])


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0, -1.0, math.inf, math.nan])
def test_bad_epsilon(eps):
    with pytest.raises(ValueError, match="epsilon must be a positive finite number"):
        PureDP(eps)
    with pytest.raises(ValueError, match="positive finite"):
        ApproxDP(eps, 1e-6)
    with pytest.raises(ValueError, match="positive finite"):
        laplace_scale(eps, 1.0)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-3, 1.5, math.nan])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta must lie strictly between 0 and 1"):
        ApproxDP(1.0, delta)
    with pytest.raises(ValueError, match="delta must lie strictly between 0 and 1"):
        zcdp_to_approx(0.1, delta)


@pytest.mark.parametrize("rho", [0.0, -0.5, math.inf])
def test_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        ZCDP(rho)


def test_bad_types():
    with pytest.raises(TypeError):
        PureDP("one")
    with pytest.raises(ValueError, match="conversion"):
        zcdp_to_approx(0.1, 1e-6, conversion="rdp")
    with pytest.raises(ValueError, match="calibration"):
        gaussian_sigma_approx(1.0, 1e-6, 1.0, method="classic")


# ---------------------------------------------------------------------------------------------
# closed forms and conversions
# ---------------------------------------------------------------------------------------------
def test_closed_forms():
    assert pure_to_zcdp(0.3) == pytest.approx(0.045, rel=1e-15)
    assert PureDP(2.0).to_zcdp() == ZCDP(2.0)
    assert laplace_scale(0.5, 3.0) == pytest.approx(6.0, rel=1e-15)
    assert gaussian_sigma_zcdp(0.5, 2.0) == pytest.approx(2.0, rel=1e-15)  # Δ/√(2ρ)
    assert gaussian_rho(2.0, 2.0) == pytest.approx(0.5, rel=1e-15)  # Δ²/(2σ²)
    for rho, delta in [(0.01, 1e-6), (1.0, 1e-9), (5.0, 0.1)]:
        expected = rho + 2 * math.sqrt(rho * math.log(1 / delta))
        assert zcdp_to_approx(rho, delta) == pytest.approx(expected, rel=1e-14)
        assert ZCDP(rho).to_approx(delta) == ApproxDP(zcdp_to_approx(rho, delta), delta)


@pytest.mark.parametrize("conversion", ["bs16", "cks20"])
@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 1e-6), (1.0, 1e-9), (8.0, 1e-3)])
def test_approx_to_zcdp_round_trip(conversion, eps, delta):
    rho = approx_to_zcdp(eps, delta, conversion)
    back = zcdp_to_approx(rho, delta, conversion)
    assert back <= eps * (1 + 1e-12)
    assert back == pytest.approx(eps, rel=1e-9)


def test_bs16_inverse_closed_form():
    # √ρ = √(log(1/δ) + ε) − √(log(1/δ))  (Bun & Steinke 2016, Prop. 1.3 inverted)
    eps, delta = 1.0, 1e-6
    L = math.log(1 / delta)
    assert approx_to_zcdp(eps, delta) == pytest.approx((math.sqrt(L + eps) - math.sqrt(L)) ** 2)


def test_tight_conversion_is_tighter():
    for rho in [1e-4, 0.01, 0.3, 2.0, 20.0]:
        for delta in [1e-10, 1e-6, 1e-2]:
            assert zcdp_to_approx(rho, delta, "cks20") <= zcdp_to_approx(rho, delta, "bs16")
            assert approx_to_zcdp(1.0, delta, "cks20") >= approx_to_zcdp(1.0, delta, "bs16")


@pytest.mark.parametrize("rho", [1e-3, 0.05, 0.5, 4.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_tight_conversion_vs_dp_accounting_rdp(rho, delta):
    """ρ-zCDP is RDP ρα at every order; dp-accounting converts RDP with the same CKS20 bound but
    minimises over a finite grid of orders, so it can only be (slightly) larger."""
    theirs, _ = dpa_rdp.compute_epsilon(ORDERS, ORDERS * rho, delta)
    ours = zcdp_to_approx(rho, delta, "cks20")
    assert ours <= theirs + 1e-9
    assert ours == pytest.approx(theirs, rel=1e-4)


def test_gaussian_composition_vs_dp_accounting_rdp_accountant():
    """k Gaussian releases with noise multiplier σ: ρ = k/(2σ²) in zCDP, then (ε, δ)."""
    sigma, k, delta = 3.0, 7, 1e-6
    acc = dpa_rdp.RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_event.GaussianDpEvent(sigma), k)
    theirs = acc.get_epsilon(delta)
    rho = compose([ZCDP(gaussian_rho(sigma, 1.0))] * k).rho
    assert rho == pytest.approx(k / (2 * sigma**2), rel=1e-14)
    assert zcdp_to_approx(rho, delta, "cks20") == pytest.approx(theirs, rel=1e-4)
    assert zcdp_to_approx(rho, delta, "cks20") <= theirs + 1e-9


@pytest.fixture
def opendp_contrib():
    import opendp.prelude as dp
    from opendp.mod import GLOBAL_FEATURES

    was_on = "contrib" in GLOBAL_FEATURES
    dp.enable_features("contrib")
    yield dp
    if not was_on:
        dp.disable_features("contrib")


def test_tight_conversion_vs_opendp(opendp_contrib):
    dp = opendp_contrib
    space = dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)
    for rho in [0.01, 0.5, 3.0]:
        meas = dp.c.make_zCDP_to_approxDP(dp.m.make_gaussian(*space, scale=1 / math.sqrt(2 * rho)))
        curve = meas.map(1.0)
        for delta in [1e-9, 1e-6]:
            assert zcdp_to_approx(rho, delta, "cks20") == pytest.approx(
                curve.epsilon(delta), rel=1e-9
            )


# ---------------------------------------------------------------------------------------------
# Gaussian calibration
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-2])
def test_analytic_gaussian_vs_dp_accounting(eps, delta):
    sigma = gaussian_sigma_approx(eps, delta, 1.0)
    assert sigma == pytest.approx(dpa_gaussian.get_sigma_gaussian(eps, delta), rel=1e-9)
    # σ scales with the sensitivity
    assert gaussian_sigma_approx(eps, delta, 3.0) == pytest.approx(3 * sigma, rel=1e-9)
    # never under-noised: the exact δ at σ is ≤ the target (and equal up to root-finding)
    assert analytic_gaussian_delta(sigma, eps, 1.0) <= delta
    assert analytic_gaussian_delta(sigma, eps, 1.0) == pytest.approx(delta, rel=1e-6)
    assert analytic_gaussian_epsilon(sigma, delta, 1.0) == pytest.approx(
        dpa_gaussian.get_epsilon_gaussian(sigma, delta), rel=1e-9
    )


@pytest.mark.parametrize("sigma,sens,eps", [(2.0, 1.0, 0.5), (5.0, 2.0, 1.0), (1.0, 1.0, 3.0)])
def test_analytic_delta_vs_pld(sigma, sens, eps):
    """The privacy profile of the Gaussian mechanism, vs dp-accounting's privacy-loss model."""
    pl = dpa_plm.GaussianPrivacyLoss(sigma, sensitivity=sens)
    assert analytic_gaussian_delta(sigma, eps, sens) == pytest.approx(
        pl.get_delta_for_epsilon(eps), rel=1e-6
    )


def test_zcdp_gaussian_calibration_matches_autodp_values():
    # autodp 0.2.3.1's RDP calibration (δ = 1e-6) gives σ = 5.350 at ε = 1, 0.6079 at ε = 10
    assert gaussian_sigma_approx(1.0, 1e-6, 1.0, method="zcdp") == pytest.approx(5.350, abs=2e-3)
    assert gaussian_sigma_approx(10.0, 1e-6, 1.0, method="zcdp") == pytest.approx(0.6079, rel=2e-2)
    # the analytic calibration needs less noise than any zCDP route
    assert gaussian_sigma_approx(1.0, 1e-6, 1.0) < gaussian_sigma_approx(
        1.0, 1e-6, 1.0, method="zcdp", conversion="cks20"
    )


# ---------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------
def test_compose():
    total = compose([PureDP(0.1), PureDP(0.2), 0.3])
    assert isinstance(total, PureDP) and total.epsilon == pytest.approx(0.6)
    assert compose([PureDP(1.0), ZCDP(0.25)]).rho == pytest.approx(0.75)
    mixed = compose([PureDP(0.5), ApproxDP(0.25, 1e-6), ApproxDP(0.25, 2e-6)])
    assert mixed.epsilon == pytest.approx(1.0) and mixed.delta == pytest.approx(3e-6)
    with pytest.raises(ValueError, match="convert the ZCDP costs"):
        compose([ZCDP(0.1), ApproxDP(1.0, 1e-6)])
    with pytest.raises(ValueError, match="at least one"):
        compose([])
    with pytest.raises(ValueError, match="no zCDP bound"):
        ApproxDP(1.0, 1e-6).to_zcdp()


# ---------------------------------------------------------------------------------------------
# the ledger
# ---------------------------------------------------------------------------------------------
def test_pure_ledger_composes_and_refuses():
    ledger = PrivacyLedger(PureDP(1.0))
    for i in range(3):
        ledger.debit(PureDP(1 / 3), f"table {i}")  # ε/3 three times fits despite rounding
    assert ledger.spent == pytest.approx(1.0)
    assert ledger.remaining == pytest.approx(0.0, abs=1e-12)
    assert [e.label for e in ledger.history] == ["table 0", "table 1", "table 2"]
    with pytest.raises(BudgetExceededError, match="Nothing was charged") as info:
        ledger.debit(PureDP(0.01), "one more")
    assert info.value.label == "one more" and info.value.currency == "pure"
    assert len(ledger.history) == 3
    g = ledger.guarantee()
    assert isinstance(g, PureDP) and g.epsilon == pytest.approx(1.0)


def test_refusal_leaves_ledger_unchanged():
    ledger = PrivacyLedger(0.5)  # a number is a pure ε total
    ledger.debit(0.3, "first")
    assert not ledger.can_afford(0.3)
    with pytest.raises(BudgetExceededError):
        ledger.check(0.3, "second")
    with pytest.raises(BudgetExceededError):
        ledger.debit(0.3, "second")
    assert ledger.spent == pytest.approx(0.3) and len(ledger.history) == 1
    ledger.debit(0.2, "third")
    assert ledger.remaining == pytest.approx(0.0, abs=1e-12)


def test_pure_ledger_rejects_zcdp_and_approx_costs():
    ledger = PrivacyLedger(PureDP(1.0))
    with pytest.raises(ValueError, match="pays only for pure"):
        ledger.debit(ZCDP(0.01), "gaussian")
    with pytest.raises(ValueError, match="pays only for pure"):
        ledger.debit(ApproxDP(0.1, 1e-6), "gaussian")
    assert not ledger.history


def test_zcdp_ledger():
    ledger = PrivacyBudget(ZCDP(0.5))
    ledger.debit(PureDP(0.6), "laplace", details={"scale": 5.0})
    ledger.debit(ZCDP(0.2), "gaussian")
    assert ledger.history[0].charge == pytest.approx(0.18)
    assert ledger.history[0].details["scale"] == 5.0
    assert ledger.spent == pytest.approx(0.38)
    assert ledger.remaining == pytest.approx(0.12)
    g = ledger.guarantee()
    assert isinstance(g, ZCDP) and g.rho == pytest.approx(0.38)
    assert ledger.guarantee(1e-6).epsilon == pytest.approx(zcdp_to_approx(0.38, 1e-6))
    with pytest.raises(ValueError, match="only \\(ε, δ\\)-DP"):
        ledger.debit(ApproxDP(0.1, 1e-6), "analytic gaussian")
    # a mechanism offering several guarantees is charged by the first this currency accepts
    entry = ledger.debit([ApproxDP(0.5, 1e-6), ZCDP(0.1)], "gaussian, analytic")
    assert entry.cost == ZCDP(0.1) and entry.charge == pytest.approx(0.1)
    with pytest.raises(BudgetExceededError):
        ledger.debit(ZCDP(0.05), "too much")


def test_approx_ledger_basic_composition():
    ledger = PrivacyLedger(ApproxDP(1.0, 1e-5))
    assert ledger.currency == "approx"
    ledger.debit(PureDP(0.4), "laplace")
    ledger.debit(ApproxDP(0.4, 6e-6), "gaussian")
    eps, delta = ledger.spent
    assert eps == pytest.approx(0.8) and delta == pytest.approx(6e-6)
    assert ledger.remaining == (pytest.approx(0.2), pytest.approx(4e-6))
    with pytest.raises(BudgetExceededError):  # ε fits, δ does not
        ledger.debit(ApproxDP(0.1, 5e-6), "δ too large")
    with pytest.raises(ValueError, match="needs a δ"):
        ledger.debit(ZCDP(0.001), "zcdp gaussian")
    g = ledger.guarantee()
    assert isinstance(g, ApproxDP)
    assert (g.epsilon, g.delta) == (pytest.approx(0.8), pytest.approx(6e-6))


@pytest.mark.parametrize("conversion", ["bs16", "cks20"])
def test_approx_ledger_in_zcdp_currency(conversion):
    ledger = PrivacyLedger(ApproxDP(1.0, 1e-6), currency="zcdp", conversion=conversion)
    rho = approx_to_zcdp(1.0, 1e-6, conversion)
    assert ledger.budget == pytest.approx(rho)
    for i in range(4):
        ledger.debit(ZCDP(rho / 4), f"part {i}")
    g = ledger.guarantee()
    assert isinstance(g, ApproxDP) and g.delta == 1e-6
    assert g.epsilon == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(BudgetExceededError):
        ledger.debit(ZCDP(rho / 100), "over")


def test_ledger_bad_arguments():
    with pytest.raises(ValueError, match="cannot be kept in currency"):
        PrivacyLedger(PureDP(1.0), currency="zcdp")
    with pytest.raises(ValueError, match="cannot be kept in currency"):
        PrivacyLedger(ZCDP(1.0), currency="approx")
    with pytest.raises(ValueError, match="positive finite"):
        PrivacyLedger(0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(ApproxDP(1.0, 1.0))
    ledger = PrivacyLedger(1.0)
    with pytest.raises(ValueError, match="non-empty label"):
        ledger.debit(0.1, "")
    with pytest.raises(TypeError, match="privacy cost"):
        ledger.debit("a lot", "x")
    assert ledger.guarantee() is None
    assert "remaining" in repr(ledger) and "total" in ledger.summary()
