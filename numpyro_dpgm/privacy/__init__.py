"""Differential privacy: guarantees and their composition (:mod:`.guarantees`), conversions
between them (:mod:`.conversions`), noise calibration (:mod:`.calibration`), budgets and ledgers
(:mod:`.ledger`), releases of clique tables (:mod:`.mechanisms`).

Real releases draw their noise with OpenDP's vetted samplers (``sampler="opendp"``, the
default); the JAX sampler (``sampler="jax"``, :func:`simulate_release`, :func:`simulate_noise`)
is for simulation studies only.
"""

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
from .mechanisms import (
    MECHANISMS,
    NEIGHBOURS,
    Sensitivity,
    calibrate,
    estimate_total,
    marginal_sensitivity,
    release,
    release_tables,
    simulate_noise,
    simulate_release,
)

__all__ = [
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
    "ZCDP",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "approx_to_zcdp",
    "calibrate",
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
