"""Domains: order, sizes, validation and the JSON format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from numpyro_dpgm import Domain


def test_order_sizes_and_queries() -> None:
    d = Domain({"b": 3, "a": 2, "c": 4})
    assert list(d) == ["b", "a", "c"] and d.attrs == ("b", "a", "c")
    assert d.shape == (3, 2, 4) and len(d) == 3
    assert d["c"] == 4 and "a" in d and "z" not in d
    assert d.index("a") == 1
    assert d.size() == 24 and d.size(("c", "b")) == 12 and d.size(()) == 1
    assert d.shape_of(("c", "b")) == (4, 3)
    assert d.project(("c", "b")).attrs == ("c", "b")
    assert d.project("a") == Domain({"a": 2})
    assert d.sorted(("c", "a", "b")) == ("b", "a", "c")
    assert d.check("a") == ("a",)
    assert Domain(d) == d and hash(Domain(d)) == hash(d)
    assert Domain({"a": 2, "b": 3}) != Domain({"b": 3, "a": 2})  # order matters
    assert Domain({"a": 2}) != Domain({"a": 3})
    assert eval(repr(d)) == d


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="'a'.*at least 1"):
        Domain({"a": 0})
    with pytest.raises(TypeError, match="'a'.*integer"):
        Domain({"a": 2.5})
    with pytest.raises(TypeError, match="non-empty strings"):
        Domain({3: 2})
    with pytest.raises(TypeError, match="non-empty strings"):
        Domain({"": 2})
    with pytest.raises(TypeError, match="mapping"):
        Domain([("a", 2)])


def test_unknown_attribute_messages() -> None:
    d = Domain({"a": 2, "b": 3})
    with pytest.raises(KeyError, match=r"unknown attribute\(s\) \['z'\].*\['a', 'b'\]"):
        d["z"]
    with pytest.raises(KeyError, match=r"\['x', 'y'\]"):
        d.check(("a", "x", "y"))
    with pytest.raises(KeyError, match="'z'"):
        d.size(("z",))
    with pytest.raises(KeyError, match="'z'"):
        d.index("z")


def test_check_clique() -> None:
    d = Domain({"a": 2, "b": 3, "c": 4})
    assert d.check_clique("a") == ("a",)
    assert d.check_clique(["c", "a"]) == ("c", "a")
    with pytest.raises(ValueError, match="empty clique"):
        d.check_clique(())
    with pytest.raises(ValueError, match=r"repeats attribute\(s\) \['a'\]"):
        d.check_clique(("a", "b", "a"))
    with pytest.raises(KeyError, match="'q'"):
        d.check_clique(("a", "q"))
    with pytest.raises(TypeError, match="tuple of attribute names"):
        d.check_clique(5)


def test_json_round_trip(tmp_path: Path) -> None:
    d = Domain({"z": 5, "a": 1, "m": 2})
    path = tmp_path / "domain.json"
    d.to_json(path)
    assert json.loads(path.read_text()) == {"z": 5, "a": 1, "m": 2}
    assert Domain.from_json(path) == d
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="one JSON object"):
        Domain.from_json(bad)


@pytest.mark.parametrize("name", ["adult", "titanic"])
def test_shared_domain_files(name: str) -> None:
    path = SHARED_DATA / f"{name}-domain.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    raw = json.loads(path.read_text())
    d = Domain.from_json(path)
    assert list(d.attrs) == list(raw) and list(d.shape) == list(raw.values())
    if name == "adult":
        assert len(d) == 14 and d["age"] == 85 and d["income>50K"] == 2
        assert d.size() == 85 * 9 * 100 * 16 * 7 * 15 * 6 * 5 * 2 * 100 * 100 * 99 * 42 * 2
    else:
        assert d.attrs[0] == "Survived" and d["Age"] == 91 and len(d) == 9
