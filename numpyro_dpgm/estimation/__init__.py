"""Estimators: plain functions from measurements (and options) to a :class:`Result`."""

from ..infer.mstep import m_step
from ..inference.oracles import ExactOracle, MarginalOracle
from ..measurements import estimate_total
from .cgm_em import cgm_em, em_start
from .contract import ESTIMATORS
from .frank_wolfe import FrankWolfeResult, private_frank_wolfe
from .losses import measurement_loss
from .mcem import mcem
from .naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, naive_mle, project_simplex
from .posterior_mean import posterior_mean
from .private_mrf import (
    learn_ising,
    learn_pairwise,
    learn_structure,
    learn_twise,
    pmw_parities,
    stable_mode,
)
from .prox_pgm import answer_queries, prox_pgm
from .psgd import UnreachableEpsilonError, calibrate_noise_multiplier, psgd
from .result import Result
from .variational_em import latent_counts_model, variational_em

__all__ = [
    "ESTIMATORS",
    "DEFAULT_L2_FLOOR",
    "ExactOracle",
    "FrankWolfeResult",
    "MarginalOracle",
    "Result",
    "UnreachableEpsilonError",
    "answer_queries",
    "calibrate_noise_multiplier",
    "cgm_em",
    "em_start",
    "default_l2",
    "estimate_total",
    "fit_mle",
    "learn_ising",
    "learn_pairwise",
    "learn_structure",
    "learn_twise",
    "latent_counts_model",
    "m_step",
    "mcem",
    "measurement_loss",
    "naive_mle",
    "pmw_parities",
    "posterior_mean",
    "private_frank_wolfe",
    "project_simplex",
    "prox_pgm",
    "psgd",
    "stable_mode",
    "variational_em",
]
