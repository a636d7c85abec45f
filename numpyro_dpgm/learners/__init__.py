"""Learners from records: private learning of a model's parameters or structure from the data
itself (DP-SGD, seed 001's Frank-Wolfe regressions and parity queries), each returning a
:class:`~numpyro_dpgm.estimation.Result`, under the contract
``f(data, domain_or_network, *, budget, rng_key, ledger=None, **options)``."""

from .frank_wolfe import FrankWolfeResult, private_frank_wolfe
from .private_mrf import (
    learn_ising,
    learn_pairwise,
    learn_structure,
    learn_twise,
    pmw_parities,
    stable_mode,
)
from .psgd import UnreachableEpsilonError, calibrate_noise_multiplier, psgd

__all__ = [
    "FrankWolfeResult",
    "UnreachableEpsilonError",
    "calibrate_noise_multiplier",
    "learn_ising",
    "learn_pairwise",
    "learn_structure",
    "learn_twise",
    "pmw_parities",
    "private_frank_wolfe",
    "psgd",
    "stable_mode",
]
