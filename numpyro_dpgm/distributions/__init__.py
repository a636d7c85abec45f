"""NumPyro distributions over records and count tables."""

from .mrf import MarkovRandomField

__all__ = ["MarkovRandomField"]
