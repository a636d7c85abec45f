"""Warnings that point at the user's line, not at the library's own frames."""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable, Mapping

__all__ = ["LIBRARY_PREFIX", "SparseTableWarning", "warn", "warn_sparse_tables"]

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


class SparseTableWarning(UserWarning):
    """A table has more cells than the data have records: most cells are empty and the noise
    dominates them; coarsening an attribute usually gives a more useful release and fit."""


def warn_sparse_tables(cells: Mapping[Hashable, int], num_records: float, what: str) -> None:
    """A :class:`SparseTableWarning` for each table of ``cells`` (clique -> number of cells)
    with more cells than ``num_records``; ``what`` names the tables (e.g. "clique")."""
    for clique, size in cells.items():
        if size > num_records:
            warn(f"{what} {clique} has {size:,} cells, {size / max(num_records, 1):.3g}× the "
                 f"{num_records:,.0f} records: most of its cells are empty and the noise "
                 "dominates them; coarsening an attribute usually gives a more useful release "
                 "and fit", SparseTableWarning)
