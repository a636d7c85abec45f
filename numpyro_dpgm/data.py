"""Counting contingency tables, and the bundled demo data.

:func:`count` turns records into clique count tables ``n_C(i_C) = Σ_m w_m · 1[x^m_C = i_C]``
(seed 002, §2). Three back ends give identical tables:

- **numpy** (default): a numpy array of integer codes in domain order, or a pandas DataFrame
  with one column per attribute; the records are held in memory.
- **DuckDB** (:func:`count_file`, or :func:`count` given a path): a CSV or Parquet file (or a
  glob of them) is scanned out of core by DuckDB and every clique is counted by one SQL
  ``GROUP BY GROUPING SETS`` query; only the tables come back into memory, so a file larger
  than memory is fine.
- **Spark** (:func:`count_spark`, or :func:`count` given a ``pyspark.sql.DataFrame``): the
  group-by counts run on the cluster and only the tables are collected to the driver. This is
  the path for data that does not fit one machine.

Every code is validated against the domain: an out-of-range, negative, non-integer or missing
value is an error naming the column, never a silently dropped record.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from .domain import Domain
from .tables import CliqueTables, project_table

__all__ = ["count", "count_file", "count_spark", "records_to_array", "Dataset", "load_demo"]


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
        raise _range_error(attr, size, int(out.sum()), f"first: {codes[i]} at row {i}")
    return codes


def _range_error(attr: str, size: int, num: int, example: str) -> ValueError:
    return ValueError(
        f"column {attr!r} has {num} code(s) outside 0..{size - 1} ({example}); the domain gives "
        f"{attr!r} {size} values"
    )


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
    records : numpy array ``(num_records, num_attrs)``, pandas DataFrame, path or Spark DataFrame
        Integer codes; an array's columns are in domain order, a DataFrame's are found by name
        (categorical columns count by their category codes). A path (``str`` or
        ``os.PathLike``) to a CSV or Parquet file is counted out of core by
        :func:`count_file` (DuckDB); a ``pyspark.sql.DataFrame`` by :func:`count_spark`.
    cliques : sequence of tuples of attribute names
    domain : Domain
    weights : array ``(num_records,)``, optional
        Non-negative weight of each record (e.g. ``1/K_u`` for a user who contributes ``K_u``
        records, so that every user's total weight is at most one; seed 002, §4.2). For a file
        or a Spark DataFrame: the name of a column holding the weights.

    Returns
    -------
    CliqueTables
        float64 numpy tables, axes in each clique's attribute order.
    """
    if isinstance(records, str | os.PathLike):
        return count_file(records, cliques, domain, weights)
    if _is_spark_frame(records):
        return count_spark(records, cliques, domain, weights)
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


# ------------------------------------------------------------------------------------------------
# SQL back ends: DuckDB (files, out of core) and Spark (clusters)
# ------------------------------------------------------------------------------------------------
# Both run the same SQL (the dialects differ only in identifier quoting): one aggregate query
# validates every needed column, then one ``GROUP BY GROUPING SETS`` query counts every clique's
# attribute set in a single scan.
_INT_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT", "UTINYINT",
              "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "BYTE", "SHORT", "LONG")
_FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL", "DECIMAL")


def _sql_kind(type_name: str) -> str:
    """``"int"``, ``"float"``, ``"bool"`` or ``"other"`` for a DuckDB or Spark type name."""
    t = type_name.upper()
    if t.startswith(("BOOLEAN", "BOOL")):
        return "bool"
    if t.startswith(_FLOAT_TYPES):
        return "float"
    if t.startswith(_INT_TYPES):
        return "int"
    return "other"


def _sql_checks(col: str, kind: str, size: int | None) -> list[str]:
    """Aggregates over one column: [missing, non-integer, example, out of range, min, max].

    ``col`` is the quoted column; ``size`` is the number of codes (``None`` for a weight
    column, whose out-of-range values are the negative ones).
    """
    x = f"CAST({col} AS DOUBLE)"
    missing = f"{col} IS NULL"
    if kind == "float":
        missing += f" OR isnan({x}) OR abs({x}) = CAST('Infinity' AS DOUBLE)"
    finite = f"NOT ({missing})"
    nonint = f"{finite} AND {x} <> round({x})" if kind == "float" and size is not None else "false"
    bad = f"{x} < 0" if size is None else f"{x} < 0 OR {x} >= {size}"
    out = f"{finite} AND NOT ({nonint}) AND ({bad})"
    return [f"count_if({missing})", f"count_if({nonint})", f"min(CASE WHEN {nonint} THEN {x} END)",
            f"count_if({out})", f"min(CASE WHEN {out} THEN {x} END)",
            f"max(CASE WHEN {out} THEN {x} END)"]


