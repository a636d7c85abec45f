"""Privacy accounting: pure ε-DP, ρ-zCDP and (ε, δ)-DP; composition, conversion, calibration.

Three kinds of privacy guarantee (:data:`PrivacyCost`) appear in this library:

* :class:`PureDP` ``(ε)``: ``P[M(X) ∈ S] ≤ e^ε P[M(X') ∈ S]`` for all neighbouring ``X, X'``.
* :class:`ZCDP` ``(ρ)``: zero-concentrated DP (Bun & Steinke 2016, Def. 1.1),
  ``D_α(M(X) ‖ M(X')) ≤ ρ α`` for every Rényi order ``α > 1``.
* :class:`ApproxDP` ``(ε, δ)``: ``P[M(X) ∈ S] ≤ e^ε P[M(X') ∈ S] + δ``.

Composition (adaptive, :func:`compose`): pure ε's add; zCDP ρ's add (Bun & Steinke 2016,
Lemma 2.3); (ε, δ) pairs add component-wise (basic composition, Dwork & Roth 2014, Thm 3.16).

Conversions (:func:`pure_to_zcdp`, :func:`zcdp_to_approx`, :func:`approx_to_zcdp`):

* ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4).
* ρ-zCDP ⇒ (ε, δ)-DP for every δ ∈ (0, 1), with ``conversion=``

  - ``"bs16"``: ``ε = ρ + 2√(ρ log(1/δ))`` (Bun & Steinke 2016, Prop. 1.3), the standard bound
    used by the papers this library reproduces; the default.
  - ``"cks20"``: ``ε = inf_{α>1} [ αρ + log(1 − 1/α) − (log δ + log α)/(α − 1) ]``
    (Canonne, Kamath & Steinke 2020, Prop. 12; Asoodeh et al. 2021), which is never larger
    (e.g. ε = 0.622 instead of 0.753 at ρ = 0.01, δ = 1e-6). It is the conversion OpenDP and
    ``dp-accounting`` apply to zCDP and RDP curves.

Calibration: the Laplace mechanism with scale ``b = Δ₁/ε`` is ε-DP (Dwork & Roth 2014,
Thm 3.6); the Gaussian mechanism with standard deviation ``σ`` is ``Δ₂²/(2σ²)``-zCDP (Bun &
Steinke 2016, Prop. 1.6), and (ε, δ)-DP exactly when the analytic condition of Balle & Wang
(2018, Thm 8) holds (:func:`analytic_gaussian_delta`).

A :class:`PrivacyLedger` holds a total budget, is debited by every mechanism *before* it draws
noise, records the history of charges and raises :class:`BudgetExceededError` instead of
overspending.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from scipy import optimize, special

__all__ = [
    "PureDP",
    "ZCDP",
    "ApproxDP",
    "PrivacyCost",
    "Conversion",
    "compose",
    "pure_to_zcdp",
    "zcdp_to_approx",
    "approx_to_zcdp",
    "laplace_scale",
    "gaussian_rho",
    "gaussian_sigma_zcdp",
    "gaussian_sigma_approx",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "BudgetExceededError",
    "LedgerEntry",
    "PrivacyLedger",
    "PrivacyBudget",
]

Conversion = Literal["bs16", "cks20"]
_CONVERSIONS = ("bs16", "cks20")

#: Relative slack for floating-point rounding when a ledger compares spending with its total
#: (three debits of ε/3 must fit into ε even though they may sum to ε + 1 ulp).
_ROUNDING_SLACK = 1e-10


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _check_epsilon(epsilon: Any, what: str = "epsilon") -> float:
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a positive number, got {epsilon!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{what} must be a positive finite number, got {value}; ε ≤ 0 gives no privacy "
            "mechanism (infinite noise) and ε = inf gives no privacy"
        )
    return value


def _check_rho(rho: Any) -> float:
    try:
        value = float(rho)
    except (TypeError, ValueError):
        raise TypeError(f"rho must be a positive number, got {rho!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"rho (zCDP) must be a positive finite number, got {value}")
    return value


def _check_delta(delta: Any) -> float:
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise TypeError(f"delta must be a number in (0, 1), got {delta!r}") from None
    if not 0.0 < value < 1.0:
        raise ValueError(
            f"delta must lie strictly between 0 and 1, got {value}; use a pure ε-DP budget "
            "for δ = 0, and choose δ well below 1/N (e.g. 1e-6) for a meaningful guarantee"
        )
    return value


def _check_sensitivity(value: Any, what: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a positive number, got {value!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number, got {value}")
    return value


def _check_conversion(conversion: str) -> str:
    if conversion not in _CONVERSIONS:
        raise ValueError(
            f"unknown zCDP → (ε, δ) conversion {conversion!r}; choose 'bs16' (Bun & Steinke "
            "2016, Prop. 1.3) or 'cks20' (Canonne, Kamath & Steinke 2020, Prop. 12)"
        )
    return conversion


# --------------------------------------------------------------------------------------------
# guarantees
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PureDP:
    """Pure ε-differential privacy.

    Parameters
    ----------
    epsilon : float
        Positive and finite.
    """

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))

    def to_zcdp(self) -> ZCDP:
        """``ε``-DP ⇒ ``ε²/2``-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        return ZCDP(pure_to_zcdp(self.epsilon))

    def to_approx(self, delta: float, conversion: Conversion = "bs16") -> ApproxDP:
        """The (ε', δ) guarantee ``ε' = min(ε, ε_conv(ε²/2, δ))``; ε-DP is (ε, δ)-DP for any δ."""
        delta = _check_delta(delta)
        eps = min(self.epsilon, zcdp_to_approx(pure_to_zcdp(self.epsilon), delta, conversion))
        return ApproxDP(eps, delta)


