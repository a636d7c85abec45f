"""Counting contingency tables, and the bundled demo data.

:func:`count` turns records (a numpy array of integer codes in domain order, or a pandas
DataFrame with one column per attribute) into clique count tables
``n_C(i_C) = Σ_m w_m · 1[x^m_C = i_C]`` (seed 002, §2). Every code is validated against the domain:
an out-of-range, negative, non-integer or missing value is an error naming the column, never a
silently dropped record.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from .domain import Domain
from .tables import CliqueTables

__all__ = ["count", "records_to_array", "Dataset", "load_demo"]


def _column(records: Any, attr: str, domain: Domain) -> np.ndarray:
    if isinstance(records, pd.DataFrame):
        if attr not in records.columns:
            raise KeyError(
                f"records have no column {attr!r} (needed by a clique); columns: "
                f"{list(records.columns)}"
            )
        col = records[attr]
        if isinstance(col.dtype, pd.CategoricalDtype):
            col = col.cat.codes.where(col.notna(), np.nan)
        try:
            values = col.to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError):
            raise TypeError(
                f"column {attr!r} has dtype {col.dtype} with non-numeric values; expected integer "
                f"codes 0..{domain[attr] - 1} (a categorical column counts by its category codes)"
            ) from None
    else:
        values = records[:, domain.index(attr)]
    return _validated_codes(values, attr, domain[attr])


def _validated_codes(values: np.ndarray, attr: str, size: int) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        codes = values.astype(np.int64)
    else:
        if values.dtype.kind not in "fb":
            raise TypeError(
                f"column {attr!r} has dtype {values.dtype}; expected integer codes 0..{size - 1}"
            )
        values = values.astype(float)
        bad = ~np.isfinite(values)
        if bad.any():
            raise ValueError(
                f"column {attr!r} has {int(bad.sum())} missing or non-finite value(s) (first at "
                f"row {int(np.argmax(bad))}); encode missing values as a category of their own"
            )
        frac = values != np.round(values)
        if frac.any():
            raise ValueError(
                f"column {attr!r} has non-integer value {float(values[np.argmax(frac)])!r} at row "
                f"{int(np.argmax(frac))}; codes must be integers 0..{size - 1}"
            )
        codes = values.astype(np.int64)
    out = (codes < 0) | (codes >= size)
    if out.any():
        i = int(np.argmax(out))
        raise ValueError(
            f"column {attr!r} has {int(out.sum())} code(s) outside 0..{size - 1} (first: "
            f"{codes[i]} at row {i}); the domain gives {attr!r} {size} values"
        )
    return codes


def _check_shape(records: Any, domain: Domain) -> int:
    if isinstance(records, pd.DataFrame):
        return len(records)
    arr = np.asarray(records)
    if arr.ndim != 2 or arr.shape[1] != len(domain):
        raise ValueError(
            f"records array has shape {arr.shape}; expected (num_records, {len(domain)}) with "
            f"columns in domain order {list(domain.attrs)}"
        )
    return arr.shape[0]


def records_to_array(records: Any, domain: Domain) -> np.ndarray:
    """Validated ``(num_records, num_attrs)`` int array of codes in domain order."""
    n = _check_shape(records, domain)
    arr = records if isinstance(records, pd.DataFrame) else np.asarray(records)
    if not len(domain):
        return np.zeros((n, 0), dtype=np.int64)
    return np.stack([_column(arr, a, domain) for a in domain.attrs], axis=1)


def count(
    records: Any,
    cliques: Sequence[Iterable[str]],
    domain: Domain | dict[str, int],
    weights: Any = None,
) -> CliqueTables:
    """Contingency tables of ``records`` over each clique.

    Parameters
    ----------
    records : numpy array ``(num_records, num_attrs)`` or pandas DataFrame
        Integer codes; an array's columns are in domain order, a DataFrame's are found by name
        (categorical columns count by their category codes).
    cliques : sequence of tuples of attribute names
    domain : Domain
    weights : array ``(num_records,)``, optional
        Non-negative weight of each record (e.g. ``1/K_u`` for a user who contributes ``K_u``
        records, so that every user's total weight is at most one; seed 002, §4.2).

    Returns
    -------
    CliqueTables
        float64 numpy tables, axes in each clique's attribute order.
    """
    domain = domain if isinstance(domain, Domain) else Domain(domain)
    cliques = [domain.check_clique(c) for c in cliques]
    n = _check_shape(records, domain)
    arr = records if isinstance(records, pd.DataFrame) else np.asarray(records)
    if weights is not None:
        weights = np.asarray(weights, dtype=float)
        if weights.shape != (n,):
            raise ValueError(f"weights have shape {weights.shape}; expected ({n},), one per record")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("weights must be finite and non-negative")
    needed = dict.fromkeys(a for c in cliques for a in c)
    codes = {a: _column(arr, a, domain) for a in needed}
    tables = {}
    for c in cliques:
        shape = domain.shape_of(c)
        flat = np.ravel_multi_index(tuple(codes[a] for a in c), shape) if n else np.zeros(0, int)
        counts = np.bincount(flat, weights=weights, minlength=int(np.prod(shape)))
        tables[c] = counts.astype(np.float64).reshape(shape)
    return CliqueTables(tables)


class Dataset(NamedTuple):
    """Records with their domain. ``records`` is a DataFrame of integer codes."""

    records: pd.DataFrame
    domain: Domain

    def count(self, cliques: Sequence[Iterable[str]], weights: Any = None) -> CliqueTables:
        return count(self.records, cliques, self.domain, weights)

    def to_array(self) -> np.ndarray:
        return records_to_array(self.records, self.domain)

    @property
    def total(self) -> int:
        return len(self.records)


def load_demo(name: str = "adult") -> Dataset:
    """Bundled demo data: ``"adult"`` (UCI Adult, 48,842 records, 14 discretised attributes).

    The codes and domain are those of the Private-PGM repository's ``data/adult.csv``.
    """
    if name != "adult":
        raise ValueError(f"unknown demo data set {name!r}; available: ['adult']")
    base = resources.files("numpyro_dpgm") / "datasets"
    with (base / "adult-domain.json").open() as f:
        domain = Domain(json.load(f))
    with (base / "adult.csv.gz").open("rb") as f, gzip.open(f) as g:
        records = pd.read_csv(g)
    records_to_array(records, domain)  # validates
    return Dataset(records[list(domain.attrs)], domain)


