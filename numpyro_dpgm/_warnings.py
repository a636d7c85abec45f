"""Warnings that point at the user's line, not at the library's own frames."""

from __future__ import annotations

import os
import warnings

__all__ = ["LIBRARY_PREFIX", "warn"]

#: Frames under this folder are the library's: a warning is attributed to the first frame
#: outside it, however many of the library's wrappers lie in between.
LIBRARY_PREFIX = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the caller's first frame outside the library.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn("careful", UserWarning)
    >>> caught[0].filename.startswith(LIBRARY_PREFIX)
    False
    """
    warnings.warn(message, category, skip_file_prefixes=(LIBRARY_PREFIX,))
