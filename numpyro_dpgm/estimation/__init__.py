"""Estimators: plain functions from measurements (and options) to a :class:`Result`."""

from ..measurements import estimate_total
from .cgm_em import cgm_em, m_step
from .losses import measurement_loss
from .naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, naive_mle, project_simplex
from .prox_pgm import ExactOracle, MarginalOracle, answer_queries, prox_pgm
from .result import Result

__all__ = [
    "DEFAULT_L2_FLOOR",
    "ExactOracle",
    "MarginalOracle",
    "Result",
    "answer_queries",
    "cgm_em",
    "default_l2",
    "estimate_total",
    "fit_mle",
    "m_step",
    "measurement_loss",
    "naive_mle",
    "project_simplex",
    "prox_pgm",
]
