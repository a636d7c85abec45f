"""Encoding of user tables into integer codes over a :class:`~numpyro_dpgm.domain.Domain`, and back.

Every estimator works on records of integer codes ``0 … k_a − 1`` per attribute ``a``. A user's
pandas DataFrame holds labels instead: strings, pandas categoricals, booleans or integers.
:func:`encode` turns it into codes, a :class:`Domain` and a categories mapping
``attr -> list of labels`` (the label of code ``i`` is ``labels[i]``); :func:`decode` turns codes
(e.g. synthetic records) back into a DataFrame of categorical columns with the original names
and labels.

Domain specification (``domain=``): a mapping ``attr -> size`` (a :class:`Domain`, or the
``{"attr": size}`` files of ``../shared/data``) or ``attr -> list of labels``, mixed freely.
:func:`read_domain` reads such a JSON file. How each column is encoded:

=========================  ==========================================  ============================
column                     domain given                                domain inferred
=========================  ==========================================  ============================
labels given (list)        code = position of the value in the list;   (not applicable)
                           a value outside the list is an error
categorical dtype          its categories are the labels; their number  categories of the dtype
                           must equal the given size
strings / booleans         labels must be given (a list)                sorted distinct values
integers (``integers=``    ``"codes"``: values are codes, checked       ``"codes"``: size = max + 1
``"codes"``, default)      against ``0 … size − 1``; labels ``0 … k−1``
integers (``"labels"``)    as strings                                   sorted distinct values
=========================  ==========================================  ============================

Inferring a domain reads the private data: which labels occur (and the largest code) is itself
disclosed by the domain and is not covered by any differential privacy guarantee. Give the domain
(or the labels) from public knowledge for a private release.

Missing values are an error (encode them as a label of their own); nothing is dropped or clipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from .data import records_to_array
from .domain import Domain

__all__ = ["Encoded", "encode", "decode", "read_domain", "domain_spec", "Label"]

#: A category label: what a cell of the user's table holds.
Label = str | int | float | bool

DomainSpec = Mapping[str, "int | Sequence[Label]"]


class Encoded(NamedTuple):
    """The result of :func:`encode`.

    Attributes
    ----------
    codes : pandas.DataFrame
        ``int64`` codes, one column per attribute in domain order (what
        :func:`numpyro_dpgm.data.count` and :func:`numpyro_dpgm.privacy.release` take).
    domain : Domain
    categories : dict
        ``attr -> list of labels``; ``categories[a][i]`` is the label of code ``i``.
    """

    codes: pd.DataFrame
    domain: Domain
    categories: dict[str, list[Label]]


def _plain(value: Any) -> Label:
    """A label as a plain Python scalar (JSON-serialisable, hashable, comparable)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or math.isinf(value):
            raise ValueError(f"a label must be finite, got {value!r}")
        return value
    raise TypeError(
        f"labels must be strings, integers, floats or booleans, got {type(value).__name__} "
        f"{value!r}"
    )


def _labels_list(attr: str, labels: Any) -> list[Label]:
    if isinstance(labels, str) or not isinstance(labels, Sequence | np.ndarray | pd.Index):
        raise TypeError(
            f"attribute {attr!r}: the domain gives either a number of values or a list of labels, "
            f"got {labels!r}"
        )
    out = [_plain(v) for v in labels]
    if not out:
        raise ValueError(f"attribute {attr!r}: empty list of labels")
    seen: set[Any] = set()
    for v in out:
        key = (type(v) is bool, v)
        if key in seen:
            raise ValueError(f"attribute {attr!r}: label {v!r} is listed twice")
        seen.add(key)
    return out


def domain_spec(
    spec: Domain | DomainSpec,
) -> tuple[Domain, dict[str, list[Label]]]:
    """Split a domain specification into a :class:`Domain` and the labels it names.

    ``spec`` maps attributes to sizes or to lists of labels; the result's categories hold only
    the attributes given by labels.
    """
    if isinstance(spec, Domain):
        return spec, {}
    if not isinstance(spec, Mapping):
        raise TypeError(
            "domain must map attribute -> number of values or list of labels, got "
            f"{type(spec).__name__}"
        )
    sizes: dict[str, int] = {}
    categories: dict[str, list[Label]] = {}
    for attr, value in spec.items():
        if isinstance(value, int | np.integer) and not isinstance(value, bool):
            sizes[attr] = int(value)
        else:
            categories[attr] = _labels_list(attr, value)
            sizes[attr] = len(categories[attr])
    return Domain(sizes), categories