@dataclass(frozen=True)
class ZCDP:
    """ρ-zero-concentrated differential privacy (Bun & Steinke 2016, Def. 1.1).

    Parameters
    ----------
    rho : float
        Positive and finite.
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_rho(self.rho))

    def to_zcdp(self) -> ZCDP:
        return self

    def to_approx(self, delta: float, conversion: Conversion = "bs16") -> ApproxDP:
        """The (ε, δ)-DP guarantee implied at ``delta`` (see :func:`zcdp_to_approx`)."""
        delta = _check_delta(delta)
        return ApproxDP(zcdp_to_approx(self.rho, delta, conversion), delta)


@dataclass(frozen=True)
class ApproxDP:
    """Approximate (ε, δ)-differential privacy.

    Parameters
    ----------
    epsilon : float
        Positive and finite.
    delta : float
        In the open interval ``(0, 1)``.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))

    def to_zcdp(self) -> ZCDP:
        raise ValueError(
            "an (ε, δ)-DP guarantee implies no zCDP bound; account the mechanism by its zCDP "
            "guarantee (e.g. ZCDP(rho) for the Gaussian mechanism) instead"
        )

    def to_approx(self, delta: float | None = None, conversion: Conversion = "bs16") -> ApproxDP:
        if delta is not None and _check_delta(delta) < self.delta:
            raise ValueError(
                f"an ({self.epsilon}, {self.delta})-DP guarantee says nothing at δ = {delta} "
                f"< {self.delta}"
            )
        return self if delta is None else ApproxDP(self.epsilon, delta)


PrivacyCost = PureDP | ZCDP | ApproxDP


def _as_cost(cost: Any) -> PrivacyCost:
    if isinstance(cost, PureDP | ZCDP | ApproxDP):
        return cost
    if isinstance(cost, numbers.Real) and not isinstance(cost, bool):
        return PureDP(float(cost))
    raise TypeError(
        f"a privacy cost is PureDP(epsilon), ZCDP(rho) or ApproxDP(epsilon, delta) (a bare "
        f"number means PureDP(epsilon)); got {cost!r}"
    )


