"""Noisy measurements of clique tables and the noise that produced them.

A :class:`Measurement` holds the noisy answers ``y = Q n_C + noise`` to a linear query ``Q`` of one
clique's count table (the identity by default) with the :data:`NoiseSpec` of the noise. A list of
measurements is what every estimator takes (seed 002, §2; seed 003, Problem 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .domain import Clique

__all__ = [
    "Laplace",
    "Gaussian",
    "DiscreteLaplace",
    "DiscreteGaussian",
    "NoiseSpec",
    "Measurement",
    "estimate_total",
    "measurement_list",
]


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


@dataclass(frozen=True)
class Laplace:
    """Continuous Laplace noise with scale ``b`` (density ``exp(−|z|/b)/(2b)``)."""

    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _positive("Laplace scale", self.scale))

    @property
    def variance(self) -> float:
        return 2.0 * self.scale**2


@dataclass(frozen=True)
class Gaussian:
    """Gaussian noise with standard deviation ``sigma``."""

    sigma: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _positive("Gaussian sigma", self.sigma))

    @property
    def variance(self) -> float:
        return self.sigma**2


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace (two-sided geometric) noise on integers, ``P(z) ∝ exp(−|z|/scale)``."""

    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _positive("DiscreteLaplace scale", self.scale))

    @property
    def variance(self) -> float:
        q = math.exp(-1.0 / self.scale)
        return 2.0 * q / (1.0 - q) ** 2


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian noise on integers, ``P(z) ∝ exp(−z²/(2σ²))``.

    ``variance`` is the continuous ``σ²``, an upper bound on the discrete variance.
    """

    sigma: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _positive("DiscreteGaussian sigma", self.sigma))

    @property
    def variance(self) -> float:
        return self.sigma**2


NoiseSpec = Laplace | Gaussian | DiscreteLaplace | DiscreteGaussian


@dataclass(frozen=True, eq=False)
class Measurement:
    """Noisy answers to a linear query of one clique's table.

    Parameters
    ----------
    clique : tuple of str
        The attributes whose count table ``n_C`` was measured.
    values : array, shape ``(m,)``
        ``y = Q · vec(n_C) + noise`` (``vec`` ravels the table in C order).
    noise : NoiseSpec
        Distribution of the independent noise on every entry of ``values``.
    query : array ``(m, |cells_C|)``, optional
        ``Q``; ``None`` means the identity (``values`` is the noisy table, raveled).
    """

    clique: Clique
    values: Any
    noise: NoiseSpec
    query: Any = field(default=None)

    def __post_init__(self) -> None:
        clique = (self.clique,) if isinstance(self.clique, str) else tuple(self.clique)
        object.__setattr__(self, "clique", clique)
        values = np.asarray(self.values, dtype=float).ravel()
        if not np.all(np.isfinite(values)):
            raise ValueError(f"measurement of {clique} has non-finite values")
        object.__setattr__(self, "values", values)
        if not isinstance(self.noise, Laplace | Gaussian | DiscreteLaplace | DiscreteGaussian):
            raise TypeError(f"noise must be a NoiseSpec, got {type(self.noise).__name__}")
        if self.query is not None:
            q = np.asarray(self.query, dtype=float)
            if q.ndim != 2 or q.shape[0] != values.size:
                raise ValueError(
                    f"query of {clique} has shape {q.shape}; expected ({values.size}, cells)"
                )
            object.__setattr__(self, "query", q)

    @property
    def num_cells(self) -> int:
        """Number of cells of the measured clique table ``n_C``."""
        return self.values.size if self.query is None else self.query.shape[1]

    @property
    def is_identity(self) -> bool:
        """Whether ``values`` is the noisy table itself (no query, or the identity matrix)."""
        q = self.query
        return q is None or (q.shape[0] == q.shape[1] and bool(np.array_equal(q, np.eye(len(q)))))

    def matrix(self) -> np.ndarray:
        """The query matrix ``Q`` (the identity when none was given)."""
        return np.eye(self.values.size) if self.query is None else self.query


def estimate_total(
    measurements: Sequence[Measurement],
    *,
    min_total: float = 1.0,
    return_variance: bool = False,
) -> float | tuple[float, float]:
    """Minimum-variance unbiased estimate of the number of records ``N`` from measurements.

    Every measurement whose query can express the total (``1ᵀ`` in the row space of ``Q``;
    always true for identity queries) gives the unbiased estimate ``ŵᵀy`` with
    ``ŵ = argmin{‖w‖ : Qᵀw = 1}`` (``ŵ = 1``, i.e. ``Σ y``, for an identity query) and variance
    ``v‖ŵ‖²`` (``v`` the per-answer noise variance). The estimates are combined by inverse-variance
    weighting (notes §1.3), ``N̂ = Σ_M w_M N̂_M / Σ_M w_M``, ``Var N̂ = 1/Σ_M w_M``, then clipped
    below at ``min_total`` (slightly biased upward when ``N`` is tiny compared with the noise).
    Pure post-processing: it costs no privacy. Under add/remove neighbours ``N`` itself is
    private, and this is how the library estimates it.

    Parameters
    ----------
    measurements : sequence of Measurement
    min_total : float
        Lower clip (default 1).
    return_variance : bool
        Also return ``Var N̂`` (before clipping).

    Raises
    ------
    ValueError
        When no measurement determines the total.
    """
    estimates, variances = [], []
    for m in measurements:
        if not isinstance(m, Measurement):
            raise TypeError(f"estimate_total takes Measurements, got {type(m).__name__}")
        if m.query is None:
            w = np.ones(m.values.size)
        else:
            q = m.query
            ones = np.ones(q.shape[1])
            w = np.linalg.lstsq(q.T, ones, rcond=None)[0]
            if not np.allclose(q.T @ w, ones, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(q).max())):
                continue
        estimates.append(float(w @ m.values))
        variances.append(m.noise.variance * float(w @ w))
    if not estimates:
        raise ValueError(
            "no measurement determines the number of records (an identity query of a table, or "
            "a query whose rows sum to the total, is needed); pass the total explicitly"
        )
    inv = 1.0 / np.asarray(variances)
    var = 1.0 / float(np.sum(inv))
    value = max(float(min_total), float(np.sum(inv * np.asarray(estimates))) * var)
    return (value, var) if return_variance else value


def measurement_list(measurements: Any, empty: str) -> list[Measurement]:
    """``measurements`` (one :class:`Measurement` or a sequence of them) as a non-empty list;
    ``ValueError(empty)`` when there are none, ``TypeError`` naming any entry that is not one."""
    if isinstance(measurements, Measurement):
        measurements = [measurements]
    measurements = list(measurements)
    if not measurements:
        raise ValueError(empty)
    for k, m in enumerate(measurements):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{k}] is a {type(m).__name__}, not a Measurement")
    return measurements
