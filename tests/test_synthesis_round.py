"""Synthetic data by rounding expected counts: exact counts against the exact oracle's marginals,
exact totals, reproducible records, trees, forests, cycles, unmodelled attributes, bad input."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from numpyro_dpgm import MarkovNetwork, MarkovRandomField, synthesize
from numpyro_dpgm.cli import app
from numpyro_dpgm.io import save_model
from numpyro_dpgm.oracles import marginal
from numpyro_dpgm.oracles.rounding import (
    RoundingMemoryError,
    round_counts,
    round_records,
    rounding_order,
)
from numpyro_dpgm.synthesis import (
    SAMPLE_CHUNK,
    UnmodelledAttributesWarning,
    iter_synthetic_chunks,
)

DOMAIN = {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2}
#: a chain and a separate pair (a forest); a 4-cycle a-b-c-d (triangulated: two triangles with a
#: separator of two attributes) with a pendant e; a triangle (one clique adding three attributes)
STRUCTURES = {
    "forest": [("a", "b"), ("b", "c"), ("d", "e")],
    "cycle": [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("d", "e")],
    "triangle": [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "e")],
}


def _model(structure: str, seed: int = 0) -> MarkovRandomField:
    net = MarkovNetwork(DOMAIN, STRUCTURES[structure])
    return MarkovRandomField(net, 1.5 * jax.random.normal(jax.random.key(seed),
                                                          (net.num_params,)))


def _counts(codes: np.ndarray, net: MarkovNetwork, attrs: tuple) -> np.ndarray:
    table = np.zeros(net.domain.shape_of(attrs))
    np.add.at(table, tuple(codes[:, net.domain.index(a)] for a in attrs), 1)
    return table


def _assert_rounded(codes: np.ndarray, model: MarkovRandomField) -> None:
    """Every attribute's counts within every parent group are the floor or the ceiling of
    ``n_g · p(x | g)``, with ``p`` from the exact oracle and ``n_g`` the group's records."""
    net = model.network
    for a, parents in rounding_order(net):
        joint = np.asarray(marginal(net, model.theta, parents + (a,)))
        cond = joint / joint.sum(axis=-1, keepdims=True)
        counts = _counts(codes, net, parents + (a,))
        expected = counts.sum(axis=-1, keepdims=True) * cond
        assert np.all(counts >= np.floor(expected - 1e-9)), (a, parents)
        assert np.all(counts <= np.ceil(expected + 1e-9)), (a, parents)


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_counts_are_the_rounded_expected_counts(structure):
    model = _model(structure)
    codes = round_records(model.network, model.theta, jax.random.key(1), 1001)
    assert codes.shape == (1001, 5)
    _assert_rounded(codes, model)
    # the first attribute's one-way counts are within 1 of N·p
    first, parents = rounding_order(model.network)[0]
    assert parents == ()
    p = np.asarray(model.marginal((first,)))
    assert np.all(np.abs(_counts(codes, model.network, (first,)) - 1001 * p) < 1)


def test_rounding_order_follows_the_junction_tree():
    net = _model("triangle").network
    # the root clique (a, b, c) adds its attributes one at a time, then d | c and e | d
    assert rounding_order(net) == (("a", ()), ("b", ("a",)), ("c", ("a", "b")),
                                   ("d", ("c",)), ("e", ("d",)))
    order = rounding_order(_model("cycle").network)
    assert sorted(a for a, _ in order) == sorted(DOMAIN)
    assert max(len(p) for _, p in order) == 2  # the triangulated cycle's separator


def test_a_single_table_gets_its_exact_counts():
    net = MarkovNetwork({"a": 3}, [("a",)])
    theta = np.log(np.array([0.5, 0.3, 0.2]))
    codes = round_records(net, theta, jax.random.key(0), 10)
    np.testing.assert_array_equal(np.bincount(codes[:, 0], minlength=3), [5, 3, 2])
    codes = round_records(net, theta, jax.random.key(0), 11)  # 5.5, 3.3, 2.2: one extra
    counts = np.bincount(codes[:, 0], minlength=3)
    assert counts.sum() == 11 and np.all((counts >= [5, 3, 2]) & (counts <= [6, 4, 3]))


def test_round_counts_floors_and_hands_out_the_remainder_by_fractional_parts():
    rng = np.random.default_rng(0)
    probs = np.array([[0.25, 0.25, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]])
    counts = round_counts(probs, np.array([4, 7]), rng)
    np.testing.assert_array_equal(counts[0], [1, 1, 2, 0])  # integral expected counts: exact
    assert counts[1].sum() == 7
    assert np.all((counts[1] >= [0, 1, 2, 2]) & (counts[1] <= [1, 2, 3, 3]))
    # one record to hand out: the cell is drawn with probabilities ∝ the fractional parts
    rows = 20_000
    counts = round_counts(np.tile([0.25, 0.25, 0.5, 0.0], (rows, 1)), np.ones(rows, int), rng)
    assert np.all(counts.sum(axis=1) == 1) and not counts[:, 3].any()
    np.testing.assert_allclose(counts.mean(axis=0), [0.25, 0.25, 0.5, 0], atol=0.015)


def test_same_key_same_records_and_a_new_key_other_records():
    model = _model("cycle")
    first = synthesize(model, 500, rng_key=3, sampling="round")
    pd.testing.assert_frame_equal(first, synthesize(model, 500, rng_key=3, sampling="round"))
    pd.testing.assert_frame_equal(
        first, synthesize(model, 500, rng_key=jax.random.key(3), sampling="round"))
    other = synthesize(model, 500, rng_key=4, sampling="round")
    assert not first.equals(other)
    _assert_rounded(other.to_numpy(), model)