def compose(costs: Iterable[PrivacyCost | float]) -> PrivacyCost:
    """Adaptive composition of the guarantees ``costs``.

    * all pure: ``PureDP(Σ ε_i)``;
    * pure and zCDP (at least one zCDP): ``ZCDP(Σ ρ_i)`` with ``ρ_i = ε_i²/2`` for the pure ones
      (Bun & Steinke 2016, Prop. 1.4 and Lemma 2.3);
    * pure and (ε, δ) (at least one (ε, δ)): basic composition ``ApproxDP(Σ ε_i, Σ δ_i)``
      with ``δ_i = 0`` for the pure ones (Dwork & Roth 2014, Thm 3.16).

    Raises
    ------
    ValueError
        if ``costs`` is empty, if zCDP and (ε, δ) guarantees are mixed (convert the zCDP ones
        with :meth:`ZCDP.to_approx` at a δ of your choice first), or if the composed δ reaches 1.
    """
    items = [_as_cost(c) for c in costs]
    if not items:
        raise ValueError("compose() needs at least one privacy cost")
    kinds = {type(c) for c in items}
    if ZCDP in kinds and ApproxDP in kinds:
        raise ValueError(
            "cannot compose zCDP with (ε, δ)-DP guarantees directly; convert the ZCDP costs "
            "with .to_approx(delta) first, or keep the (ε, δ) mechanisms out of the zCDP sum"
        )
    if kinds == {PureDP}:
        return PureDP(math.fsum(c.epsilon for c in items))
    if ZCDP in kinds:
        return ZCDP(math.fsum(c.to_zcdp().rho for c in items))
    eps = math.fsum(c.epsilon for c in items)
    delta = math.fsum(c.delta for c in items if isinstance(c, ApproxDP))
    if delta >= 1:
        raise ValueError(f"basic composition gives δ = {delta} ≥ 1, which is no guarantee")
    return ApproxDP(eps, delta)


# --------------------------------------------------------------------------------------------
# conversions
# --------------------------------------------------------------------------------------------
def pure_to_zcdp(epsilon: float) -> float:
    """ρ of an ε-DP mechanism: ``ρ = ε²/2`` (Bun & Steinke 2016, Prop. 1.4)."""
    epsilon = _check_epsilon(epsilon)
    return 0.5 * epsilon * epsilon


def _bs16_epsilon(rho: float, delta: float) -> float:
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks20_objective(alpha: np.ndarray, rho: float, log_inv_delta: float) -> np.ndarray:
    # ε(α) = αρ + log(1 − 1/α) + (log(1/δ) − log α)/(α − 1)     (CKS20, Prop. 12)
    return alpha * rho + np.log1p(-1.0 / alpha) + (log_inv_delta - np.log(alpha)) / (alpha - 1.0)


def _cks20_epsilon(rho: float, delta: float) -> float:
    log_inv_delta = math.log(1.0 / delta)
    # search α − 1 = e^u around the minimiser 1 + √(log(1/δ)/ρ) of the BS16 bound
    u0 = 0.5 * (math.log(log_inv_delta) - math.log(rho))
    grid = np.linspace(u0 - 12.0, u0 + 12.0, 961)
    values = _cks20_objective(1.0 + np.exp(grid), rho, log_inv_delta)
    i = int(np.nanargmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(
        lambda u: float(_cks20_objective(1.0 + np.exp(u), rho, log_inv_delta)),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-12},
    )
    best = min(float(values[i]), float(res.fun))
    return max(0.0, best)


def zcdp_to_approx(rho: float, delta: float, conversion: Conversion = "bs16") -> float:
    """ε such that a ρ-zCDP mechanism is (ε, δ)-DP.

    Parameters
    ----------
    rho : float
        The zCDP parameter ρ > 0.
    delta : float
        In ``(0, 1)``.
    conversion : {"bs16", "cks20"}
        ``"bs16"``: ``ε = ρ + 2√(ρ log(1/δ))`` (Bun & Steinke 2016, Prop. 1.3).
        ``"cks20"``: ``ε = inf_{α>1} αρ + log(1 − 1/α) − (log δ + log α)/(α − 1)`` (Canonne,
        Kamath & Steinke 2020, Prop. 12), minimised numerically over α; never larger than
        ``"bs16"``.
    """
    rho, delta = _check_rho(rho), _check_delta(delta)
    conversion = _check_conversion(conversion)
    bs16 = _bs16_epsilon(rho, delta)
    if conversion == "bs16":
        return bs16
    return min(bs16, _cks20_epsilon(rho, delta))


