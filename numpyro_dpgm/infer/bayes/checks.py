"""Checks after a run of :func:`~numpyro_dpgm.infer.bayes.run_nuts`: convergence and leak.

:func:`convergence_figures` computes, per scalar of the latent sites, the rank-normalised split
R-hat (the larger of the bulk and folded versions, Vehtari et al. 2021, as ArviZ reports it) and
the bulk effective sample size (NumPyro's ESS estimator on rank-normalised draws), and counts
the draws that hit NUTS's maximum tree depth and those that diverged; :func:`warn_convergence`
warns (:class:`ConvergenceWarning`) when R-hat exceeds 1.01, the bulk ESS is below 100, a draw
hit the maximum depth or a draw diverged, naming the remedy; :func:`converged` says whether a
run meets the aim that ``run_nuts(..., time_limit=…)`` draws batches for (R-hat ≤ 1.01, bulk ESS
≥ 400). :func:`warn_relaxed_leak` warns
(:class:`~numpyro_dpgm.distributions.relaxation.RelaxationWarning`) when a relaxed posterior's
mean ``θ`` makes the relaxed CGM leak more than the tolerance into near-empty cells.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from scipy.special import ndtri
from scipy.stats import rankdata

from ...distributions.relaxation import LEAK_TOLERANCE, RelaxationWarning

__all__ = [
    "ConvergenceFigures",
    "ConvergenceWarning",
    "MAX_R_HAT",
    "MIN_ESS",
    "TARGET_ESS",
    "converged",
    "convergence_figures",
    "posterior_leak",
    "warn_convergence",
    "warn_relaxed_leak",
]

#: R-hat above this warns.
MAX_R_HAT = 1.01
#: Bulk ESS below this warns.
MIN_ESS = 100.0
#: Bulk ESS that ``run_nuts(..., time_limit=…)`` draws batches for (with R-hat ≤ 1.01).
TARGET_ESS = 400.0


class ConvergenceWarning(UserWarning):
    """An MCMC run has not converged or explored its posterior well enough to be trusted."""


class ConvergenceFigures(NamedTuple):
    """The worst figures of a run over the scalars of its latent sites.

    Attributes
    ----------
    max_r_hat : float
        Largest rank-normalised split R-hat (NaN when no scalar varies).
    min_ess_bulk : float
        Smallest bulk ESS.
    worst : str
        ``"site[index]"`` of the largest R-hat.
    max_depth_hits : int
        Draws (after warm-up, all chains) that hit the maximum tree depth.
    num_draws : int
        Draws, all chains.
    divergences : int
        Draws (after warm-up, all chains) whose trajectory diverged: the energy error blew up,
        a sign of curvature the step size cannot follow, near which the draws may be biased.
    """

    max_r_hat: float
    min_ess_bulk: float
    worst: str
    max_depth_hits: int
    num_draws: int
    divergences: int = 0


def _rank_normal(x: np.ndarray) -> np.ndarray:
    """Rank-normalised draws ``Φ⁻¹((r − 3/8)/(S + 1/4))`` over all chains, per scalar."""
    chains, draws = x.shape[:2]
    flat = x.reshape(chains * draws, -1)
    ranks = rankdata(flat, axis=0, method="average")
    z = ndtri((ranks - 0.375) / (flat.shape[0] + 0.25))
    return z.reshape(x.shape)


def _rhat_ess(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank-normalised split R-hat and bulk ESS of draws ``(chains, draws, k)``."""
    const = np.ptp(x.reshape(-1, x.shape[-1]), axis=0) == 0
    z = _rank_normal(x)
    folded = _rank_normal(np.abs(x - np.median(x.reshape(-1, x.shape[-1]), axis=0)))
    with np.errstate(invalid="ignore", divide="ignore"):
        rhat = np.maximum(np.asarray(split_gelman_rubin(z)), np.asarray(split_gelman_rubin(folded)))
        ess = np.asarray(effective_sample_size(z))
    # NumPyro's estimate is S/τ̂ with τ̂ unbounded; as ArviZ (and Stan), τ̂ ≥ 1/log10(S), so the
    # ESS of antithetic draws is at most S·log10(S), never negative (τ̂ < 0 from short chains)
    cap = x.shape[0] * x.shape[1] * np.log10(x.shape[0] * x.shape[1])
    ess = np.where((ess <= 0) | (ess > cap), cap, ess)
    rhat = np.where(const, np.nan, rhat)
    ess = np.where(const, np.nan, ess)
    return rhat, ess


def convergence_figures(
    samples: dict[str, Any], sites: list[str], num_steps: Any = None, max_tree_depth: int | None
    = None, diverging: Any = None,
) -> ConvergenceFigures:
    """The worst R-hat and bulk ESS over the scalars of ``sites``, the maximum-depth hits and
    the divergences.

    Parameters
    ----------
    samples : dict
        Draws grouped by chain, ``(chains, draws, ...)`` per site.
    sites : list of str
        The sites to check (those present in ``samples``).
    num_steps : array ``(chains, draws)``, optional
        NUTS's leapfrog steps per draw.
    max_tree_depth : int, optional
    diverging : bool array ``(chains, draws)``, optional
        NUTS's ``diverging`` field.
    """
    worst, rmax, emin = "", float("nan"), float("nan")
    for name in sites:
        if name not in samples:
            continue
        x = np.asarray(samples[name], dtype=float)
        chains, draws = x.shape[:2]
        if draws < 4:
            continue
        x = x.reshape(chains, draws, -1)
        rhat, ess = _rhat_ess(x)
        if np.all(np.isnan(rhat)):
            continue
        i = int(np.nanargmax(rhat))
        if not rmax >= rhat[i]:
            rmax, worst = float(rhat[i]), f"{name}[{i}]"
        e = float(np.nanmin(ess))
        emin = e if not emin <= e else emin
    hits, total = 0, 0
    if num_steps is not None:
        steps = np.asarray(num_steps)
        total = int(steps.size)
        if max_tree_depth is not None:
            depth = np.log2(np.maximum(steps, 1)).astype(int) + 1
            hits = int(np.sum(depth >= max_tree_depth))
    divergences = 0 if diverging is None else int(np.sum(np.asarray(diverging)))
    return ConvergenceFigures(rmax, emin, worst, hits, total, divergences)


