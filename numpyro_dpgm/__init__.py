"""numpyro_dpgm: differentially private learning of graphical models in NumPyro.

Importing the package sets no global JAX flag. Enable float64 yourself
(``numpyro.enable_x64()``) before working with counts: the library warns when it runs in float32.
"""

from .data import Dataset, count, load_demo
from .distributions import MarkovRandomField
from .domain import Domain
from .network import MarkovNetwork
from .tables import CliqueTables

__version__ = "0.1.0"

__all__ = [
    "CliqueTables",
    "Dataset",
    "Domain",
    "MarkovNetwork",
    "MarkovRandomField",
    "count",
    "load_demo",
]
