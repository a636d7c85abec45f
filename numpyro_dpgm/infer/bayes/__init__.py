"""Full Bayesian inference on the relaxed collective graphical model: priors, models, NUTS, SVI.

The model of a private release (:mod:`.model`) puts a Normal prior on the reference-coded
parameters of :mod:`.coding` (the gauge), has the latent clique counts follow the relaxed CGM and
the released tables their noise; :mod:`.nuts` and :mod:`.svi` fit it from the interior starting
points of :mod:`.initialization`; :mod:`.labels` names the cells of a network's flat layout.
"""

from .coding import ReferenceCoding, reference_coding
from .initialization import init_to_interior
from .labels import cell_labels
from .model import NoisyMarginalsModel, noisy_marginals_model
from .nuts import run_nuts
from .svi import SVIFit, run_svi

__all__ = [
    "NoisyMarginalsModel",
    "ReferenceCoding",
    "SVIFit",
    "cell_labels",
    "init_to_interior",
    "noisy_marginals_model",
    "reference_coding",
    "run_nuts",
    "run_svi",
]
