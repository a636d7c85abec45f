r"""Combining analyses of ``m`` fully synthetic data sets (Raghunathan, Reiter & Rubin 2003).

Each synthetic data set ``D^(j)``, drawn from its own posterior draw ``θ^(j)`` (see
:func:`numpyro_dpgm.synthesis.synthesize`), is analysed as if it were real data, giving an
estimate ``q_j`` and its variance estimate ``u_j``. With

.. math::

    \bar q = \frac1m \sum_j q_j, \qquad
    b = \frac1{m-1} \sum_j (q_j - \bar q)^2, \qquad
    \bar u = \frac1m \sum_j u_j,

the combining rules for fully synthetic data (Raghunathan, Reiter & Rubin 2003, eqs. 3–5) estimate
the quantity by ``q̄`` with variance

.. math:: T_s = (1 + 1/m)\, b - \bar u

and a Student-t reference distribution with

.. math:: ν = (m - 1)\,\Bigl(1 - \frac{\bar u}{(1 + 1/m)\, b}\Bigr)^2

degrees of freedom. ``T_s`` can be negative (small ``m``, or a posterior that barely moves
``θ``); the non-negative variant replaces it then by ``(n_syn / n) ū``, with ``n_syn`` the size
of each synthetic data set and ``n`` that of the original data (Reiter 2002, §3; the rule
twinify's NAPSU-MQ implements, Räisä et al. 2023, §3.2):

.. math:: T^* = T_s \ \text{if}\ T_s > 0, \quad \text{else}\ \frac{n_\text{syn}}{n}\, \bar u,

keeping ``ν`` as above. Räisä et al. generate ``n_syn = n`` records per data set, which
:func:`~numpyro_dpgm.synthesis.synthesize` does with ``num_records=None``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from ._warnings import warn

__all__ = ["CombinedEstimate", "CombiningWarning", "analyse", "rubin", "normal_interval"]

#: Degrees of freedom below which a t interval is too wide to mean anything (the 97.5 %
#: quantile of t is 4.3 at ν = 2, 12.7 at ν = 1 and 1e149 at ν = 0.003).
MIN_DF = 2.0


class CombiningWarning(UserWarning):
    """The combined variance or its degrees of freedom make the interval unreliable."""


class CombinedEstimate(NamedTuple):
    """Result of :func:`rubin`; arrays have the shape of one estimate (scalar or vector).

    Attributes
    ----------
    estimate : ``q̄``
    variance : ``T*`` (non-negative variant) or ``T_s``
    df : ``ν`` (``inf`` when ``b = 0``: the normal reference)
    between : ``b``
    within : ``ū``
    num_datasets : ``m``
    adjusted : bool array, where ``T_s ≤ 0`` was replaced by ``(n_syn / n) ū``
    """

    estimate: Any
    variance: Any
    df: Any
    between: Any
    within: Any
    num_datasets: int
    adjusted: Any

    @property
    def std_error(self) -> Any:
        return np.sqrt(self.variance)

    def conf_int(self, level: float = 0.95) -> tuple[Any, Any]:
        """Equal-tailed interval ``q̄ ± t_ν((1 + level)/2) √T`` of the given confidence level.

        Raises
        ------
        ValueError
            when the variance is not positive (``T_s ≤ 0`` with ``nonnegative=False``).
        """
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        var = np.asarray(self.variance, dtype=float)
        if np.any(~(var > 0)):
            raise ValueError(
                "the combined variance T_s = (1 + 1/m) b - ū is not positive; use "
                "rubin(..., nonnegative=True) or more synthetic data sets"
            )
        half = stats.t.ppf(0.5 + level / 2, self.df) * np.sqrt(var)
        return self.estimate - half, self.estimate + half


def rubin(
    estimates: Iterable[Any],
    variances: Iterable[Any],
    *,
    nonnegative: bool = True,
    size_ratio: float = 1.0,
) -> CombinedEstimate:
    """Combine ``m`` analyses of fully synthetic data sets (see the module notes).

    Parameters
    ----------
    estimates : array ``(m,)`` or ``(m, k)``
        ``q_j``, one row per synthetic data set (``k`` quantities are combined separately).
    variances : array like ``estimates``
        ``u_j``, the analysis' variance estimate of ``q_j`` (squared standard error).
    nonnegative : bool
        Replace a non-positive ``T_s`` by ``size_ratio · ū`` (Reiter 2002; NAPSU-MQ).
    size_ratio : float
        ``n_syn / n``: records per synthetic data set over records of the original data.

    Returns
    -------
    CombinedEstimate
        With :meth:`~CombinedEstimate.conf_int`.
    """
    q = np.asarray(list(estimates) if not hasattr(estimates, "shape") else estimates, float)
    u = np.asarray(list(variances) if not hasattr(variances, "shape") else variances, float)
    if q.shape != u.shape:
        raise ValueError(f"estimates {q.shape} and variances {u.shape} must have the same shape")
    if q.ndim not in (1, 2):
        raise ValueError(f"estimates must have shape (m,) or (m, k), got {q.shape}")
    m = q.shape[0]
    if m < 2:
        raise ValueError(f"the combining rules need at least 2 synthetic data sets, got {m}")
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(u))):
        raise ValueError("estimates and variances must be finite (drop failed analyses first)")
    if np.any(u < 0):
        raise ValueError("variances must be non-negative")
    if not (np.isfinite(size_ratio) and size_ratio > 0):
        raise ValueError(f"size_ratio = n_syn / n must be positive, got {size_ratio}")
    q_bar = q.mean(axis=0)
    b = q.var(axis=0, ddof=1)
    u_bar = u.mean(axis=0)
    inflated = (1 + 1 / m) * b
    t_s = inflated - u_bar
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(inflated > 0, (m - 1) * (1 - u_bar / inflated) ** 2, np.inf)
    adjusted = (t_s <= 0) & nonnegative
    variance = np.where(adjusted, size_ratio * u_bar, t_s)
    _warn_if_unreliable(m, np.atleast_1d(df), np.atleast_1d(t_s), np.atleast_1d(adjusted))
    scalar = q.ndim == 1
    pick = (lambda v: v.item() if np.ndim(v) == 0 else v) if scalar else (lambda v: v)
    return CombinedEstimate(pick(q_bar), pick(variance), pick(df), pick(b), pick(u_bar), m,
                            pick(adjusted))


def _warn_if_unreliable(m: int, df: np.ndarray, t_s: np.ndarray, adjusted: np.ndarray) -> None:
    """A :class:`CombiningWarning` where an interval from these figures would mislead."""
    few = np.isfinite(df) & (df < MIN_DF)
    if np.any(few):
        warn(
            f"{int(few.sum())} of {df.size} combined estimate(s) have ν < {MIN_DF:g} degrees of "
            f"freedom (smallest {float(df[few].min()):.3g}): the between-data-set variance b "
            "barely exceeds the within variance ū, and a t interval is meaninglessly wide; use "
            f"more synthetic data sets than m = {m}", CombiningWarning)
    if np.any(adjusted):
        warn(
            f"{int(adjusted.sum())} of {t_s.size} combined estimate(s) have T_s ≤ 0 and use "
            "(n_syn / n)·ū instead (Reiter 2002), which leaves out the synthesis uncertainty; "
            f"use more synthetic data sets than m = {m}", CombiningWarning)


def normal_interval(estimate: Any, variance: Any, level: float = 0.95) -> tuple[Any, Any]:
    """The naive interval ``q ± z((1 + level)/2) √u`` of one data set's analysis."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    half = stats.norm.ppf(0.5 + level / 2) * np.sqrt(np.asarray(variance, float))
    return np.asarray(estimate) - half, np.asarray(estimate) + half


