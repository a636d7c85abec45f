"""Estimators from measurements: plain functions from noisy measurements (and options) to a
:class:`Result` (the learners from records are :mod:`numpyro_dpgm.learners`)."""

from ..infer.mstep import m_step
from ..infer.result import Result, answer_queries
from ..measurements import estimate_total
from ..oracles.protocol import ExactOracle, MarginalOracle
from .cgm_em import cgm_em, em_start
from .contract import ESTIMATORS
from .losses import measurement_loss
from .mcem import mcem
from .naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, naive_mle, project_simplex
from .posterior_mean import posterior_mean
from .prox_pgm import prox_pgm
from .variational_em import latent_counts_model, variational_em

__all__ = [
    "ESTIMATORS",
    "DEFAULT_L2_FLOOR",
    "ExactOracle",
    "MarginalOracle",
    "Result",
    "answer_queries",
    "cgm_em",
    "em_start",
    "default_l2",
    "estimate_total",
    "fit_mle",
    "latent_counts_model",
    "m_step",
    "mcem",
    "measurement_loss",
    "naive_mle",
    "posterior_mean",
    "project_simplex",
    "prox_pgm",
    "variational_em",
]
