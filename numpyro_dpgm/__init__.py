"""numpyro_dpgm: differentially private learning of graphical models in NumPyro.

Importing the package sets no global JAX flag. Enable float64 yourself
(``numpyro.enable_x64()``) before working with counts: the library warns when it runs in float32.
"""

from ._version import __version__ as __version__
from .combining import CombinedEstimate, analyse, rubin
from .data import Dataset, count, count_file, count_spark, load_demo
from .distributions import MarkovRandomField
from .domain import Domain
from .encoding import Encoded, decode, encode, read_domain
from .io import (
    FileFormatError,
    load_ledger,
    load_measurements,
    load_model,
    save_ledger,
    save_measurements,
    save_model,
)
from .network import MarkovNetwork
from .synthesis import synthesize
from .tables import CliqueTables

__all__ = [
    "CliqueTables",
    "CombinedEstimate",
    "Dataset",
    "Domain",
    "Encoded",
    "FileFormatError",
    "MarkovNetwork",
    "MarkovRandomField",
    "analyse",
    "count",
    "count_file",
    "count_spark",
    "decode",
    "encode",
    "load_demo",
    "load_ledger",
    "load_measurements",
    "load_model",
    "read_domain",
    "rubin",
    "save_ledger",
    "save_measurements",
    "save_model",
    "synthesize",
]