def analyse(
    datasets: Iterable[Any],
    fn: Callable[[Any], tuple[Any, Any]],
    **rubin_options: Any,
) -> CombinedEstimate:
    """Apply an analysis to every synthetic data set and combine with :func:`rubin`.

    Parameters
    ----------
    datasets : iterable of data sets (e.g. the DataFrames of
        :func:`~numpyro_dpgm.synthesis.synthesize`)
    fn : callable ``data set -> (estimate, variance)``
        The user's analysis; the estimate is a number or a vector (e.g. regression
        coefficients, with their squared standard errors as variances).
    **rubin_options
        ``nonnegative``, ``size_ratio``. Without ``size_ratio``, data sets that carry the
        release's number of records (``df.attrs["total_count"]``, set by
        :func:`~numpyro_dpgm.synthesis.synthesize` from a posterior) give
        ``size_ratio = len(df) / total_count``.

    Examples
    --------
    Four synthetic data sets of 100 records (here written by hand):

    >>> import pandas as pd
    >>> frames = [pd.DataFrame({"sex": ["Female"] * k + ["Male"] * (100 - k)})
    ...           for k in (30, 52, 66, 45)]
    >>> def share_of_women(df):
    ...     p = (df["sex"] == "Female").mean()
    ...     return p, p * (1 - p) / len(df)
    >>> fit = analyse(frames, share_of_women)
    >>> round(float(fit.estimate), 4), round(float(fit.std_error), 4), round(float(fit.df), 2)
    (0.4825, 0.1603, 2.52)
    >>> [round(float(v), 3) for v in fit.conf_int(0.9)]
    [0.074, 0.891]

    Four data sets leave few degrees of freedom; with data sets that barely differ (``ν < 2``)
    :func:`rubin` warns that the interval means little (:class:`CombiningWarning`).
    """
    datasets = list(datasets)
    if "size_ratio" not in rubin_options:
        ratio = _size_ratio(datasets)
        if ratio is not None:
            rubin_options = dict(rubin_options, size_ratio=ratio)
    results = [fn(d) for d in datasets]
    for i, r in enumerate(results):
        if not (isinstance(r, tuple) and len(r) == 2):
            raise TypeError(
                f"the analysis must return (estimate, variance); data set {i} gave {r!r}"
            )
    q = np.asarray([np.asarray(r[0], float) for r in results])
    u = np.asarray([np.asarray(r[1], float) for r in results])
    return rubin(q, u, **rubin_options)


def _size_ratio(datasets: list[Any]) -> float | None:
    """``n_syn / N`` from data sets that carry ``attrs["total_count"]`` (all of them, one ratio),
    else ``None``."""
    ratios = set()
    for d in datasets:
        total = getattr(d, "attrs", {}).get("total_count")
        if total is None or not hasattr(d, "__len__"):
            return None
        ratios.add(len(d) / float(total))
    if len(ratios) != 1:
        return None
    return ratios.pop()
