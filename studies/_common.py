"""Helpers shared by the reproductions: CSV tables, label seeds, the figure backend."""

from __future__ import annotations

import csv
import zlib
from pathlib import Path
from typing import Any

__all__ = ["label_seed", "pyplot", "write_csv"]


def write_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` as a CSV table with a header.

    Parameters
    ----------
    path : Path
        The file (replaced if it exists).
    rows : list of dict
        One dict per row; the columns are every key in the order of first appearance, and a
        row without a key leaves its cell empty.

    Examples
    --------
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "t.csv"
    >>> write_csv(path, [{"a": 1, "b": 2}, {"a": 3, "c": 4}])
    >>> print(path.read_text().replace("\\r", ""), end="")
    a,b,c
    1,2,
    3,,4
    """
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def label_seed(*parts: Any) -> int:
    """A reproducible 31-bit seed from labels (``hash`` of strings varies between runs).

    Parameters
    ----------
    *parts
        Labels with a stable ``repr`` (strings, numbers, tuples of them).

    Returns
    -------
    int
        In ``[0, 2³¹)``, the same for the same labels in every process.

    Examples
    --------
    >>> label_seed("a", 1, 0) == label_seed("a", 1, 0) != label_seed("a", 1, 1)
    True
    """
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures go to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