def _raise_on_stats(attr: str, size: int | None, stats: Sequence[Any], weights: bool) -> None:
    """The errors of the numpy path, from the aggregates of :func:`_sql_checks`."""
    missing, nonint, example, out, lo, hi = stats
    what = "weight column" if weights else "column"
    if missing:
        raise ValueError(
            f"{what} {attr!r} has {int(missing)} missing or non-finite value(s); "
            + ("weights must be finite and non-negative" if weights
               else "encode missing values as a category of their own")
        )
    if nonint:
        raise ValueError(
            f"column {attr!r} has non-integer value {float(example)!r}; codes must be integers "
            f"0..{size - 1}"
        )
    if out:
        if weights:
            raise ValueError(f"weight column {attr!r} has {int(out)} negative value(s) (min "
                             f"{float(lo)!r}); weights must be finite and non-negative")
        raise _range_error(attr, size, int(out), f"min {_code(lo)}, max {_code(hi)}")


def _code(v: Any) -> Any:
    return int(v) if float(v).is_integer() else float(v)


class _SQL(NamedTuple):
    """What differs between the SQL back ends."""

    quote: Any  # column name -> quoted identifier
    source: str  # the FROM clause
    run: Any  # query -> (column names, list of row tuples)
    types: dict[str, str]  # column name -> type name


def _sql_count(sql: _SQL, cliques: Sequence[Iterable[str]], domain: Domain | dict[str, int],
               weights: str | None) -> CliqueTables:
    domain = domain if isinstance(domain, Domain) else Domain(domain)
    cliques = [domain.check_clique(c) for c in cliques]
    needed = list(dict.fromkeys(a for c in cliques for a in c))
    if weights is not None and not isinstance(weights, str):
        raise TypeError(
            "weights of a file or a Spark DataFrame must name a column of it, got "
            f"{type(weights).__name__}"
        )
    for a in needed + ([weights] if weights is not None else []):
        if a not in sql.types:
            raise KeyError(f"records have no column {a!r} (needed by "
                           f"{'the weights' if a == weights else 'a clique'}); columns: "
                           f"{list(sql.types)}")
    checks: list[tuple[str, int | None, bool]] = []
    for a in needed:
        kind = _sql_kind(sql.types[a])
        if kind == "other":
            raise TypeError(
                f"column {a!r} has type {sql.types[a]}; expected integer codes 0..{domain[a] - 1}"
            )
        checks.append((a, domain[a], False))
    if weights is not None:
        if _sql_kind(sql.types[weights]) not in ("int", "float"):
            raise TypeError(f"weight column {weights!r} has type {sql.types[weights]}; expected "
                            "finite non-negative numbers")
        checks.append((weights, None, True))
    exprs = [e for a, size, _ in checks
             for e in _sql_checks(sql.quote(a), _sql_kind(sql.types[a]), size)]
    _, rows = sql.run(f"SELECT {', '.join(exprs)} FROM {sql.source}")
    stats = rows[0]
    for k, (a, size, is_weight) in enumerate(checks):
        _raise_on_stats(a, size, stats[6 * k: 6 * k + 6], is_weight)
    # one scan: every distinct attribute set is a grouping set
    sets = list(dict.fromkeys(domain.sorted(c) for c in cliques))
    cols = domain.sorted(needed)
    total = (f"sum(CAST({sql.quote(weights)} AS DOUBLE))" if weights is not None
             else "count(*)")
    select = ([f"grouping({sql.quote(a)})" for a in cols]
              + [f"CAST({sql.quote(a)} AS BIGINT)" for a in cols] + [total])
    grouping = ", ".join("(" + ", ".join(sql.quote(a) for a in s) + ")" for s in sets)
    _, rows = sql.run(f"SELECT {', '.join(select)} FROM {sql.source} "
                      f"GROUP BY GROUPING SETS ({grouping})")
    m = len(cols)
    result = np.array(rows, dtype=float).reshape(len(rows), 2 * m + 1)
    tables = {}
    for s in sets:
        rows_of_s = np.all(result[:, :m] == [float(a not in s) for a in cols], axis=1)
        codes = tuple(result[rows_of_s, m + cols.index(a)].astype(np.int64) for a in s)
        shape = domain.shape_of(s)
        flat = np.ravel_multi_index(codes, shape)
        tables[s] = np.bincount(flat, weights=np.nan_to_num(result[rows_of_s, -1]),
                                minlength=int(np.prod(shape))).astype(np.float64).reshape(shape)
    return CliqueTables({c: project_table(tables[domain.sorted(c)], domain.sorted(c), c)
                         for c in cliques})


