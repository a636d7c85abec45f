"""Validation of privacy parameters: ε, ρ, δ and sensitivities, with messages that say why."""

from __future__ import annotations

import math
from typing import Any


def check_epsilon(epsilon: Any, what: str = "epsilon") -> float:
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


def check_rho(rho: Any) -> float:
    try:
        value = float(rho)
    except (TypeError, ValueError):
        raise TypeError(f"rho must be a positive number, got {rho!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"rho (zCDP) must be a positive finite number, got {value}")
    return value


def check_delta(delta: Any) -> float:
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


def check_sensitivity(value: Any, what: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a positive number, got {value!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number, got {value}")
    return value