def approx_to_zcdp(epsilon: float, delta: float, conversion: Conversion = "bs16") -> float:
    """The largest ρ whose ρ-zCDP implies (ε, δ)-DP under ``conversion``.

    ``"bs16"`` inverts Bun & Steinke's bound in closed form,
    ``√ρ = √(log(1/δ) + ε) − √(log(1/δ))``; ``"cks20"`` inverts the tighter bound of
    :func:`zcdp_to_approx` numerically (it is increasing in ρ) and rounds down, so the returned
    ρ always satisfies ``zcdp_to_approx(ρ, δ, "cks20") ≤ ε``.
    """
    epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
    conversion = _check_conversion(conversion)
    log_inv_delta = math.log(1.0 / delta)
    # √(L + ε) − √L written without cancellation: ε / (√(L + ε) + √L)
    root = epsilon / (math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta))
    rho_bs16 = root * root
    if conversion == "bs16":
        return rho_bs16
    lo, hi = rho_bs16, 2.0 * rho_bs16
    while _cks20_epsilon(hi, delta) <= epsilon:
        lo, hi = hi, 2.0 * hi
    rho = optimize.brentq(
        lambda r: _cks20_epsilon(r, delta) - epsilon, lo, hi, xtol=1e-15, rtol=1e-13
    )
    while _cks20_epsilon(rho, delta) > epsilon:
        rho *= 1.0 - 1e-12
    return max(rho, rho_bs16)


# --------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------
def laplace_scale(epsilon: float, l1_sensitivity: float) -> float:
    """Laplace scale ``b = Δ₁/ε`` of the ε-DP Laplace mechanism (Dwork & Roth 2014, Thm 3.6).

    The same scale makes the discrete Laplace mechanism on integer queries ε-DP (Ghosh,
    Roughgarden & Sundararajan 2012; Canonne, Kamath & Steinke 2020, §5.2).
    """
    return _check_sensitivity(l1_sensitivity, "L1 sensitivity") / _check_epsilon(epsilon)


def gaussian_rho(sigma: float, l2_sensitivity: float) -> float:
    """ρ of the Gaussian mechanism: ``ρ = Δ₂²/(2σ²)`` (Bun & Steinke 2016, Prop. 1.6).

    The discrete Gaussian with the same σ on integer queries has the same ρ (Canonne, Kamath &
    Steinke 2020, Thm 4).
    """
    sigma = _check_sensitivity(sigma, "sigma")
    l2 = _check_sensitivity(l2_sensitivity, "L2 sensitivity")
    return l2 * l2 / (2.0 * sigma * sigma)


def gaussian_sigma_zcdp(rho: float, l2_sensitivity: float) -> float:
    """σ of the ρ-zCDP Gaussian mechanism: ``σ = Δ₂/√(2ρ)`` (inverse of :func:`gaussian_rho`)."""
    l2 = _check_sensitivity(l2_sensitivity, "L2 sensitivity")
    return l2 / math.sqrt(2.0 * _check_rho(rho))


def _log_analytic_delta(sigma: float, epsilon: float, l2: float) -> float:
    # Balle & Wang (2018), Thm 8:  δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), in log space
    a = l2 / (2.0 * sigma) - epsilon * sigma / l2
    b = -l2 / (2.0 * sigma) - epsilon * sigma / l2
    log_pa = float(special.log_ndtr(a))
    log_pb = epsilon + float(special.log_ndtr(b))
    if log_pb >= log_pa:
        return -math.inf
    return log_pa + math.log1p(-math.exp(log_pb - log_pa))


def analytic_gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float) -> float:
    """Smallest δ for which the Gaussian mechanism ``N(0, σ²)`` is (ε, δ)-DP.

    Balle & Wang (2018), Thm 8 (exact, the privacy profile of the Gaussian mechanism)::

        δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ)

    where Δ is the L2 sensitivity and Φ the standard normal CDF.
    """
    sigma = _check_sensitivity(sigma, "sigma")
    l2 = _check_sensitivity(l2_sensitivity, "L2 sensitivity")
    epsilon = _check_epsilon(epsilon)
    return math.exp(_log_analytic_delta(sigma, epsilon, l2))