def _file_source(path: str | os.PathLike, file_format: str | None) -> str:
    name = os.fspath(path)
    if file_format is None:
        lower = name.lower()
        if lower.endswith((".csv", ".csv.gz", ".tsv")):
            file_format = "csv"
        elif lower.endswith((".parquet", ".pq")):
            file_format = "parquet"
        else:
            raise ValueError(f"cannot tell the format of {name!r} from its suffix; pass "
                             "format='csv' or format='parquet'")
    if file_format not in ("csv", "parquet"):
        raise ValueError(f"unknown file format {file_format!r}; use 'csv' or 'parquet'")
    if not any(ch in name for ch in "*?[") and not Path(name).exists():
        raise FileNotFoundError(f"no such file: {name!r}")
    literal = "'" + name.replace("'", "''") + "'"
    return f"read_csv({literal})" if file_format == "csv" else f"read_parquet({literal})"


def count_file(
    path: str | os.PathLike,
    cliques: Sequence[Iterable[str]],
    domain: Domain | dict[str, int],
    weights: str | None = None,
    *,
    format: str | None = None,  # noqa: A002 - the natural name of the option
    threads: int | None = None,
    memory_limit: str | None = None,
) -> CliqueTables:
    """Contingency tables of a CSV or Parquet file, counted out of core by DuckDB.

    The file is never loaded into memory: DuckDB streams it, validates every needed column
    in one aggregate query (missing, non-finite, non-integer and out-of-range codes are
    errors naming the column, as in :func:`count`) and counts all cliques in one
    ``GROUP BY GROUPING SETS`` query. The tables equal :func:`count`'s on the same records.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.csv`` (``.csv.gz``) or ``.parquet`` file, or a glob of such files (DuckDB reads
        them as one table). Columns are found by name.
    cliques : sequence of tuples of attribute names
    domain : Domain
    weights : str, optional
        Name of a column of non-negative record weights.
    format : {"csv", "parquet"}, optional
        Overrides the format read off the suffix.
    threads, memory_limit : optional
        DuckDB's settings of the same names (e.g. ``memory_limit="2GB"``); DuckDB spills to
        disk beyond the limit.

    Returns
    -------
    CliqueTables
        float64 numpy tables, axes in each clique's attribute order.
    """
    import duckdb

    source = _file_source(path, format)
    config: dict[str, Any] = {}
    if threads is not None:
        config["threads"] = int(threads)
    if memory_limit is not None:
        config["memory_limit"] = str(memory_limit)
    with duckdb.connect(config=config) as con:
        described = con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()

        def run(query: str) -> tuple[list[str], list[tuple]]:
            rel = con.sql(query)
            return rel.columns, rel.fetchall()

        def quote(name: str) -> str:
            return '"' + name.replace('"', '""') + '"'

        sql = _SQL(quote, source, run, {row[0]: str(row[1]) for row in described})
        return _sql_count(sql, cliques, domain, weights)


def _is_spark_frame(records: Any) -> bool:
    return any(f"{k.__module__}.{k.__name__}".startswith("pyspark.sql")
               and k.__name__ == "DataFrame" for k in type(records).__mro__)


def count_spark(
    frame: Any,
    cliques: Sequence[Iterable[str]],
    domain: Domain | dict[str, int],
    weights: str | None = None,
) -> CliqueTables:
    """Contingency tables of a Spark DataFrame: the path for data that does not fit one machine.

    The validation (as :func:`count`: missing, non-finite, non-integer and out-of-range codes
    are errors naming the column) and the group-by counts run on the cluster, one aggregate
    job and one ``GROUP BY GROUPING SETS`` job for all cliques; only the tables (at most the
    cliques' number of cells in rows) are collected to the driver. The tables equal
    :func:`count`'s on the same records.

    Parameters
    ----------
    frame : pyspark.sql.DataFrame
        One column per attribute, found by name.
    cliques : sequence of tuples of attribute names
    domain : Domain
    weights : str, optional
        Name of a column of non-negative record weights.

    Returns
    -------
    CliqueTables
        float64 numpy tables, axes in each clique's attribute order.
    """
    if not _is_spark_frame(frame):
        raise TypeError(f"count_spark expects a pyspark.sql.DataFrame, got {type(frame).__name__}")
    spark = frame.sparkSession

    def run(query: str) -> tuple[list[str], list[tuple]]:
        rows = spark.sql(query, records=frame).collect()
        return (list(rows[0].__fields__) if rows else []), [tuple(r) for r in rows]

    def quote(name: str) -> str:  # braces are doubled: the query is a format string
        return "`" + name.replace("`", "``").replace("{", "{{").replace("}", "}}") + "`"

    types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    return _sql_count(_SQL(quote, "{records}", run, types), cliques, domain, weights)


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


