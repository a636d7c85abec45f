"""NumPyro integration: the NLBP effect handler, EM over user models, and full Bayesian
inference on the CGM (NUTS, SVI, the Laplace approximation). ArviZ helpers live in
:mod:`numpyro_dpgm.infer.diagnostics` (imported on demand: it loads ArviZ)."""

from .bayes import (
    LaplaceFit,
    NoisyMarginalsModel,
    ReferenceCoding,
    SVIFit,
    init_to_interior,
    noisy_marginals_model,
    reference_coding,
    run_laplace,
    run_nuts,
    run_svi,
)
from .em import EM, EMConvergenceWarning
from .handlers import nlbp

__all__ = [
    "EM",
    "EMConvergenceWarning",
    "NoisyMarginalsModel",
    "ReferenceCoding",
    "SVIFit",
    "LaplaceFit",
    "init_to_interior",
    "nlbp",
    "noisy_marginals_model",
    "reference_coding",
    "run_laplace",
    "run_nuts",
    "run_svi",
]
