"""Empirical privacy audit of the Laplace release of a clique table.

Neighbouring data sets (add/remove one record): ``D`` holds 5 records, ``D' = D`` minus the
record ``(a=1, b=1)``. Each run releases the table of clique ``(a, b)`` of one of them with
:func:`numpyro_dpgm.privacy.release` (OpenDP's Laplace sampler, the real mechanism) and the
auditor sees the noisy cell ``y = ñ(1, 1)``. The test guesses ``D'`` when ``y < t`` with the
threshold ``t = n(1, 1) − 1`` fixed in advance; for the Laplace mechanism every threshold
``t ≤ n − 1`` is a likelihood-ratio test with ratio exactly ``e^ε``, so the test is optimal.

For any ε-DP mechanism and any test, ``TPR ≤ e^ε · FPR``. With one-sided Clopper–Pearson
bounds at level ``1 − α`` (``TPR`` from below, ``FPR`` from above), ``ε_lb = log(TPR_lo /
FPR_hi)`` is a lower bound on the mechanism's ε with confidence at least ``1 − 2α``.

OpenDP's sampler cannot be seeded, so the runs are random: ``α = 5e-4`` makes a spurious
failure of the first test (``ε_lb > ε``) a chance below 1e-3. The power check releases with
half the calibrated scale (the budget 2ε spent, ε claimed) and must find ``ε_lb > ε``: at
800 runs per data set its expected ``ε_lb`` is about 1.5 with a standard deviation of about
0.14 (normal approximation; a miss is a 3.8-sigma event). At the claimed scale the expected
``ε_lb`` is about 0.66 (sd 0.08), asserted above 0.3 so that the audit is not vacuous. One
release takes about 10 ms on a loaded 2-core machine (load average 19), so the 3,200 releases
take about 30 s.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from numpyro_dpgm import Domain
from numpyro_dpgm.privacy import release

DOMAIN = Domain({"a": 2, "b": 2})
D = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [1, 1]])
D_PRIME = D[:-1]  # one record (a=1, b=1) removed: add/remove neighbours
CELL = 3  # (a=1, b=1) in the raveled table
EPSILON = 1.0
ALPHA = 5e-4
RUNS = 800  # per data set, for the claim
POWER_RUNS = 800  # per data set, for the under-noised release


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided ``1 − alpha`` Clopper–Pearson bounds (lower, upper) on a binomial rate."""
    lo = 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))
    return lo, hi


def _noisy_cells(data: np.ndarray, budget: float, runs: int) -> np.ndarray:
    return np.array([release(data, [("a", "b")], budget, domain=DOMAIN)[0].values[CELL]
                     for _ in range(runs)])


def epsilon_lower_bound(budget: float, runs: int) -> tuple[float, float, float]:
    """``(ε_lb, TPR, FPR)`` of the threshold test on ``runs`` releases of each data set."""
    t = float(D[:, 0] @ D[:, 1]) - 1.0  # n(1, 1) − 1 = the cell's count in D'
    fpr_k = int(np.sum(_noisy_cells(D, budget, runs) < t))  # guessed D' on D
    tpr_k = int(np.sum(_noisy_cells(D_PRIME, budget, runs) < t))  # guessed D' on D'
    tpr_lo, _ = _clopper_pearson(tpr_k, runs, ALPHA)
    _, fpr_hi = _clopper_pearson(fpr_k, runs, ALPHA)
    return math.log(tpr_lo / fpr_hi), tpr_k / runs, fpr_k / runs


def test_clopper_pearson_bounds() -> None:
    """Against closed forms: k = 0 gives 1 − α^{1/n}; k = n gives α^{1/n}."""
    lo, hi = _clopper_pearson(0, 50, 0.01)
    assert lo == 0.0 and math.isclose(hi, 1 - 0.01 ** (1 / 50), rel_tol=1e-10)
    lo, hi = _clopper_pearson(50, 50, 0.01)
    assert hi == 1.0 and math.isclose(lo, 0.01 ** (1 / 50), rel_tol=1e-10)


def test_laplace_release_audit() -> None:
    """The real release keeps its claim; a half-scale release is caught violating it."""
    eps_lb, tpr, fpr = epsilon_lower_bound(EPSILON, RUNS)
    # expected rates: TPR = 1/2, FPR = e^{-ε}/2 ≈ 0.184
    assert abs(tpr - 0.5) < 0.07 and abs(fpr - 0.5 * math.exp(-EPSILON)) < 0.06
    assert eps_lb <= EPSILON, f"audit found eps >= {eps_lb:.3f} > claimed {EPSILON}"
    assert eps_lb > 0.3  # the audit is not vacuous at the claimed scale
    # under-noised: the budget 2ε is spent (scale 1/(2ε)) while ε is claimed
    eps_lb_bad, _, _ = epsilon_lower_bound(2 * EPSILON, POWER_RUNS)
    assert eps_lb_bad > EPSILON, f"the audit missed a half-scale release (eps_lb={eps_lb_bad})"
    print(f"eps_lb = {eps_lb:.3f} (claimed {EPSILON}, {RUNS} runs per data set); "
          f"half scale: eps_lb = {eps_lb_bad:.3f} ({POWER_RUNS} runs per data set)")
