"""Conversions between pure ε-DP, ρ-zCDP and (ε, δ)-DP.

* ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4).
* ρ-zCDP ⇒ (ε, δ)-DP for every δ ∈ (0, 1), with ``conversion=``

  - ``"bs16"``: ``ε = ρ + 2√(ρ log(1/δ))`` (Bun & Steinke 2016, Prop. 1.3), the standard bound
    used by the papers this library reproduces; the default.
  - ``"cks20"``: ``ε = inf_{α>1} [ αρ + log(1 − 1/α) − (log δ + log α)/(α − 1) ]``
    (Canonne, Kamath & Steinke 2020, Prop. 12; Asoodeh et al. 2021), which is never larger
    (e.g. ε = 0.622 instead of 0.753 at ρ = 0.01, δ = 1e-6). It is the conversion OpenDP and
    ``dp-accounting`` apply to zCDP and RDP curves.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy import optimize

from ._validation import check_delta, check_epsilon, check_rho

__all__ = ["Conversion", "approx_to_zcdp", "pure_to_zcdp", "zcdp_to_approx"]

Conversion = Literal["bs16", "cks20"]
_CONVERSIONS = ("bs16", "cks20")


def check_conversion(conversion: str) -> str:
    if conversion not in _CONVERSIONS:
        raise ValueError(
            f"unknown zCDP → (ε, δ) conversion {conversion!r}; choose 'bs16' (Bun & Steinke "
            "2016, Prop. 1.3) or 'cks20' (Canonne, Kamath & Steinke 2020, Prop. 12)"
        )
    return conversion


def pure_to_zcdp(epsilon: float) -> float:
    """ρ of an ε-DP mechanism: ``ρ = ε²/2`` (Bun & Steinke 2016, Prop. 1.4)."""
    epsilon = check_epsilon(epsilon)
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
    rho, delta = check_rho(rho), check_delta(delta)
    conversion = check_conversion(conversion)
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
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    conversion = check_conversion(conversion)
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
