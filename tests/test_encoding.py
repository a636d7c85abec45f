"""DataFrames of labels <-> integer codes, with given or inferred domains."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from numpyro_dpgm.domain import Domain
from numpyro_dpgm.encoding import decode, domain_spec, encode, read_domain


def _frame():
    return pd.DataFrame({
        "city": ["Oslo", "Bergen", "Oslo", "Tromsø", "Bergen"],
        "band": pd.Categorical(["lo", "hi", "mid", "lo", "lo"], categories=["lo", "mid", "hi",
                                                                            "top"]),
        "member": [True, False, False, True, True],
        "visits": [0, 3, 1, 1, 2],
        "kids": [0.0, 2.0, 1.0, 0.0, 0.0],
    })


def test_inferred_domain_codes_and_round_trip():
    frame = _frame()
    enc = encode(frame)
    assert enc.domain == Domain({"city": 3, "band": 4, "member": 2, "visits": 4, "kids": 3})
    assert enc.categories == {"city": ["Bergen", "Oslo", "Tromsø"],
                              "band": ["lo", "mid", "hi", "top"],  # the dtype's order, unused kept
                              "member": [False, True], "visits": [0, 1, 2, 3],
                              "kids": [0, 1, 2]}
    expected = {"city": [1, 0, 1, 2, 0], "band": [0, 2, 1, 0, 0], "member": [1, 0, 0, 1, 1],
                "visits": [0, 3, 1, 1, 2], "kids": [0, 2, 1, 0, 0]}
    assert enc.codes.to_dict("list") == expected
    assert all(enc.codes.dtypes == np.int64)
    back = decode(enc.codes, enc.domain, enc.categories)
    assert list(back.columns) == list(frame.columns)
    assert all(isinstance(t, pd.CategoricalDtype) for t in back.dtypes)
    for col in frame.columns:
        assert back[col].astype(object).tolist() == frame[col].astype(object).tolist(), col
    assert list(back["band"].cat.categories) == ["lo", "mid", "hi", "top"]
    # encoding the decoded frame gives the same codes, domain and labels
    again = encode(back)
    assert again.codes.equals(enc.codes) and again.domain == enc.domain
    assert again.categories == enc.categories


def test_given_domain_with_labels_and_sizes():
    frame = _frame()
    spec = {"visits": 6, "city": ["Tromsø", "Oslo", "Bergen", "Stavanger"], "band": 4}
    enc = encode(frame, spec)
    assert list(enc.domain.items()) == [("visits", 6), ("city", 4), ("band", 4)]
    assert enc.codes["city"].tolist() == [1, 2, 1, 0, 2]
    assert enc.categories["visits"] == list(range(6))
    assert enc.categories["city"] == spec["city"]
    # a Domain and categories= together, and integers treated as labels
    enc = encode(frame, Domain({"member": 2, "visits": 4}),
                 categories={"member": [True, False]})
    assert enc.codes["member"].tolist() == [0, 1, 1, 0, 0]
    enc = encode(pd.DataFrame({"year": [1990, 2020, 1990]}), integers="labels")
    assert enc.categories == {"year": [1990, 2020]} and enc.codes["year"].tolist() == [0, 1, 0]


@pytest.mark.parametrize("spec,message", [
    ({"city": ["Oslo", "Bergen"]}, "column 'city' has value 'Tromsø' (row 3) outside its domain"),
    ({"visits": 3}, "column 'visits' has code 3 (row 1) outside its domain 0 … 2"),
    ({"city": 3}, "column 'city' holds labels but the domain gives only its size"),
    ({"band": 3}, "categorical with 4 categories but the domain gives 3"),
    ({"height": 3}, "no column 'height'"),
    ({"member": [True, True]}, "listed twice"),
])
def test_given_domain_errors_name_column_and_value(spec, message):
    with pytest.raises((ValueError, KeyError)) as err:
        encode(_frame(), spec)
    assert message in str(err.value)


def test_bad_columns():
    with pytest.raises(ValueError, match="column 'x' has 1 missing value"):
        encode(pd.DataFrame({"x": ["a", None, "b"]}))
    with pytest.raises(ValueError, match="column 'x' has the negative code -1"):
        encode(pd.DataFrame({"x": [0, -1]}))
    with pytest.raises(ValueError, match="non-integer number 1.5"):
        encode(pd.DataFrame({"x": [0.0, 1.5]}))
    with pytest.raises(TypeError, match="mixes label types"):
        encode(pd.DataFrame({"x": ["a", 1]}, dtype=object))
    with pytest.raises(TypeError, match="DataFrame"):
        encode(np.zeros((2, 2)))


def test_decode_checks_codes_and_labels():
    dom = Domain({"a": 2, "b": 3})
    frame = decode(np.array([[0, 2], [1, 0]]), dom, {"a": ["x", "y"]})
    assert frame["a"].tolist() == ["x", "y"] and frame["b"].tolist() == [2, 0]
    with pytest.raises(ValueError, match="column 'b' has 1 code"):
        decode(np.array([[0, 3]]), dom, {})
    with pytest.raises(ValueError, match="3 values but 2 labels"):
        decode(np.array([[0, 1]]), dom, {"b": ["p", "q"]})


def test_read_domain(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"Sex": ["female", "male"], "Age": 91}))
    dom, cats = read_domain(path)
    assert list(dom.items()) == [("Sex", 2), ("Age", 91)] and cats == {"Sex": ["female", "male"]}
    assert domain_spec({"a": 2}) == (Domain({"a": 2}), {})
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_domain(path)
    path.write_text(json.dumps({"a": "abc"}))
    with pytest.raises(ValueError, match="number of values or a list of labels"):
        read_domain(path)


def test_titanic_codes_are_kept():
    frame = pd.read_csv(SHARED_DATA / "titanic.csv")
    dom, cats = read_domain(SHARED_DATA / "titanic-domain.json")
    enc = encode(frame, dom)
    assert enc.domain == dom and cats == {}
    for a in dom:
        np.testing.assert_array_equal(enc.codes[a].to_numpy(), frame[a].to_numpy())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "ç", "d d"]), st.integers(0, 4),
                          st.booleans()), min_size=1, max_size=30))
def test_round_trip_property(rows):
    frame = pd.DataFrame(rows, columns=["s", "i", "b"])
    enc = encode(frame)
    back = decode(enc.codes, enc.domain, enc.categories)
    for col in frame.columns:
        assert back[col].astype(object).tolist() == frame[col].tolist()
    assert enc.domain["i"] == frame["i"].max() + 1