def converged(figures: ConvergenceFigures, min_ess: float = TARGET_ESS) -> bool:
    """Whether every parameter's split R-hat is at most 1.01 and its bulk ESS at least
    ``min_ess`` (false where they could not be computed)."""
    return bool(figures.max_r_hat <= MAX_R_HAT and figures.min_ess_bulk >= min_ess)


def warn_convergence(figures: ConvergenceFigures, path: str, stacklevel: int = 3) -> None:
    """Warn (:class:`ConvergenceWarning`) on R-hat > 1.01, bulk ESS < 100, maximum depth or
    divergences.

    ``path`` is ``"exact"``, ``"relaxed"`` or ``"normal"`` (the remedies differ).
    """
    problems = []
    if figures.max_r_hat > MAX_R_HAT:
        problems.append(f"the largest split R-hat is {figures.max_r_hat:.3f} ({figures.worst}), "
                        f"above {MAX_R_HAT}")
    if figures.min_ess_bulk < MIN_ESS:
        problems.append(f"the smallest bulk ESS is {figures.min_ess_bulk:.0f}, below "
                        f"{MIN_ESS:.0f}")
    if figures.max_depth_hits:
        problems.append(f"{figures.max_depth_hits} of {figures.num_draws} draws hit the maximum "
                        "tree depth")
    remedies = [_remedy(path)] if problems else []
    if figures.divergences:
        problems.append(f"{figures.divergences} of {figures.num_draws} draws diverged, so the "
                        "draws may miss or misweigh the regions of high curvature where they did")
        remedies.append("for divergences, a smaller step: target_accept_prob=0.95 (dpgm fit: "
                        "--target-accept 0.95); where they persist, compare another path")
    if not problems:
        return
    warnings.warn(f"run_nuts ({path} path): {'; '.join(problems)}. Remedy: "
                  f"{'; '.join(remedies)}.", ConvergenceWarning, stacklevel=stacklevel)


def _remedy(path: str) -> str:
    """What to do when a run of ``path`` has not converged."""
    if path == "relaxed":
        return ("run the exact path, run_nuts(..., exact=True) (NUTS on θ and exact record "
                "swaps on n, for which the joint geometry of θ and n does not pin the step "
                "size), start from the NLBP-EM estimate (init=em_start(model)), or run more "
                "warm-up and draws")
    if path == "normal":
        return ("run more warm-up and draws, start from the NLBP-EM estimate "
                "(init=em_start(model)), or compare another path: the lgamma relaxation "
                "(exact=False on a model built with relaxation='lgamma') or the exact one "
                "(exact=True)")
    if path == "collapsed":
        return ("run more warm-up and draws, start from the NLBP-EM estimate "
                "(init=em_start(model)), or compare the exact path (run_nuts(..., "
                "exact=True)), whose posterior the collapsed sampler approximates")
    return ("run more draws and warm-up (the exact path mixes slowly where the noise "
            "swamps a cell's count), more record swaps per step (gibbs_moves=, up to N), "
            "non-centred moves (interweave=), start from the NLBP-EM estimate "
            "(init=em_start(model)), or raise max_tree_depth if draws hit it")


def posterior_leak(model: Any, theta: Any) -> dict:
    """The largest leak per latent clique over releases, at the mean of draws ``theta``
    (``(draws, …, num_params)``; a batch of releases gives one mean per release)."""
    theta = np.asarray(theta)
    mean = theta.mean(axis=0)
    leaks: dict = {}
    for row in mean.reshape(-1, mean.shape[-1]):
        for c, v in model.relaxation_leak(row).items():
            leaks[c] = max(leaks.get(c, 0.0), v)
    return leaks


def warn_relaxed_leak(leak: dict, total: float, stacklevel: int = 3,
                      what: str = "run_nuts (relaxed path)") -> float:
    """Warn when the relaxed posterior's leak (per latent clique, at the posterior mean ``θ``)
    exceeds :data:`~numpyro_dpgm.distributions.relaxation.LEAK_TOLERANCE`; returns the worst."""
    clique, worst = max(leak.items(), key=lambda kv: kv[1])
    if worst > LEAK_TOLERANCE:
        warnings.warn(
            f"{what}: at the posterior mean θ the relaxed CGM moves about "
            f"{100 * worst:.1f}% of N = {total:g} records into the table of {clique} beyond "
            f"what the exact law puts there (relaxation_leak; tolerance "
            f"{100 * LEAK_TOLERANCE:g}%), so the posterior of its near-empty cells and of the "
            "parameters that read them is biased. Remedy: run_nuts(..., exact=True), or a "
            "model built with relaxed=False.", RelaxationWarning, stacklevel=stacklevel)
    return worst