def test_chunks_of_a_rounded_data_set_concatenate_to_it():
    model = _model("forest")
    num = SAMPLE_CHUNK + 1234
    whole = synthesize(model, num, rng_key=0, sampling="round")
    chunks = list(iter_synthetic_chunks(model, num, rng_key=0, sampling="round"))
    assert [(c.start, len(c.frame), c.last) for c in chunks] == \
        [(0, SAMPLE_CHUNK, False), (SAMPLE_CHUNK, 1234, True)]
    pd.testing.assert_frame_equal(pd.concat([c.frame for c in chunks]), whole)
    _assert_rounded(whole.to_numpy(), model)


def test_posterior_draws_each_rounded_from_its_own_model():
    net = MarkovNetwork(DOMAIN, STRUCTURES["forest"])
    theta = jax.random.normal(jax.random.key(5), (3, net.num_params))
    sets = synthesize(MarkovRandomField(net, theta), 300, num_datasets=3, rng_key=0,
                      sampling="round")
    for j, frame in enumerate(sets):
        _assert_rounded(frame.to_numpy(), MarkovRandomField(net, theta[j]))


def test_unmodelled_attributes_are_rounded_uniform_as_the_sampler_makes_them():
    net = MarkovNetwork({**DOMAIN, "f": 3}, STRUCTURES["forest"])
    model = MarkovRandomField(net, jax.random.normal(jax.random.key(2), (net.num_params,)))
    with pytest.warns(UnmodelledAttributesWarning, match=r"\['f'\]"):
        frame = synthesize(model, 100, rng_key=0, sampling="round")
    # uniform: 100 / 3 records expected in each value
    assert sorted(frame["f"].value_counts()) == [33, 33, 34]
    _assert_rounded(frame.to_numpy(), model)
    dropped = synthesize(model, 100, rng_key=0, sampling="round", drop_unmodelled=True)
    assert list(dropped.columns) == list(DOMAIN)


def test_labels_and_columns_as_for_sampling():
    model = _model("forest")
    frame = synthesize(model, 50, rng_key=0, sampling="round", columns=["c", "a"],
                       categories={"a": ["x", "y"]})
    assert list(frame.columns) == ["c", "a"] and frame["a"].dtype.name == "category"
    assert set(frame["a"]) <= {"x", "y"}


def test_point_models_are_sampled_unless_told():
    model = _model("forest")
    sampled = synthesize(model, 200, rng_key=0)
    pd.testing.assert_frame_equal(sampled, synthesize(model, 200, rng_key=0, sampling="sample"))
    assert not sampled.equals(synthesize(model, 200, rng_key=0, sampling="round"))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"sampling": "floor"}, ValueError, r"sampling must be one of \['sample', 'round'\]"),
    ({"sampling": "round", "num_records": 10**13}, RoundingMemoryError,
     "draw them by sampling instead"),
    ({"sampling": "round", "num_records": 0}, ValueError, "positive integer"),
])
def test_bad_input(kwargs, error, message):
    args = {"num_records": 10, "rng_key": 0, **kwargs}
    with pytest.raises(error, match=message):
        synthesize(_model("forest"), **args)


def test_round_records_bad_input():
    model = _model("forest")
    net = model.network
    with pytest.raises(ValueError, match="positive integer"):
        round_records(net, model.theta, jax.random.key(0), 0)
    with pytest.raises(ValueError, match=r"theta has shape \(2, 18\)"):
        round_records(net, np.zeros((2, net.num_params)), jax.random.key(0), 5)
    with pytest.raises(RoundingMemoryError, match="GiB at once"):
        round_records(net, model.theta, jax.random.key(0), 10**13)
    with pytest.raises(ValueError, match=r"got shapes \(3,\) and \(3,\)"):
        round_counts(np.ones(3) / 3, np.ones(3, int), np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------
# dpgm synth --sampling
# ------------------------------------------------------------------------------------------------
def test_cli_rounds_a_model_file_on_request(tmp_path):
    model = _model("triangle")
    path = save_model(tmp_path / "model.json", model, total=777)
    runner = CliRunner()
    res = runner.invoke(app, ["synth", str(path), "--seed", "0", "--sampling", "round",
                              "-o", str(tmp_path / "r.csv")])
    assert res.exit_code == 0, res.output
    assert "rounded 1 data set(s) of 777 records" in res.output
    frame = pd.read_csv(tmp_path / "r.csv")
    pd.testing.assert_frame_equal(frame, synthesize(model, 777, rng_key=0, sampling="round"))
    _assert_rounded(frame[list(DOMAIN)].to_numpy(), model)
    res = runner.invoke(app, ["synth", str(path), "--seed", "0", "--sampling", "floor",
                              "-o", str(tmp_path / "f.csv")])
    assert res.exit_code == 2 and "--sampling must be sample or round" in res.output
    assert not (tmp_path / "f.csv").exists()


def test_a_tiny_fraction_needs_no_warning_and_a_zero_cell_gets_nothing():
    # the key log(u) / frac of a fraction of 3e-311 overflows; it is clamped, silently
    probs = np.tile([0.0, 0.5, 0.5, 1e-311], (200, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counts = round_counts(probs, np.full(200, 3), np.random.default_rng(1))
    assert np.all(counts.sum(axis=1) == 3) and not counts[:, 0].any()
    assert np.all((counts[:, 1:3] >= 1) & (counts[:, 1:3] <= 2))
