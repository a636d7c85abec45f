"""Counting contingency tables, validation of codes, and the bundled demo data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_DATA

from numpyro_dpgm import Dataset, Domain, count, load_demo
from numpyro_dpgm.data import count_file, count_spark, records_to_array

DOMAIN = Domain({"a": 2, "b": 3, "c": 4, "d": 1})
CLIQUES = [("c", "a"), ("b",), ("a", "b", "c"), ("d", "b")]


def _manual(records: np.ndarray, cliques: list[tuple[str, ...]], domain: Domain,
            weights: np.ndarray | None = None) -> dict[tuple[str, ...], np.ndarray]:
    """Count tables by an explicit loop over records."""
    out = {}
    for c in cliques:
        table = np.zeros(domain.shape_of(c))
        for m, x in enumerate(records):
            table[tuple(int(x[domain.index(a)]) for a in c)] += 1 if weights is None else weights[m]
        out[c] = table
    return out


def _records(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, k, n) for k in DOMAIN.shape], axis=1)


def _assert_tables(result: object, expected: dict) -> None:
    assert list(result) == list(expected)
    for c, v in expected.items():
        assert result[c].dtype == np.float64 and result[c].shape == v.shape
        np.testing.assert_allclose(result[c], v, rtol=1e-12, atol=1e-12)


def test_count_numpy_array() -> None:
    x = _records(500)
    _assert_tables(count(x, CLIQUES, DOMAIN), _manual(x, CLIQUES, DOMAIN))
    _assert_tables(count(x.tolist(), CLIQUES, dict(DOMAIN)), _manual(x, CLIQUES, DOMAIN))
    assert float(count(x, [("a",)], DOMAIN)[("a",)].sum()) == 500


def test_count_dataframe_by_column_name() -> None:
    x = _records(300, 1)
    df = pd.DataFrame(x, columns=list(DOMAIN.attrs))
    df = df[["d", "c", "b", "a"]].assign(extra=np.arange(300))  # other order, extra column
    _assert_tables(count(df, CLIQUES, DOMAIN), _manual(x, CLIQUES, DOMAIN))
    floats = df.astype(float)  # integral floats are codes too
    _assert_tables(count(floats, CLIQUES, DOMAIN), _manual(x, CLIQUES, DOMAIN))
    nullable = df.astype("Int64")
    _assert_tables(count(nullable, CLIQUES, DOMAIN), _manual(x, CLIQUES, DOMAIN))
    with pytest.raises(KeyError, match="no column 'a'"):
        count(df.drop(columns="a"), CLIQUES, DOMAIN)


def test_count_categorical_columns() -> None:
    """A categorical column counts by its category codes (category order, not value order)."""
    df = pd.DataFrame({
        "a": pd.Categorical(["y", "x", "y", "y"], categories=["y", "x"]),
        "b": pd.Categorical([2, 0, 0, 2], categories=[0, 1, 2]),
        "c": [0, 1, 2, 3], "d": [0, 0, 0, 0],
    })
    t = count(df, [("a", "b")], DOMAIN)[("a", "b")]
    np.testing.assert_array_equal(t, [[1, 0, 2], [1, 0, 0]])
    df.loc[2, "a"] = np.nan
    with pytest.raises(ValueError, match="column 'a' has 1 missing"):
        count(df, [("a", "b")], DOMAIN)


def test_count_with_weights() -> None:
    x = _records(200, 2)
    w = np.random.default_rng(3).uniform(0, 2, 200)
    w[:5] = 0.0
    _assert_tables(count(x, CLIQUES, DOMAIN, weights=w), _manual(x, CLIQUES, DOMAIN, w))
    df = pd.DataFrame(x, columns=list(DOMAIN.attrs))
    ds = Dataset(df, DOMAIN)
    _assert_tables(ds.count(CLIQUES, weights=w), _manual(x, CLIQUES, DOMAIN, w))
    np.testing.assert_allclose(ds.count([("b",)], w)[("b",)].sum(), w.sum(), rtol=1e-12)
    for bad, msg in [(w[:-1], r"shape \(199,\); expected \(200,\)"),
                     (-w, "non-negative"), (np.where(w > 1, np.nan, w), "finite"),
                     (np.full(200, np.inf), "finite")]:
        with pytest.raises(ValueError, match=msg):
            count(x, CLIQUES, DOMAIN, weights=bad)


def test_count_empty_records() -> None:
    empty = np.zeros((0, 4), dtype=int)
    tables = count(empty, CLIQUES, DOMAIN)
    for c in CLIQUES:
        np.testing.assert_array_equal(tables[c], np.zeros(DOMAIN.shape_of(c)))
    tables = count(pd.DataFrame(empty, columns=list(DOMAIN)), CLIQUES, DOMAIN, weights=[])
    assert float(tables[("b",)].sum()) == 0.0


@pytest.mark.parametrize("frame", [False, True])
def test_invalid_codes_name_the_column(frame: bool) -> None:
    x = _records(20, 4).astype(float)

    def run(values: np.ndarray) -> None:
        data = pd.DataFrame(values, columns=list(DOMAIN)) if frame else values
        count(data, CLIQUES, DOMAIN)

    cases = [
        ((3, "c", 4), r"column 'c' has 1 code\(s\) outside 0..3 \(first: 4 at row 3\)"),
        ((5, "b", -1), r"column 'b' has 1 code\(s\) outside 0..2 \(first: -1 at row 5\)"),
        ((7, "d", 1), r"column 'd' has 1 code\(s\) outside 0..0"),
        ((2, "a", np.nan), r"column 'a' has 1 missing or non-finite value\(s\) \(first at row 2\)"),
        ((9, "c", np.inf), "column 'c' has 1 missing or non-finite"),
        ((4, "b", 1.5), r"column 'b' has non-integer value 1.5 at row 4"),
    ]
    for (row, attr, value), msg in cases:
        bad = x.copy()
        bad[row, DOMAIN.index(attr)] = value
        with pytest.raises(ValueError, match=msg):
            run(bad)
    # integer arrays are range-checked too
    ints = x.astype(int)
    ints[0, 0] = 2
    with pytest.raises(ValueError, match="column 'a'"):
        count(pd.DataFrame(ints, columns=list(DOMAIN)) if frame else ints, CLIQUES, DOMAIN)


def test_non_numeric_columns_name_the_column() -> None:
    df = pd.DataFrame({"a": ["x", "y"], "b": [0, 1], "c": [0, 1], "d": [0, 0]})
    with pytest.raises(TypeError, match="column 'a'"):
        count(df, [("a", "b")], DOMAIN)
    arr = np.array([["0", "1", "2", "0"]])
    with pytest.raises(TypeError, match="column 'a' has dtype <U1"):
        count(arr, [("a",)], DOMAIN)


def test_wrong_array_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(5, 3\); expected \(num_records, 4\)"):
        count(np.zeros((5, 3), dtype=int), CLIQUES, DOMAIN)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        count(np.zeros(4, dtype=int), CLIQUES, DOMAIN)
    with pytest.raises(KeyError, match="'q'"):
        count(np.zeros((5, 4), dtype=int), [("a", "q")], DOMAIN)
    with pytest.raises(ValueError, match="repeats"):
        count(np.zeros((5, 4), dtype=int), [("a", "a")], DOMAIN)


def test_records_to_array_and_dataset() -> None:
    x = _records(50, 5)
    df = pd.DataFrame(x, columns=list(DOMAIN))[["b", "a", "d", "c"]]
    arr = records_to_array(df, DOMAIN)
    assert arr.dtype == np.int64
    np.testing.assert_array_equal(arr, x)
    ds = Dataset(df, DOMAIN)
    np.testing.assert_array_equal(ds.to_array(), x)
    assert ds.total == 50
    bad = df.copy()
    bad.loc[3, "c"] = 9
    with pytest.raises(ValueError, match="column 'c'"):
        records_to_array(bad, DOMAIN)


def test_titanic_dataframe_counts() -> None:
    """Real columns in another order than the domain file: counted by name."""
    csv, dom = SHARED_DATA / "titanic.csv", SHARED_DATA / "titanic-domain.json"
    if not (csv.exists() and dom.exists()):
        pytest.skip("shared titanic data not available")
    domain = Domain.from_json(dom)
    df = pd.read_csv(csv)
    assert list(df.columns) != list(domain.attrs)
    cliques = [("Survived", "Sex"), ("Age",), ("Fare", "Pclass", "Embarked")]
    tables = count(df, cliques, domain)
    arr = df[list(domain.attrs)].to_numpy()
    _assert_tables(tables, _manual(arr, cliques, domain))
    assert float(tables[("Age",)].sum()) == len(df) == 1304


def test_load_demo_matches_the_shared_csv() -> None:
    ds = load_demo()
    assert isinstance(ds, Dataset)
    assert ds.total == 48_842 and len(ds.domain) == 14
    assert list(ds.records.columns) == list(ds.domain.attrs)
    arr = ds.to_array()
    assert (arr >= 0).all() and (arr < np.array(ds.domain.shape)).all()
    csv, dom = SHARED_DATA / "adult.csv", SHARED_DATA / "adult-domain.json"
    if not (csv.exists() and dom.exists()):
        pytest.skip("shared adult data not available")
    assert ds.domain == Domain.from_json(dom)
    shared = pd.read_csv(csv)
    pd.testing.assert_frame_equal(ds.records.reset_index(drop=True),
                                  shared[list(ds.domain.attrs)], check_dtype=False)
    t = ds.count([("sex", "income>50K")])[("sex", "income>50K")]
    manual = pd.crosstab(shared["sex"], shared["income>50K"]).to_numpy()
    np.testing.assert_array_equal(t, manual)
    with pytest.raises(ValueError, match="unknown demo data set 'iris'"):
        load_demo("iris")


# ------------------------------------------------------------------------------------------------
# DuckDB (files, out of core) and Spark back ends: tables identical to numpy's
# ------------------------------------------------------------------------------------------------
ADULT_CLIQUES = [("age", "income>50K"), ("sex",), ("income>50K", "sex", "race"),
                 ("race", "sex"), ("education-num", "occupation")]
TITANIC_CLIQUES = [("Survived", "Sex"), ("Age",), ("Fare", "Pclass", "Embarked"),
                   ("Sex", "Survived")]


def _shared(name: str) -> tuple[pd.DataFrame, Domain]:
    csv, dom = SHARED_DATA / f"{name}.csv", SHARED_DATA / f"{name}-domain.json"
    if not (csv.exists() and dom.exists()):
        pytest.skip(f"shared {name} data not available")
    return pd.read_csv(csv), Domain.from_json(dom)


def _assert_equal_tables(result: object, expected: object, cliques: list) -> None:
    assert list(result) == list(cliques)
    for c in cliques:
        assert result[c].dtype == np.float64
        np.testing.assert_array_equal(result[c], expected[c])


@pytest.mark.parametrize("name,cliques", [("adult", ADULT_CLIQUES), ("titanic", TITANIC_CLIQUES)])
def test_duckdb_file_counts_equal_numpy(tmp_path, name: str, cliques: list) -> None:
    df, domain = _shared(name)
    expected = count(df, cliques, domain)
    _assert_equal_tables(count_file(SHARED_DATA / f"{name}.csv", cliques, domain), expected,
                         cliques)
    parquet = tmp_path / f"{name}.parquet"
    df.to_parquet(parquet)
    _assert_equal_tables(count(str(parquet), cliques, domain), expected, cliques)
    _assert_equal_tables(count(parquet, cliques, dict(domain)), expected, cliques)


def test_duckdb_weights_floats_and_globs(tmp_path) -> None:
    x = _records(400, 7)
    w = np.random.default_rng(8).uniform(0, 2, 400)
    df = pd.DataFrame(x, columns=list(DOMAIN)).assign(w=w)
    df[["a", "b", "c", "d"]] = df[["a", "b", "c", "d"]].astype(float)  # integral floats
    df.iloc[:200].to_parquet(tmp_path / "part-0.parquet")
    df.iloc[200:].to_parquet(tmp_path / "part-1.parquet")
    tables = count_file(tmp_path / "part-*.parquet", CLIQUES, DOMAIN, weights="w",
                        format="parquet")
    expected = _manual(x, CLIQUES, DOMAIN, w)
    for c in CLIQUES:
        np.testing.assert_allclose(tables[c], expected[c], rtol=1e-12)
    df.to_csv(tmp_path / "x.csv", index=False)
    _assert_equal_tables(count_file(tmp_path / "x.csv", CLIQUES, DOMAIN, threads=1,
                                    memory_limit="256MB"), _manual(x, CLIQUES, DOMAIN), CLIQUES)


def _bad_frames() -> list[tuple[pd.DataFrame, type, str]]:
    """Records with one bad column each, and the error the SQL back ends must raise."""
    base = pd.DataFrame(_records(30, 9), columns=list(DOMAIN)).astype(float)
    cases = []
    for row, attr, value, err, msg in [
        (3, "c", 4, ValueError, r"column 'c' has 1 code\(s\) outside 0..3 \(min 4, max 4\)"),
        (5, "b", -1, ValueError, r"column 'b' has 1 code\(s\) outside 0..2 \(min -1"),
        (2, "a", np.nan, ValueError, r"column 'a' has 1 missing or non-finite value\(s\)"),
        (9, "c", np.inf, ValueError, "column 'c' has 1 missing or non-finite"),
        (4, "b", 1.5, ValueError, "column 'b' has non-integer value 1.5"),
    ]:
        bad = base.copy()
        bad.loc[row, attr] = value
        cases.append((bad, err, msg))
    cases.append((base.assign(a=["x"] * 30), TypeError, "column 'a' has type"))
    cases.append((base.drop(columns="b"), KeyError, "no column 'b'"))
    return cases


def test_duckdb_invalid_codes_name_the_column(tmp_path) -> None:
    for k, (bad, err, msg) in enumerate(_bad_frames()):
        path = tmp_path / f"bad{k}.parquet"
        bad.to_parquet(path)
        with pytest.raises(err, match=msg):
            count_file(path, CLIQUES, DOMAIN)
    ok = tmp_path / "ok.csv"
    pd.DataFrame(_records(10), columns=list(DOMAIN)).assign(w=-1.0).to_csv(ok, index=False)
    with pytest.raises(ValueError, match="weight column 'w' has 10 negative"):
        count_file(ok, CLIQUES, DOMAIN, weights="w")
    with pytest.raises(TypeError, match="must name a column"):
        count_file(ok, CLIQUES, DOMAIN, weights=np.ones(10))
    with pytest.raises(FileNotFoundError, match="no such file"):
        count_file(tmp_path / "missing.csv", CLIQUES, DOMAIN)
    with pytest.raises(ValueError, match="cannot tell the format"):
        count_file(tmp_path / "x.json", CLIQUES, DOMAIN)


@pytest.fixture(scope="module")
def spark():
    """One local Spark session for this module (start-up takes tens of seconds)."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    session = (pyspark_sql.SparkSession.builder.master("local[1]").appName("numpyro_dpgm-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.driver.memory", "512m").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


