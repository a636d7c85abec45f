"""Differential privacy: guarantees and their composition (:mod:`.guarantees`), conversions
between them (:mod:`.conversions`), noise calibration (:mod:`.calibration`), budgets and ledgers
(:mod:`.ledger`), sensitivity and the noise it calls for (:mod:`.sensitivity`), noise samplers
(:mod:`.samplers`), releases of clique tables (:mod:`.releases`).

Real releases draw their noise with OpenDP's vetted samplers (``sampler="opendp"``, the
default); the JAX sampler (``sampler="jax"``, :func:`simulate_release`, :func:`simulate_noise`)
is for simulation studies only.
"""

from ..measurements import estimate_total
from .calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    gaussian_rho,
    gaussian_sigma_approx,
    gaussian_sigma_zcdp,
    laplace_scale,
)
from .conversions import approx_to_zcdp, pure_to_zcdp, zcdp_to_approx
from .guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP, compose
from .ledger import BudgetExceededError, LedgerEntry, PrivacyBudget, PrivacyLedger
from .releases import (
    DEFAULT_MAX_CELLS,
    SparseTableWarning,
    check_release_size,
    release,
    release_tables,
    simulate_release,
)
from .samplers import simulate_noise
from .sensitivity import MECHANISMS, NEIGHBOURS, Sensitivity, calibrate, marginal_sensitivity

__all__ = [
    "DEFAULT_MAX_CELLS",
    "ApproxDP",
    "BudgetExceededError",
    "LedgerEntry",
    "MECHANISMS",
    "NEIGHBOURS",
    "PrivacyBudget",
    "PrivacyCost",
    "PrivacyLedger",
    "PureDP",
    "Sensitivity",
    "SparseTableWarning",
    "ZCDP",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "approx_to_zcdp",
    "calibrate",
    "check_release_size",
    "compose",
    "estimate_total",
    "gaussian_rho",
    "gaussian_sigma_approx",
    "gaussian_sigma_zcdp",
    "laplace_scale",
    "marginal_sensitivity",
    "pure_to_zcdp",
    "release",
    "release_tables",
    "simulate_noise",
    "simulate_release",
    "zcdp_to_approx",
]