def analytic_gaussian_epsilon(sigma: float, delta: float, l2_sensitivity: float) -> float:
    """Smallest ε for which the Gaussian mechanism is (ε, δ)-DP (inverse of
    :func:`analytic_gaussian_delta` in ε, Balle & Wang 2018, Thm 8); 0 when δ already covers
    the whole privacy loss."""
    sigma = _check_sensitivity(sigma, "sigma")
    l2 = _check_sensitivity(l2_sensitivity, "L2 sensitivity")
    delta = _check_delta(delta)
    log_delta = math.log(delta)
    if _log_analytic_delta(sigma, 0.0, l2) <= log_delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _log_analytic_delta(sigma, hi, l2) > log_delta:
        lo, hi = hi, 2.0 * hi
    eps = optimize.brentq(
        lambda e: _log_analytic_delta(sigma, e, l2) - log_delta, lo, hi, xtol=1e-14, rtol=1e-13
    )
    while _log_analytic_delta(sigma, eps, l2) > log_delta:  # round up: never under-report
        eps = eps * (1.0 + 1e-12) + 1e-300
    return eps


def gaussian_sigma_approx(
    epsilon: float,
    delta: float,
    l2_sensitivity: float,
    method: Literal["analytic", "zcdp"] = "analytic",
    conversion: Conversion = "bs16",
) -> float:
    """σ of an (ε, δ)-DP Gaussian mechanism with L2 sensitivity Δ.

    Parameters
    ----------
    epsilon, delta : float
        The target; ``ε > 0``, ``δ ∈ (0, 1)``.
    l2_sensitivity : float
        Δ₂.
    method : {"analytic", "zcdp"}
        ``"analytic"`` (default): the smallest σ with :func:`analytic_gaussian_delta` ``≤ δ``
        (the analytic Gaussian mechanism, Balle & Wang 2018, Thm 8 and Alg. 1; found by root
        finding and rounded up). ``"zcdp"``: ``σ = Δ/√(2ρ)`` with ``ρ =``
        :func:`approx_to_zcdp` ``(ε, δ, conversion)``, which is larger but also gives a zCDP
        guarantee that composes well.
    conversion : {"bs16", "cks20"}
        Used by ``method="zcdp"`` only.
    """
    epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
    l2 = _check_sensitivity(l2_sensitivity, "L2 sensitivity")
    if method == "zcdp":
        return gaussian_sigma_zcdp(approx_to_zcdp(epsilon, delta, conversion), l2)
    if method != "analytic":
        raise ValueError(f"unknown Gaussian calibration {method!r}; choose 'analytic' or 'zcdp'")
    log_delta = math.log(delta)
    # the zCDP calibration is always (ε, δ)-DP, so it brackets the answer from above
    hi = gaussian_sigma_zcdp(approx_to_zcdp(epsilon, delta, "bs16"), l2)
    lo = 0.5 * hi
    while _log_analytic_delta(lo, epsilon, l2) <= log_delta:
        lo, hi = 0.5 * lo, lo
    sigma = optimize.brentq(
        lambda s: _log_analytic_delta(s, epsilon, l2) - log_delta, lo, hi, xtol=1e-15, rtol=1e-13
    )
    while _log_analytic_delta(sigma, epsilon, l2) > log_delta:  # round up: never under-noise
        sigma *= 1.0 + 1e-12
    return sigma


# --------------------------------------------------------------------------------------------
# the ledger
# --------------------------------------------------------------------------------------------
class BudgetExceededError(RuntimeError):
    """A charge would overspend a :class:`PrivacyLedger`; nothing was charged or released.

    Attributes
    ----------
    label : str
        What the refused charge was for.
    requested, remaining
        The charge and the budget left, in the ledger's currency (a float for ``"pure"`` (ε) and
        ``"zcdp"`` (ρ) ledgers, an ``(ε, δ)`` pair for ``"approx"`` ledgers).
    """

    def __init__(self, label: str, requested: Any, remaining: Any, currency: str):
        self.label, self.requested, self.remaining, self.currency = (
            label,
            requested,
            remaining,
            currency,
        )
        unit = {"pure": "ε", "zcdp": "ρ", "approx": "(ε, δ)"}[currency]
        super().__init__(
            f"privacy budget exceeded: {label!r} costs {unit} = {_fmt(requested)} but only "
            f"{unit} = {_fmt(remaining)} is left. Nothing was charged and no noise was drawn. "
            "Spend less on this release (a smaller ε or ρ, fewer cliques) or start from a "
            "larger total budget."
        )


