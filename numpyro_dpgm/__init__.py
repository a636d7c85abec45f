"""numpyro_dpgm: differentially private learning of graphical models in NumPyro.

The package namespace is the front door: ``import numpyro_dpgm as dpgm`` gives the core types
(:class:`Domain`, :class:`MarkovNetwork`, :class:`Measurement` and its noise specs), releases
and privacy accounting (:func:`release`, :class:`PrivacyLedger`, :class:`PureDP`, ...), the
estimators (:func:`naive_mle`, :func:`prox_pgm`, :func:`cgm_em`, ...) with their
:class:`Result`, the mechanisms (:func:`mst`, :func:`aim`, :func:`mwem_pgm`), synthesis,
Rubin's rules and files; the subpackages
(``dpgm.distributions``, ``dpgm.infer``, ``dpgm.inference``, ``dpgm.estimation``,
``dpgm.mechanisms``, ``dpgm.privacy``, ``dpgm.io``, ``dpgm.metrics``) hold the rest.

Importing the package sets no global JAX flag. Enable float64 yourself
(``numpyro.enable_x64()``) before working with counts: the library warns when it runs in float32.
"""

from . import distributions, estimation, infer, inference, io, mechanisms, metrics, privacy
from ._version import __version__ as __version__
from .combining import CombinedEstimate, analyse, rubin
from .data import Dataset, count, count_file, count_spark, load_demo
from .distributions import MarkovRandomField
from .domain import Domain
from .encoding import Encoded, decode, encode, read_domain
from .estimation import (
    Result,
    cgm_em,
    learn_ising,
    learn_pairwise,
    learn_structure,
    learn_twise,
    mcem,
    naive_mle,
    posterior_mean,
    prox_pgm,
    psgd,
    variational_em,
)
from .io import (
    FileFormatError,
    load_ledger,
    load_measurements,
    load_model,
    save_ledger,
    save_measurements,
    save_model,
)
from .measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
    estimate_total,
)
from .mechanisms import aim, mst, mwem_pgm
from .network import MarkovNetwork
from .privacy import (
    ZCDP,
    ApproxDP,
    BudgetExceededError,
    PrivacyBudget,
    PrivacyLedger,
    PureDP,
    release,
    release_tables,
    simulate_release,
)
from .synthesis import synthesize
from .tables import CliqueTables

__all__ = [
    "ApproxDP",
    "BudgetExceededError",
    "CliqueTables",
    "CombinedEstimate",
    "Dataset",
    "DiscreteGaussian",
    "DiscreteLaplace",
    "Domain",
    "Encoded",
    "FileFormatError",
    "Gaussian",
    "Laplace",
    "MarkovNetwork",
    "MarkovRandomField",
    "Measurement",
    "PrivacyBudget",
    "PrivacyLedger",
    "PureDP",
    "Result",
    "ZCDP",
    "aim",
    "analyse",
    "cgm_em",
    "count",
    "count_file",
    "count_spark",
    "decode",
    "distributions",
    "encode",
    "estimate_total",
    "estimation",
    "infer",
    "inference",
    "io",
    "learn_ising",
    "learn_pairwise",
    "learn_structure",
    "learn_twise",
    "load_demo",
    "load_ledger",
    "load_measurements",
    "load_model",
    "mcem",
    "mechanisms",
    "metrics",
    "mst",
    "mwem_pgm",
    "naive_mle",
    "posterior_mean",
    "privacy",
    "prox_pgm",
    "psgd",
    "read_domain",
    "release",
    "release_tables",
    "rubin",
    "save_ledger",
    "save_measurements",
    "save_model",
    "simulate_release",
    "synthesize",
    "variational_em",
]
