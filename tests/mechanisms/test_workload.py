"""Workloads, AIM's candidate weights, the workload error, and MST's domain compression."""

from __future__ import annotations

import itertools
import math

import jax
import numpy as np
import pytest

from numpyro_dpgm import Domain, Gaussian, MarkovNetwork, MarkovRandomField, Measurement
from numpyro_dpgm.mechanisms import (
    all_marginals,
    candidate_weights,
    check_workload,
    compress_domain,
    downward_closure,
    target_marginals,
    workload_error,
)

DOM = Domain({"a": 2, "b": 3, "c": 4, "d": 50})


def test_built_in_workloads_respect_the_cell_cap():
    w = all_marginals(DOM, 2, max_cells=100)
    assert [c for c, _ in w] == [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c")]
    assert {wt for _, wt in w} == {1.0}
    t = target_marginals(DOM, "c", 3, max_cells=500)  # (b, c, d) has 600 cells
    assert [c for c, _ in t] == [("a", "b", "c"), ("a", "c", "d")]
    assert len(all_marginals(DOM, 9)) == 1  # a degree beyond d means all attributes


def test_candidate_weights_are_the_overlap_sums_of_the_paper():
    w = check_workload([(("a", "b"), 2.0), ("b", "c")], DOM)
    weights = candidate_weights(w)
    assert set(weights) == {("a",), ("b",), ("c",), ("a", "b"), ("b", "c")}
    # w_r = Σ_s c_s |r ∩ s|
    assert weights[("b",)] == 2.0 * 1 + 1.0 * 1
    assert weights[("a", "b")] == 2.0 * 2 + 1.0 * 1
    assert weights[("c",)] == 1.0
    assert downward_closure([("a", "b", "c")])[:3] == [("a",), ("b",), ("c",)]
    assert len(downward_closure([("a", "b", "c")])) == 7


def test_workload_error_of_model_tables_and_uniform():
    tables = {("a", "b"): np.array([[10.0, 0, 0], [0, 0, 10.0]])}
    # uniform: ½ Σ |1/6 − p| = ½ (2·(½ − 1/6) + 4/6) = 2/3
    assert workload_error(None, tables) == pytest.approx(2 / 3, rel=1e-12)
    assert workload_error({("a", "b"): tables[("a", "b")] * 3}, tables) == 0.0
    net = MarkovNetwork(Domain({"a": 2, "b": 3}), [("a", "b")])
    model = MarkovRandomField(net, np.zeros(net.num_params))
    assert workload_error(model, tables) == pytest.approx(2 / 3, rel=1e-12)
    assert workload_error(None, tables, {("a", "b"): 3.0}) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("workload, error, match", [
    ([("a", "zz")], KeyError, "zz"),
    ([], ValueError, "empty"),
    ([("a", "b"), ("b", "a")], ValueError, "twice"),
    ([(("a", "b"), -1.0)], ValueError, "weight"),
    ("ab", TypeError, "workload"),
])
def test_bad_workloads(workload, error, match):
    with pytest.raises(error, match=match):
        check_workload(workload, DOM)


def test_bad_built_in_workloads():
    with pytest.raises(KeyError, match="unknown target column 'zz'"):
        target_marginals(DOM, "zz")
    with pytest.raises(ValueError, match="degree"):
        all_marginals(DOM, 0)
    with pytest.raises(ValueError, match="cells"):
        all_marginals(DOM, 2, max_cells=3)


# ------------------------------------------------------------------------------------------------
# compression
# ------------------------------------------------------------------------------------------------
def _measure(y: list[float], sigma: float = 1.0) -> Measurement:
    return Measurement(("x",), np.array(y), Gaussian(sigma))


def test_rare_values_are_merged_and_the_measurement_keeps_its_noise():
    dom = Domain({"x": 5})
    comp, (m,) = compress_domain([_measure([100.0, 2.0, 50.0, 1.0, 0.0])], dom)
    assert comp.domain == Domain({"x": 3})
    assert comp.groups["x"] == ((0,), (2,), (1, 3, 4))
    np.testing.assert_allclose(m.values, [100.0, 50.0, 3.0 / math.sqrt(3)])
    np.testing.assert_allclose(np.diag(m.query), [1.0, 1.0, 1.0 / math.sqrt(3)])
    assert m.noise == Gaussian(1.0)
    np.testing.assert_array_equal(comp.code_map("x"), [0, 2, 1, 2, 2])
    np.testing.assert_allclose(comp.aggregate(np.arange(5.0), ("x",)), [0.0, 2.0, 1 + 3 + 4])
    # nothing to merge: the measurement is returned as it is
    same = _measure([10.0, 10.0])
    comp2, (m2,) = compress_domain([same], Domain({"x": 2}))
    assert m2 is same and comp2.domain == Domain({"x": 2}) and comp2.compressed == ()


def test_encode_and_decode():
    dom = Domain({"x": 5, "y": 2})
    comp, _ = compress_domain([_measure([100.0, 2.0, 50.0, 1.0, 0.0]),
                               Measurement(("y",), np.array([9.0, 9.0]), Gaussian(1.0))], dom)
    records = np.array([[0, 1], [1, 0], [2, 1], [3, 1], [4, 0]])
    codes = comp.encode(records)
    np.testing.assert_array_equal(codes, [[0, 1], [2, 0], [1, 1], [2, 1], [2, 0]])
    back = comp.decode(np.repeat(codes, 3000, axis=0), np.random.default_rng(0))
    kept = np.repeat(records, 3000, axis=0)[:, 0]
    np.testing.assert_array_equal(back[kept == 0, 0], 0)
    np.testing.assert_array_equal(back[kept == 2, 0], 2)
    merged = back[np.isin(kept, [1, 3, 4]), 0]
    assert set(np.unique(merged)) == {1, 3, 4}
    freq = np.bincount(merged, minlength=5)[[1, 3, 4]] / merged.size
    np.testing.assert_allclose(freq, 1 / 3, atol=0.02)  # 9,000 draws: 4.5 standard errors
    np.testing.assert_array_equal(back[:, 1], np.repeat(records, 3000, axis=0)[:, 1])


def test_decompressed_model_spreads_merged_values_uniformly():
    dom = Domain({"x": 5, "y": 2})
    comp, _ = compress_domain([_measure([100.0, 2.0, 50.0, 1.0, 0.0]),
                               Measurement(("y",), np.array([9.0, 9.0]), Gaussian(1.0))], dom)
    net = MarkovNetwork(comp.domain, [("x", "y")])
    theta = jax.random.normal(jax.random.key(0), (net.num_params,))
    small = MarkovRandomField(net, theta)
    big = comp.decompress_model(small)
    p_small = np.asarray(small.marginal(("x", "y")))
    p_big = np.asarray(big.marginal(("x", "y")))
    for x, y in itertools.product(range(5), range(2)):
        c = comp.code_map("x")[x]
        assert p_big[x, y] == pytest.approx(p_small[c, y] / len(comp.groups["x"][c]), rel=1e-9)
    # batched draws decompress too
    draws = MarkovRandomField(net, jax.random.normal(jax.random.key(1), (3, net.num_params)))
    assert comp.decompress_model(draws).batch_shape == (3,)