def _fmt(amount: Any) -> str:
    if isinstance(amount, tuple):
        return "(" + ", ".join(f"{a:.6g}" for a in amount) + ")"
    return f"{amount:.6g}"


@dataclass(frozen=True)
class LedgerEntry:
    """One debit of a :class:`PrivacyLedger`.

    Attributes
    ----------
    label : str
        What was released.
    cost : PrivacyCost
        The guarantee of the mechanism that was charged.
    charge : float or (float, float)
        ``cost`` in the ledger's currency (ε, ρ or (ε, δ)).
    details : Mapping
        Mechanism, noise scale, sensitivity, neighbouring relation, sampler, ... (read-only).
    """

    label: str
    cost: PrivacyCost
    charge: float | tuple[float, float]
    details: Mapping[str, Any] = field(default_factory=dict)


Currency = Literal["pure", "zcdp", "approx"]


class PrivacyLedger:
    """A total privacy budget that mechanisms debit, with the history of charges.

    Parameters
    ----------
    total : PureDP, ZCDP, ApproxDP or float
        The whole budget (a float means ``PureDP(epsilon)``).
    currency : {"pure", "zcdp", "approx"}, optional
        How charges compose. ``PureDP`` totals compose in ``"pure"`` ε (ε's add), ``ZCDP`` totals
        in ``"zcdp"`` ρ (ρ's add). ``ApproxDP`` totals default to ``"approx"`` (basic
        composition: ε's and δ's add) and may choose ``"zcdp"``: the (ε, δ) total is turned into
        the ρ of :func:`approx_to_zcdp` ``(ε, δ, conversion)`` and all charges compose in ρ,
        which is much cheaper for many releases and still yields (ε, δ)-DP overall.
    conversion : {"bs16", "cks20"}
        The zCDP → (ε, δ) conversion of a ``"zcdp"`` ledger with an ``ApproxDP`` total
        (see :func:`zcdp_to_approx`).

    Notes
    -----
    What each currency accepts (a mechanism may offer several equivalent guarantees; the first
    one the currency accepts is charged):

    ============  ==========  ===================  ====================
    currency      PureDP(ε)   ZCDP(ρ)              ApproxDP(ε, δ)
    ============  ==========  ===================  ====================
    ``"pure"``    ε           refused              refused
    ``"zcdp"``    ε²/2        ρ                    refused
    ``"approx"``  (ε, 0)      refused (needs a δ)  (ε, δ)
    ============  ==========  ===================  ====================

    A charge is accepted when the new total spending stays within the budget up to a relative
    floating-point slack of 1e-10 (so that, e.g., three charges of ε/3 fit into ε).

    Examples
    --------
    >>> ledger = PrivacyLedger(ZCDP(0.5))
    >>> _ = ledger.debit(PureDP(0.6), "one-way tables")     # charged ρ = 0.18
    >>> round(ledger.remaining, 6)
    0.32
    """

    def __init__(
        self,
        total: PrivacyCost | float,
        *,
        currency: Currency | None = None,
        conversion: Conversion = "bs16",
    ):
        total = _as_cost(total)
        self._conversion = _check_conversion(conversion)
        default = {PureDP: "pure", ZCDP: "zcdp", ApproxDP: "approx"}[type(total)]
        currency = default if currency is None else currency
        allowed = {PureDP: ("pure",), ZCDP: ("zcdp",), ApproxDP: ("approx", "zcdp")}[type(total)]
        if currency not in allowed:
            raise ValueError(
                f"a {type(total).__name__} total cannot be kept in currency {currency!r}; "
                f"allowed: {list(allowed)} (ρ-zCDP does not imply pure DP, and a pure budget "
                "spent in ρ would not give ε-DP)"
            )
        self._total = total
        self._currency: Currency = currency
        self._entries: list[LedgerEntry] = []
        if currency == "pure":
            self._budget: float | tuple[float, float] = total.epsilon
        elif currency == "zcdp":
            self._budget = (
                total.rho
                if isinstance(total, ZCDP)
                else approx_to_zcdp(total.epsilon, total.delta, conversion)
            )
        else:
            self._budget = (total.epsilon, total.delta)

    # -- inspection -----------------------------------------------------------------------------
    @property
    def total(self) -> PrivacyCost:
        """The total budget as given."""
        return self._total

    @property
    def currency(self) -> Currency:
        return self._currency

    @property
    def conversion(self) -> Conversion:
        return self._conversion  # type: ignore[return-value]

    @property
    def budget(self) -> float | tuple[float, float]:
        """The total in the ledger's currency (ε, ρ, or (ε, δ))."""
        return self._budget

    @property
    def history(self) -> tuple[LedgerEntry, ...]:
        """The debits so far, oldest first."""
        return tuple(self._entries)

    @property
    def spent(self) -> float | tuple[float, float]:
        """Everything debited so far, composed in the ledger's currency."""
        if self._currency == "approx":
            return (
                math.fsum(e.charge[0] for e in self._entries),  # type: ignore[index]
                math.fsum(e.charge[1] for e in self._entries),  # type: ignore[index]
            )
        return math.fsum(e.charge for e in self._entries)  # type: ignore[misc]

    @property
    def remaining(self) -> float | tuple[float, float]:
        """The budget left, in the ledger's currency (never negative)."""
        spent = self.spent
        if isinstance(spent, tuple):
            return (max(0.0, self._budget[0] - spent[0]), max(0.0, self._budget[1] - spent[1]))  # type: ignore[index]
        return max(0.0, self._budget - spent)  # type: ignore[operator]

    def guarantee(self, delta: float | None = None) -> PrivacyCost | None:
        """The privacy guarantee of everything debited so far (``None`` before any debit).

        A ``"pure"`` ledger returns ``PureDP``; a ``"zcdp"`` ledger returns ``ZCDP`` when
        ``delta`` is ``None`` and its total was a ``ZCDP``, and otherwise ``ApproxDP`` at
        ``delta`` (default: the total's δ) by the ledger's conversion; an ``"approx"`` ledger
        returns ``ApproxDP`` (basic composition), or ``PureDP`` if no charge carried a δ.
        """
        if not self._entries:
            return None
        spent = self.spent
        if self._currency == "pure":
            return PureDP(spent)  # type: ignore[arg-type]
        if self._currency == "zcdp":
            if delta is None and isinstance(self._total, ZCDP):
                return ZCDP(spent)  # type: ignore[arg-type]
            if delta is None:
                delta = self._total.delta  # type: ignore[union-attr]
            return ZCDP(spent).to_approx(delta, self._conversion)  # type: ignore[arg-type]
        eps, dlt = spent  # type: ignore[misc]
        return PureDP(eps) if dlt == 0 else ApproxDP(eps, dlt)

    # -- charging -------------------------------------------------------------------------------
    def charge_of(self, cost: PrivacyCost | float | Sequence[PrivacyCost]) -> tuple[
        PrivacyCost, float | tuple[float, float]
    ]:
        """The guarantee that would be charged for ``cost`` and its amount in this currency.

        ``cost`` may be a sequence of guarantees that the mechanism satisfies simultaneously
        (e.g. a Gaussian mechanism is both ``ApproxDP(ε, δ)`` and ``ZCDP(ρ)``); the first one this
        ledger's currency accepts is used.

        Raises
        ------
        ValueError
            if no offered guarantee can be paid in this currency (see the class notes).
        """
        options = (
            [_as_cost(c) for c in cost]
            if isinstance(cost, Sequence) and not isinstance(cost, str)
            else [_as_cost(cost)]
        )
        if not options:
            raise ValueError("no privacy cost given")
        for c in options:
            amount = self._amount(c)
            if amount is not None:
                return c, amount
        offered = ", ".join(type(c).__name__ for c in options)
        hint = {
            "pure": "a pure ε-DP budget pays only for pure ε-DP mechanisms (Laplace, discrete "
            "Laplace); use a ZCDP or ApproxDP total for Gaussian mechanisms",
            "zcdp": "a zCDP budget cannot pay for a guarantee that is only (ε, δ)-DP; give the "
            "mechanism a ZCDP(rho) budget (its zCDP guarantee) instead",
            "approx": "an (ε, δ) budget with basic composition needs a δ for every charge; give "
            "the mechanism an ApproxDP(epsilon, delta) budget, or keep the ledger in "
            "currency='zcdp'",
        }[self._currency]
        raise ValueError(
            f"cannot charge {offered} to a ledger in currency {self._currency!r}: {hint}"
        )

    def _amount(self, cost: PrivacyCost) -> float | tuple[float, float] | None:
        if self._currency == "pure":
            return cost.epsilon if isinstance(cost, PureDP) else None
        if self._currency == "zcdp":
            return None if isinstance(cost, ApproxDP) else cost.to_zcdp().rho
        if isinstance(cost, PureDP):
            return (cost.epsilon, 0.0)
        if isinstance(cost, ApproxDP):
            return (cost.epsilon, cost.delta)
        return None

    def _fits(self, amount: float | tuple[float, float]) -> bool:
        spent = self.spent
        if isinstance(amount, tuple):
            return all(
                s + a <= b * (1.0 + _ROUNDING_SLACK)
                for s, a, b in zip(spent, amount, self._budget, strict=True)  # type: ignore[arg-type]
            )
        return spent + amount <= self._budget * (1.0 + _ROUNDING_SLACK)  # type: ignore[operator]

    def can_afford(self, cost: PrivacyCost | float | Sequence[PrivacyCost]) -> bool:
        """Whether :meth:`debit` of ``cost`` would succeed."""
        try:
            _, amount = self.charge_of(cost)
        except ValueError:
            return False
        return self._fits(amount)

    def check(self, cost: PrivacyCost | float | Sequence[PrivacyCost], label: str = "release") -> (
        tuple[PrivacyCost, float | tuple[float, float]]
    ):
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit; charge nothing.

        Returns the guarantee that would be charged and its amount (see :meth:`charge_of`).
        """
        chosen, amount = self.charge_of(cost)
        if not self._fits(amount):
            raise BudgetExceededError(label, amount, self.remaining, self._currency)
        return chosen, amount

    def debit(
        self,
        cost: PrivacyCost | float | Sequence[PrivacyCost],
        label: str,
        details: Mapping[str, Any] | None = None,
    ) -> LedgerEntry:
        """Charge ``cost`` for ``label``; call it *before* drawing any noise.

        Parameters
        ----------
        cost : PrivacyCost, float or sequence of PrivacyCost
            The mechanism's guarantee(s); see :meth:`charge_of`.
        label : str
            What is released (kept in :attr:`history`).
        details : Mapping, optional
            Extra facts to keep with the entry (mechanism, scale, sensitivity, ...).

        Raises
        ------
        BudgetExceededError
            if the charge would overspend; the ledger is unchanged.
        ValueError
            if the cost cannot be paid in this ledger's currency.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("a ledger debit needs a non-empty label saying what is released")
        chosen, amount = self.check(cost, label)
        entry = LedgerEntry(label, chosen, amount, MappingProxyType(dict(details or {})))
        self._entries.append(entry)
        return entry

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(total={self._total}, currency={self._currency!r}, "
            f"spent={_fmt(self.spent)}, remaining={_fmt(self.remaining)}, "
            f"entries={len(self._entries)})"
        )

    def summary(self) -> str:
        """A plain-text table of the history with the totals."""
        unit = {"pure": "ε", "zcdp": "ρ", "approx": "(ε, δ)"}[self._currency]
        lines = [f"privacy ledger: total {self._total} (currency {self._currency}, {unit})"]
        for i, e in enumerate(self._entries):
            lines.append(f"  {i:3d}  {_fmt(e.charge):>24}  {e.label}  [{e.cost}]")
        lines.append(f"  spent {_fmt(self.spent)}, remaining {_fmt(self.remaining)}")
        return "\n".join(lines)


#: The name used in the architecture overview: a total budget with its ledger.
PrivacyBudget = PrivacyLedger
