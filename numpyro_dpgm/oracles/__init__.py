"""Marginal oracles: given log-potentials, return log Z and clique marginals."""

from .calibration import Calibrated, calibrate
from .gbp import GBPState, convex_gbp
from .junction_tree import (
    JunctionTree,
    build_junction_tree,
    log_partition,
    marginal,
    marginals,
    sample,
)
from .protocol import ConvexGBPOracle, ExactOracle, MarginalOracle
from .region_graph import RegionGraph, build_region_graph

__all__ = [
    "Calibrated",
    "ConvexGBPOracle",
    "ExactOracle",
    "GBPState",
    "MarginalOracle",
    "RegionGraph",
    "build_region_graph",
    "convex_gbp",
    "JunctionTree",
    "build_junction_tree",
    "calibrate",
    "log_partition",
    "marginal",
    "marginals",
    "sample",
]
