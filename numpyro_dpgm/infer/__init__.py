"""NumPyro integration: the NLBP effect handler and EM over user models."""

from .em import EM, EMResult
from .handlers import nlbp

__all__ = ["EM", "EMResult", "nlbp"]
