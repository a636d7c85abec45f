"""NumPyro distributions over records and count tables, and observation models."""

from .cgm import CollectiveGraphicalModel
from .constraints import count_tables, scaled_marginal_polytope
from .mrf import MarkovRandomField
from .noise import (
    DiscreteGaussianNoise,
    DiscreteLaplaceNoise,
    GaussianNoise,
    LaplaceNoise,
    noise_model,
)

__all__ = [
    "CollectiveGraphicalModel",
    "DiscreteGaussianNoise",
    "DiscreteLaplaceNoise",
    "GaussianNoise",
    "LaplaceNoise",
    "MarkovRandomField",
    "count_tables",
    "noise_model",
    "scaled_marginal_polytope",
]
