"""Estimators: plain functions from measurements (and options) to a :class:`Result`."""

from .naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, naive_mle, project_simplex
from .prox_pgm import ExactOracle, MarginalOracle, answer_queries, estimate_total, prox_pgm
from .result import Result

__all__ = [
    "DEFAULT_L2_FLOOR",
    "ExactOracle",
    "MarginalOracle",
    "Result",
    "answer_queries",
    "default_l2",
    "estimate_total",
    "fit_mle",
    "naive_mle",
    "project_simplex",
    "prox_pgm",
]
