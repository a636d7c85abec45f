"""Calibration: the noise scale of the Laplace and Gaussian mechanisms for a privacy target.

The Laplace mechanism with scale ``b = Δ₁/ε`` is ε-DP (Dwork & Roth 2014, Thm 3.6); the Gaussian
mechanism with standard deviation ``σ`` is ``Δ₂²/(2σ²)``-zCDP (Bun & Steinke 2016, Prop. 1.6),
and (ε, δ)-DP exactly when the analytic condition of Balle & Wang (2018, Thm 8) holds
(:func:`analytic_gaussian_delta`).
"""

from __future__ import annotations

import math
from typing import Literal

from scipy import optimize, special

from ._validation import check_delta, check_epsilon, check_rho, check_sensitivity
from .conversions import Conversion, approx_to_zcdp

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "gaussian_rho",
    "gaussian_sigma_approx",
    "gaussian_sigma_zcdp",
    "laplace_scale",
]


def laplace_scale(epsilon: float, l1_sensitivity: float) -> float:
    """Laplace scale ``b = Δ₁/ε`` of the ε-DP Laplace mechanism (Dwork & Roth 2014, Thm 3.6).

    The same scale makes the discrete Laplace mechanism on integer queries ε-DP (Ghosh,
    Roughgarden & Sundararajan 2012; Canonne, Kamath & Steinke 2020, §5.2).
    """
    return check_sensitivity(l1_sensitivity, "L1 sensitivity") / check_epsilon(epsilon)


def gaussian_rho(sigma: float, l2_sensitivity: float) -> float:
    """ρ of the Gaussian mechanism: ``ρ = Δ₂²/(2σ²)`` (Bun & Steinke 2016, Prop. 1.6).

    The discrete Gaussian with the same σ on integer queries has the same ρ (Canonne, Kamath &
    Steinke 2020, Thm 4).
    """
    sigma = check_sensitivity(sigma, "sigma")
    l2 = check_sensitivity(l2_sensitivity, "L2 sensitivity")
    return l2 * l2 / (2.0 * sigma * sigma)


def gaussian_sigma_zcdp(rho: float, l2_sensitivity: float) -> float:
    """σ of the ρ-zCDP Gaussian mechanism: ``σ = Δ₂/√(2ρ)`` (inverse of :func:`gaussian_rho`)."""
    l2 = check_sensitivity(l2_sensitivity, "L2 sensitivity")
    return l2 / math.sqrt(2.0 * check_rho(rho))


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
    sigma = check_sensitivity(sigma, "sigma")
    l2 = check_sensitivity(l2_sensitivity, "L2 sensitivity")
    epsilon = check_epsilon(epsilon)
    return math.exp(_log_analytic_delta(sigma, epsilon, l2))


def analytic_gaussian_epsilon(sigma: float, delta: float, l2_sensitivity: float) -> float:
    """Smallest ε for which the Gaussian mechanism is (ε, δ)-DP (inverse of
    :func:`analytic_gaussian_delta` in ε, Balle & Wang 2018, Thm 8); 0 when δ already covers
    the whole privacy loss."""
    sigma = check_sensitivity(sigma, "sigma")
    l2 = check_sensitivity(l2_sensitivity, "L2 sensitivity")
    delta = check_delta(delta)
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
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    l2 = check_sensitivity(l2_sensitivity, "L2 sensitivity")
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
