"""Sensitivity of releasing clique count tables together, and the noise it calls for.

:func:`marginal_sensitivity` gives the sensitivity of releasing the tables ``n_C`` of the
cliques ``C ∈ 𝒞`` *together* under an explicit neighbouring relation:

==================  ====================  ======================
neighbours          L1 sensitivity Δ₁      L2 sensitivity Δ₂
==================  ====================  ======================
``"add_remove"``    ``B·|𝒞|``             ``B·√|𝒞|``
``"replace_one"``   ``2·B·|𝒞|``           ``B·√(2|𝒞|)``
==================  ====================  ======================

Adding or removing one person changes each table by a non-negative vector of total mass at most
``B``, the *person bound* (1 for plain counts: one record per person); replacing a person removes
one such vector and adds another, so the L1 change per table is at most ``2B`` and the L2 change
at most ``√2·B`` (the two vectors are non-negative, so ``‖u − v‖₂² ≤ ‖u‖₁² + ‖v‖₁²``).
Summing over the ``|𝒞|`` tables gives the table above.

:func:`calibrate` turns a budget and a sensitivity into the
:data:`~numpyro_dpgm.measurements.NoiseSpec` carried by each measurement:

* ``"laplace"`` / ``"discrete_laplace"``: scale ``b = Δ₁/ε``; ε-DP (Dwork & Roth 2014, Thm 3.6;
  for the discrete version Ghosh, Roughgarden & Sundararajan 2012).
* ``"gaussian"`` / ``"discrete_gaussian"``: ``σ = Δ₂/√(2ρ)`` for a ``ZCDP(ρ)`` budget
  (Bun & Steinke 2016, Prop. 1.6; Canonne, Kamath & Steinke 2020, Thm 4 for the discrete
  Gaussian). For an ``ApproxDP(ε, δ)`` budget the continuous Gaussian is calibrated by the
  analytic Gaussian mechanism (Balle & Wang 2018, Thm 8) unless ``calibration="zcdp"``; the
  discrete Gaussian always goes through zCDP, ``ρ = approx_to_zcdp(ε, δ)``, because the analytic
  bound is proven for the continuous distribution only.

This module also checks the arguments that name a mechanism, a neighbouring relation, a noise
back end and a person bound.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal, NamedTuple

import numpy as np

from ..measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    NoiseSpec,
)
from .calibration import gaussian_rho, gaussian_sigma_approx, gaussian_sigma_zcdp, laplace_scale
from .conversions import Conversion, approx_to_zcdp, check_conversion
from .guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP

__all__ = [
    "MECHANISMS",
    "NEIGHBOURS",
    "Sensitivity",
    "marginal_sensitivity",
    "calibrate",
]

Mechanism = Literal["laplace", "gaussian", "discrete_laplace", "discrete_gaussian"]
Neighbours = Literal["add_remove", "replace_one"]
Sampler = Literal["opendp", "jax"]

MECHANISMS: tuple[str, ...] = ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian")
NEIGHBOURS: tuple[str, ...] = ("add_remove", "replace_one")
_SAMPLERS = ("opendp", "jax")


class Sensitivity(NamedTuple):
    """L1 and L2 sensitivity of releasing a set of count tables together."""

    l1: float
    l2: float


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------
def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose one of {list(MECHANISMS)}")
    return mechanism


def check_neighbours(neighbours: str) -> str:
    if neighbours == "replace":  # accepted alias
        return "replace_one"
    if neighbours not in NEIGHBOURS:
        raise ValueError(
            f"unknown neighbouring relation {neighbours!r}; choose 'add_remove' (one person "
            "added or removed; N is then private) or 'replace_one' (one person's data replaced; "
            "N is public)"
        )
    return neighbours


def check_sampler(sampler: str) -> str:
    if sampler not in _SAMPLERS:
        raise ValueError(
            f"unknown sampler {sampler!r}; choose 'opendp' (vetted, for real releases) or "
            "'jax' (seeded, for simulation studies only)"
        )
    return sampler


def check_person_bound(person_bound: Any) -> float:
    try:
        value = float(person_bound)
    except (TypeError, ValueError):
        raise TypeError(f"person_bound must be a positive number, got {person_bound!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"person_bound (the largest total weight one person adds to a table) must be a "
            f"positive finite number, got {value}"
        )
    return value


def marginal_sensitivity(
    num_cliques: int, neighbours: Neighbours = "add_remove", person_bound: float = 1.0
) -> Sensitivity:
    """Sensitivity of releasing ``num_cliques`` count tables together.

    Parameters
    ----------
    num_cliques : int
        ``|𝒞|``, the number of tables released in one go (each person appears in every table).
    neighbours : {"add_remove", "replace_one"}
        The neighbouring relation.
    person_bound : float
        ``B``: the largest total weight one person contributes to one table (1 for plain counts
        with one record per person, and for record weights normalised to ``1/K`` for a person
        with ``K`` records).

    Returns
    -------
    Sensitivity
        ``(B|𝒞|, B√|𝒞|)`` for add/remove, ``(2B|𝒞|, B√(2|𝒞|))`` for replace-one.
    """
    if isinstance(num_cliques, bool) or not isinstance(num_cliques, int | np.integer):
        raise TypeError(f"num_cliques must be an integer, got {num_cliques!r}")
    if num_cliques < 1:
        raise ValueError(f"num_cliques must be at least 1, got {num_cliques}")
    neighbours = check_neighbours(neighbours)
    b = check_person_bound(person_bound)
    k = int(num_cliques)
    if neighbours == "add_remove":
        return Sensitivity(b * k, b * math.sqrt(k))
    return Sensitivity(2.0 * b * k, b * math.sqrt(2.0 * k))


def as_budget(budget: Any) -> PrivacyCost:
    if isinstance(budget, PureDP | ZCDP | ApproxDP):
        return budget
    if isinstance(budget, numbers.Real) and not isinstance(budget, bool):
        return PureDP(float(budget))
    raise TypeError(
        "budget must be a number ε (pure DP), PureDP(epsilon), ZCDP(rho) or "
        f"ApproxDP(epsilon, delta); got {budget!r}"
    )


def calibrate(
    mechanism: Mechanism,
    budget: PrivacyCost | float,
    sensitivity: Sensitivity,
    *,
    calibration: Literal["analytic", "zcdp"] | None = None,
    conversion: Conversion = "bs16",
) -> tuple[NoiseSpec, tuple[PrivacyCost, ...]]:
    """Noise for ``mechanism`` at ``budget`` and the guarantees the resulting release satisfies.

    Parameters
    ----------
    mechanism : {"laplace", "gaussian", "discrete_laplace", "discrete_gaussian"}
    budget : float, PureDP, ZCDP or ApproxDP
        Laplace variants take ε (a number or ``PureDP``; ``ZCDP(ρ)`` is met with ``ε = √(2ρ)``,
        since ε-DP ⇒ ε²/2-zCDP). Gaussian variants take ``ZCDP(ρ)`` or ``ApproxDP(ε, δ)``.
    sensitivity : Sensitivity
        From :func:`marginal_sensitivity`.
    calibration : {"analytic", "zcdp"}, optional
        For ``ApproxDP`` budgets and the continuous Gaussian: ``"analytic"`` (default; Balle &
        Wang 2018) or ``"zcdp"`` (σ from ``ρ = approx_to_zcdp(ε, δ, conversion)``). The
        discrete Gaussian accepts only ``"zcdp"`` (its default).
    conversion : {"bs16", "cks20"}
        The (ε, δ) → ρ conversion for ``calibration="zcdp"``.

    Returns
    -------
    noise : NoiseSpec
        ``Laplace(Δ₁/ε)``, ``DiscreteLaplace(Δ₁/ε)``, ``Gaussian(σ)`` or ``DiscreteGaussian(σ)``.
    guarantees : tuple of PrivacyCost
        Every guarantee the release satisfies, most specific first (what a ledger is debited
        with; see :meth:`PrivacyLedger.charge_of`).
    """
    mechanism = check_mechanism(mechanism)
    budget = as_budget(budget)
    conversion = check_conversion(conversion)  # type: ignore[assignment]
    if not isinstance(sensitivity, Sensitivity):
        sensitivity = Sensitivity(*sensitivity)
    if calibration not in (None, "analytic", "zcdp"):
        raise ValueError(f"unknown calibration {calibration!r}; choose 'analytic' or 'zcdp'")

    if mechanism in ("laplace", "discrete_laplace"):
        if isinstance(budget, ApproxDP):
            raise ValueError(
                f"the {mechanism} mechanism is pure ε-DP: give it PureDP(epsilon) (or a number "
                "ε), or use mechanism='gaussian' for an ApproxDP(epsilon, delta) budget"
            )
        if calibration is not None:
            raise ValueError(f"calibration= applies to Gaussian mechanisms, not to {mechanism}")
        eps = budget.epsilon if isinstance(budget, PureDP) else math.sqrt(2.0 * budget.rho)
        scale = laplace_scale(eps, sensitivity.l1)
        spec: NoiseSpec = Laplace(scale) if mechanism == "laplace" else DiscreteLaplace(scale)
        return spec, (PureDP(eps),)

    discrete = mechanism == "discrete_gaussian"
    if isinstance(budget, PureDP):
        raise ValueError(
            f"the {mechanism} mechanism is not ε-DP for any finite ε: give it ZCDP(rho) or "
            "ApproxDP(epsilon, delta), or use mechanism='laplace' for a pure ε budget"
        )
    if isinstance(budget, ZCDP):
        if calibration is not None:
            raise ValueError("calibration= applies to ApproxDP budgets only; a ZCDP budget fixes σ")
        sigma = gaussian_sigma_zcdp(budget.rho, sensitivity.l2)
        spec = DiscreteGaussian(sigma) if discrete else Gaussian(sigma)
        return spec, (ZCDP(budget.rho),)
    method = calibration or ("zcdp" if discrete else "analytic")
    if discrete and method == "analytic":
        raise ValueError(
            "the analytic Gaussian calibration (Balle & Wang 2018) is proven for the continuous "
            "Gaussian only; use calibration='zcdp' (the default) for the discrete Gaussian"
        )
    if method == "zcdp":
        rho = approx_to_zcdp(budget.epsilon, budget.delta, conversion)
        sigma = gaussian_sigma_zcdp(rho, sensitivity.l2)
        spec = DiscreteGaussian(sigma) if discrete else Gaussian(sigma)
        return spec, (ZCDP(rho), budget)
    sigma = gaussian_sigma_approx(budget.epsilon, budget.delta, sensitivity.l2, "analytic")
    return Gaussian(sigma), (budget, ZCDP(gaussian_rho(sigma, sensitivity.l2)))


