"""Estimators: plain functions from measurements (and options) to a :class:`Result`."""

from .naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, naive_mle, project_simplex
from .result import Result

__all__ = [
    "DEFAULT_L2_FLOOR",
    "Result",
    "default_l2",
    "fit_mle",
    "naive_mle",
    "project_simplex",
]
