"""Marginal oracles: given log-potentials, return log Z and clique marginals."""

from .junction_tree import (
    Calibrated,
    JunctionTree,
    build_junction_tree,
    calibrate,
    log_partition,
    marginal,
    marginals,
    sample,
)

__all__ = [
    "Calibrated",
    "JunctionTree",
    "build_junction_tree",
    "calibrate",
    "log_partition",
    "marginal",
    "marginals",
    "sample",
]
