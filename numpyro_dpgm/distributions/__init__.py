"""NumPyro distributions over records and count tables, and observation models."""

from .cgm import CollectiveGraphicalModel
from .constraints import count_tables, scaled_marginal_polytope
from .mrf import MarkovRandomField
from .noise import GaussianNoise, LaplaceNoise

__all__ = [
    "CollectiveGraphicalModel",
    "GaussianNoise",
    "LaplaceNoise",
    "MarkovRandomField",
    "count_tables",
    "scaled_marginal_polytope",
]