SPARK_PANDAS = "ignore:PySpark does not yet fully support pandas:FutureWarning"


@pytest.mark.filterwarnings(SPARK_PANDAS)
def test_spark_counts_equal_numpy(spark) -> None:
    """Titanic in full and 3,000 Adult records (with a weight column): tables as numpy's."""
    df, domain = _shared("titanic")
    _assert_equal_tables(count(spark.createDataFrame(df), TITANIC_CLIQUES, domain),
                         count(df, TITANIC_CLIQUES, domain), TITANIC_CLIQUES)
    adult, domain = _shared("adult")
    adult = adult.iloc[:3000].assign(w=np.random.default_rng(0).uniform(0, 1, 3000))
    tables = count_spark(spark.createDataFrame(adult), ADULT_CLIQUES, domain, weights="w")
    expected = count(adult, ADULT_CLIQUES, domain, weights=adult["w"].to_numpy())
    for c in ADULT_CLIQUES:
        np.testing.assert_allclose(tables[c], expected[c], rtol=1e-12)


@pytest.mark.filterwarnings(SPARK_PANDAS)
def test_spark_invalid_codes_name_the_column(spark) -> None:
    for bad, err, msg in _bad_frames():
        with pytest.raises(err, match=msg):
            count(spark.createDataFrame(bad), CLIQUES, DOMAIN)
    with pytest.raises(TypeError, match="expects a pyspark.sql.DataFrame"):
        count_spark(_records(3), CLIQUES, DOMAIN)
