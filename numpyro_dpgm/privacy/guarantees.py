"""Privacy guarantees: pure ε-DP, ρ-zCDP and (ε, δ)-DP, and their composition.

Three kinds of privacy guarantee (:data:`PrivacyCost`) appear in this library:

* :class:`PureDP` ``(ε)``: ``P[M(X) ∈ S] ≤ e^ε P[M(X') ∈ S]`` for all neighbouring ``X, X'``.
* :class:`ZCDP` ``(ρ)``: zero-concentrated DP (Bun & Steinke 2016, Def. 1.1),
  ``D_α(M(X) ‖ M(X')) ≤ ρ α`` for every Rényi order ``α > 1``.
* :class:`ApproxDP` ``(ε, δ)``: ``P[M(X) ∈ S] ≤ e^ε P[M(X') ∈ S] + δ``.

Composition (adaptive, :func:`compose`): pure ε's add; zCDP ρ's add (Bun & Steinke 2016,
Lemma 2.3); (ε, δ) pairs add component-wise (basic composition, Dwork & Roth 2014, Thm 3.16).
Conversions between the three are in :mod:`.conversions`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._validation import check_delta, check_epsilon, check_rho
from .conversions import Conversion, pure_to_zcdp, zcdp_to_approx

__all__ = ["ApproxDP", "PrivacyCost", "PureDP", "ZCDP", "compose"]


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
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def to_zcdp(self) -> ZCDP:
        """``ε``-DP ⇒ ``ε²/2``-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        return ZCDP(pure_to_zcdp(self.epsilon))

    def to_approx(self, delta: float, conversion: Conversion = "bs16") -> ApproxDP:
        """The (ε', δ) guarantee ``ε' = min(ε, ε_conv(ε²/2, δ))``; ε-DP is (ε, δ)-DP for any δ."""
        delta = check_delta(delta)
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
        object.__setattr__(self, "rho", check_rho(self.rho))

    def to_zcdp(self) -> ZCDP:
        return self

    def to_approx(self, delta: float, conversion: Conversion = "bs16") -> ApproxDP:
        """The (ε, δ)-DP guarantee implied at ``delta`` (see :func:`zcdp_to_approx`)."""
        delta = check_delta(delta)
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
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta))

    def to_zcdp(self) -> ZCDP:
        raise ValueError(
            "an (ε, δ)-DP guarantee implies no zCDP bound; account the mechanism by its zCDP "
            "guarantee (e.g. ZCDP(rho) for the Gaussian mechanism) instead"
        )

    def to_approx(self, delta: float | None = None, conversion: Conversion = "bs16") -> ApproxDP:
        if delta is not None and check_delta(delta) < self.delta:
            raise ValueError(
                f"an ({self.epsilon}, {self.delta})-DP guarantee says nothing at δ = {delta} "
                f"< {self.delta}"
            )
        return self if delta is None else ApproxDP(self.epsilon, delta)


PrivacyCost = PureDP | ZCDP | ApproxDP


def as_cost(cost: Any) -> PrivacyCost:
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
    items = [as_cost(c) for c in costs]
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
