"""Full Bayesian inference on the collective graphical model: priors, models, NUTS, SVI.

The model of a private release (:mod:`.model`) puts a Normal prior on the reference-coded
parameters of :mod:`.coding` (the gauge) or on the junction tree's conditional log odds of
:mod:`.conditional`, has the latent clique counts follow the CGM (relaxed or
exact) and the released tables their noise; :mod:`.nuts` (on the path :mod:`.paths` picks) and
:mod:`.svi` fit it from the interior starting points of :mod:`.initialization`. On the exact
path :mod:`.gibbs` runs NUTS within Gibbs with the record swaps of :mod:`.records` (and the
optional non-centred moves of :mod:`.interweave`); :mod:`.checks` warns on poor convergence and
on leaky relaxed posteriors, and :mod:`.extend` draws further batches until a run has converged;
:mod:`.labels` names the cells of a network's flat layout. A model of your own with exact CGM
sites runs :class:`.count_gibbs.CGMGibbs` (record moves within Gibbs, sites found by
:mod:`.count_sites`), or on large releases the :class:`.collapse.collapse` handler (the tables
integrated out of the update of the model's own parameters; the library's model takes the
same path);
:mod:`.laplace` is the fast approximate path, a Laplace approximation of that collapsed posterior.
:mod:`.dirichlet_prior` is a Dirichlet prior on the conditional log odds whose concentration
the release chooses.
"""

from .checks import ConvergenceWarning
from .coding import ReferenceCoding, reference_coding
from .collapse import collapse, collapse_kernel, collapse_plan
from .conditional import ConditionalCoding, conditional_coding
from .count_gibbs import CGMGibbs, RecordMoves
from .count_sites import CountSiteError, count_layout
from .dirichlet_prior import Concentration, ConditionalDirichlet, concentration_from_release
from .gibbs import exact_gibbs_fn, exact_kernel
from .initialization import init_to_interior
from .labels import cell_labels
from .laplace import LaplaceFit, run_laplace
from .model import NoisyMarginalsModel, noisy_marginals_model
from .nuts import run_nuts
from .relax import relax
from .svi import SVIFit, run_svi

__all__ = [
    "CGMGibbs",
    "Concentration",
    "ConditionalDirichlet",
    "CountSiteError",
    "LaplaceFit",
    "RecordMoves",
    "count_layout",
    "ConditionalCoding",
    "ConvergenceWarning",
    "NoisyMarginalsModel",
    "ReferenceCoding",
    "SVIFit",
    "cell_labels",
    "collapse",
    "collapse_kernel",
    "collapse_plan",
    "concentration_from_release",
    "conditional_coding",
    "exact_gibbs_fn",
    "exact_kernel",
    "init_to_interior",
    "noisy_marginals_model",
    "reference_coding",
    "relax",
    "run_laplace",
    "run_nuts",
    "run_svi",
]