def read_domain(path: str | Path) -> tuple[Domain, dict[str, list[Label]]]:
    """Read a domain JSON file: ``{"attr": size or [labels...], ...}`` (order kept).

    Returns
    -------
    domain : Domain
    categories : dict
        The labels of the attributes given by a list.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"domain file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"domain file {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"domain file {path} must hold one non-empty JSON object "
            '{"attr": number of values or [labels], ...}'
        )
    try:
        return domain_spec(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"domain file {path}: {err}") from None


def _missing_check(col: pd.Series, attr: str) -> None:
    bad = col.isna().to_numpy()
    if bad.any():
        raise ValueError(
            f"column {attr!r} has {int(bad.sum())} missing value(s) (first at row "
            f"{int(np.argmax(bad))}); encode missing values as a label of their own"
        )


def _is_integer_column(col: pd.Series, attr: str) -> bool:
    if pd.api.types.is_bool_dtype(col.dtype):
        return False
    if pd.api.types.is_integer_dtype(col.dtype):
        return True
    if pd.api.types.is_float_dtype(col.dtype):
        values = col.to_numpy(dtype=float)
        if np.all(values == np.round(values)):
            return True
        i = int(np.argmax(values != np.round(values)))
        raise ValueError(
            f"column {attr!r} holds the non-integer number {float(values[i])!r} (row {i}); "
            "discretise continuous columns into bins (or strings) before encoding"
        )
    return False


def _codes_from_labels(col: pd.Series, attr: str, labels: list[Label]) -> np.ndarray:
    """Position of every value of ``col`` in ``labels``; a value not listed is an error."""
    values = col.astype(object) if isinstance(col.dtype, pd.CategoricalDtype) else col
    lookup = {(type(v) is bool, v): i for i, v in enumerate(labels)}
    plain = [_plain(v) for v in pd.unique(values.to_numpy(dtype=object))]
    missing = [v for v in plain if (type(v) is bool, v) not in lookup]
    if missing:
        row = int(np.argmax(values.to_numpy(dtype=object) == missing[0]))
        shown = labels if len(labels) <= 12 else labels[:12] + ["…"]
        raise ValueError(
            f"column {attr!r} has value {missing[0]!r} (row {row}) outside its domain "
            f"{shown}; fix the data or add the label to the domain"
        )
    mapping = {v: lookup[(type(v) is bool, v)] for v in plain}
    return np.fromiter(
        (mapping[_plain(v)] for v in values.to_numpy(dtype=object)), dtype=np.int64,
        count=len(values),
    )


def _integer_codes(col: pd.Series, attr: str, size: int | None) -> np.ndarray:
    codes = col.to_numpy(dtype=float).astype(np.int64)
    if codes.size and codes.min() < 0:
        i = int(np.argmin(codes))
        raise ValueError(
            f"column {attr!r} has the negative code {codes[i]} (row {i}); integer columns hold "
            "codes 0 … size − 1 (pass integers='labels' to treat integers as labels)"
        )
    if size is not None and codes.size and codes.max() >= size:
        i = int(np.argmax(codes >= size))
        raise ValueError(
            f"column {attr!r} has code {codes[i]} (row {i}) outside its domain 0 … {size - 1}; "
            "fix the data or enlarge the domain"
        )
    return codes


def _encode_column(
    col: pd.Series,
    attr: str,
    size: int | None,
    labels: list[Label] | None,
    integers: str,
) -> tuple[np.ndarray, list[Label]]:
    _missing_check(col, attr)
    if labels is not None:
        if size is not None and len(labels) != size:
            raise ValueError(
                f"attribute {attr!r}: the domain gives {size} values but {len(labels)} labels"
            )
        return _codes_from_labels(col, attr, labels), labels
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = _labels_list(attr, list(col.cat.categories))
        if size is not None and len(cats) != size:
            raise ValueError(
                f"column {attr!r} is categorical with {len(cats)} categories but the domain "
                f"gives {size} values; set the categories to the domain's labels"
            )
        return col.cat.codes.to_numpy(dtype=np.int64), cats
    if integers == "codes" and _is_integer_column(col, attr):
        codes = _integer_codes(col, attr, size)
        k = size if size is not None else (int(codes.max()) + 1 if codes.size else 1)
        return codes, list(range(k))
    if size is not None:
        kind = "integers" if _is_integer_column(col, attr) else "labels"
        raise ValueError(
            f"column {attr!r} holds {kind} but the domain gives only its size ({size}); give "
            f"its labels in the domain ({{{attr!r}: [label, ...]}}) or use a categorical column"
        )
    distinct = [_plain(v) for v in pd.unique(col.to_numpy(dtype=object))]
    try:
        labels = sorted(distinct)
    except TypeError:
        raise TypeError(
            f"column {attr!r} mixes label types ({sorted({type(v).__name__ for v in distinct})}) "
            "that cannot be ordered; convert it to strings or give its labels"
        ) from None
    if not labels:
        raise ValueError(f"column {attr!r} is empty: its labels cannot be inferred; give them")
    return _codes_from_labels(col, attr, labels), labels


def encode(
    frame: pd.DataFrame,
    domain: Domain | DomainSpec | None = None,
    *,
    categories: Mapping[str, Sequence[Label]] | None = None,
    columns: Sequence[str] | None = None,
    integers: Literal["codes", "labels"] = "codes",
) -> Encoded:
    """Integer codes, domain and categories of a DataFrame (see the module docstring).

    Parameters
    ----------
    frame : pandas.DataFrame
        One column per attribute (strings, categoricals, booleans or integers).
    domain : Domain or mapping attr -> size or list of labels, optional
        Given: exactly these attributes, in this order, are encoded (other columns are left
        out) and every value is checked against it. ``None``: inferred from the data (which
        discloses it; see the module docstring).
    categories : mapping attr -> list of labels, optional
        Labels of attributes beyond those the domain lists (e.g. beside a size-only
        :class:`Domain`).
    columns : sequence of str, optional
        With an inferred domain, the columns to encode (default all, in the frame's order).
    integers : {"codes", "labels"}
        Whether integer columns hold codes ``0 … k − 1`` (default) or labels.

    Returns
    -------
    Encoded
        ``(codes, domain, categories)``.

    Raises
    ------
    ValueError
        A missing column, a missing value, a value outside the given domain (naming the column
        and the value), labels that disagree with the domain's size.
    """
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"encode takes a pandas DataFrame, got {type(frame).__name__}")
    if integers not in ("codes", "labels"):
        raise ValueError(f"integers must be 'codes' or 'labels', got {integers!r}")
    if domain is not None and columns is not None:
        raise ValueError("give either domain= (which names the attributes) or columns=, not both")
    given_labels = {a: _labels_list(a, v) for a, v in (categories or {}).items()}
    if domain is not None:
        dom, spec_labels = domain_spec(domain)
        for a, labels in spec_labels.items():
            if a in given_labels and given_labels[a] != labels:
                raise ValueError(f"attribute {a!r}: categories= disagrees with the domain's labels")
        given_labels.update(spec_labels)
        attrs: list[str] = list(dom.attrs)
        sizes: dict[str, int | None] = dict(dom.items())
    else:
        attrs = [str(c) for c in (frame.columns if columns is None else columns)]
        sizes = dict.fromkeys(attrs)
    unknown = [a for a in given_labels if a not in attrs]
    if unknown:
        raise ValueError(f"categories given for {unknown}, which are not attributes {attrs}")
    absent = [a for a in attrs if a not in frame.columns]
    if absent:
        raise ValueError(
            f"the data have no column {absent[0]!r} (needed: {absent}); columns: "
            f"{list(map(str, frame.columns))}"
        )
    if len(set(attrs)) != len(attrs):
        raise ValueError(f"repeated column names in {attrs}")
    codes, cats = {}, {}
    for a in attrs:
        col = frame[a]
        if integers == "labels" and a not in given_labels and _is_integer_column(col, a):
            col = col.astype(object)
        codes[a], cats[a] = _encode_column(col, a, sizes[a], given_labels.get(a), integers)
    out_domain = Domain({a: len(cats[a]) for a in attrs})
    return Encoded(pd.DataFrame(codes, index=frame.index), out_domain, cats)


def decode(
    codes: Any,
    domain: Domain | Mapping[str, int],
    categories: Mapping[str, Sequence[Label]] | None = None,
) -> pd.DataFrame:
    """A DataFrame of categorical columns from integer codes (the inverse of :func:`encode`).

    Parameters
    ----------
    codes : array ``(num_records, num_attrs)`` in domain order, or DataFrame of codes
    domain : Domain
    categories : mapping attr -> list of labels, optional
        Attributes without labels decode to the categories ``0 … k − 1``.

    Returns
    -------
    pandas.DataFrame
        Columns named and ordered as the domain, each ``pd.Categorical`` with the labels as its
        categories (in code order).
    """
    domain = domain if isinstance(domain, Domain) else Domain(domain)
    categories = dict(categories or {})
    unknown = [a for a in categories if a not in domain]
    if unknown:
        raise ValueError(f"categories given for {unknown}, which are not in the domain")
    arr = records_to_array(codes, domain)  # validates every code against the domain
    out = {}
    for j, a in enumerate(domain.attrs):
        labels = _labels_list(a, categories[a]) if a in categories else list(range(domain[a]))
        if len(labels) != domain[a]:
            raise ValueError(
                f"attribute {a!r}: the domain gives {domain[a]} values but {len(labels)} labels"
            )
        out[a] = pd.Categorical.from_codes(arr[:, j], categories=pd.Index(labels, dtype=object))
    index = codes.index if isinstance(codes, pd.DataFrame) else None
    return pd.DataFrame(out, index=index)
