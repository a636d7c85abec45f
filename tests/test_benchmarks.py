"""The benchmarks' registry and their shared harness and workloads (nothing long is run here)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import doctest
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

# the benchmarks live beside the package, in a source checkout (conftest puts its root on sys.path)
ROOT = Path(__file__).resolve().parents[1]

import benchmarks  # noqa: E402
from benchmarks import harness, workloads  # noqa: E402
from benchmarks.__main__ import main as bench_main  # noqa: E402

NAMES = {"appgm", "appgm_scale", "bayes", "cgm", "cgm_defaults", "cli_cache", "collapsed", "cores",
         "compile_time", "converge", "coverage", "coverage_user", "em_variants", "gibbs",
         "mechanisms", "naive_l2", "nuts_fit", "oracle", "rhat_floor", "scale", "stopping",
         "synth_memory", "user_model"}
SHARED = {"harness", "workloads"}


def test_every_benchmark_is_listed_and_the_shared_modules_are_not() -> None:
    assert set(benchmarks.BENCHMARKS) == NAMES
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_main(["--list"]) == 0
    listing = out.getvalue().split("benchmarks:\n", 1)[1]
    listed = {line.split()[0] for line in listing.splitlines()}
    assert listed == NAMES


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_benchmark_imports_only_the_shared_modules(name: str) -> None:
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    local = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            local |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            local.add(node.module.removeprefix("benchmarks").lstrip(".") or "")
        elif isinstance(node, ast.Import):
            local |= {a.name.removeprefix("benchmarks.") for a in node.names
                      if a.name.startswith("benchmarks.")}
    assert local <= SHARED, f"{name} imports {sorted(local - SHARED)}"


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_benchmark_parses_its_defaults(name: str) -> None:
    module = benchmarks.load(name)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([])
    assert args.out == Path("bench-results")
    assert callable(module.main)


def test_unknown_benchmark_is_refused() -> None:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert bench_main(["no_such_benchmark"]) == 2
    assert "unknown benchmark 'no_such_benchmark'" in err.getvalue()
    with pytest.raises(KeyError, match="unknown benchmark"):
        benchmarks.load("harness")


# ------------------------------------------------------------------------------------------------
# harness
# ------------------------------------------------------------------------------------------------
def test_harness_examples_run() -> None:
    failed, tried = doctest.testmod(harness, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried >= 3 and failed == 0


def test_json_default_writes_numpy_scalars_and_refuses_the_rest() -> None:
    assert harness.json_default(np.int32(7)) == 7
    assert type(harness.json_default(np.int32(7))) is int
    assert harness.json_default(np.float64(0.25)) == 0.25
    assert harness.json_default(np.float32(-np.inf)) == "-inf"
    with pytest.raises(TypeError, match="not JSON serialisable: set"):
        harness.json_default({1})


def test_write_results_writes_the_record_and_the_union_of_columns(tmp_path: Path) -> None:
    record = {"benchmark": "x", "value": np.float64(1.5), "n": np.int64(2)}
    rows = [{"a": 1, "b": 2.5}, {"a": 3, "c": "z"}]
    paths = harness.write_results(tmp_path / "out", "x-cpu", record, rows)
    assert paths == [tmp_path / "out" / "x-cpu.json", tmp_path / "out" / "x-cpu.csv"]
    assert json.loads(paths[0].read_text()) == {"benchmark": "x", "value": 1.5, "n": 2}
    with open(paths[1], newline="") as f:
        assert list(csv.reader(f)) == [["a", "b", "c"], ["1", "2.5", ""], ["3", "", "z"]]
    # no rows: the JSON only
    assert harness.write_results(tmp_path / "none", "y", {}, []) == [tmp_path / "none" / "y.json"]
    assert not (tmp_path / "none" / "y.csv").exists()


def test_new_record_holds_the_common_fields_first() -> None:
    rec = harness.new_record("scale", {"seed": 0}, workloads=[])
    assert list(rec) == ["benchmark", "command", "date_utc", "machine", "settings",
                         "load_average_start", "workloads"]
    assert rec["benchmark"] == "scale" and rec["settings"] == {"seed": 0}
    assert rec["command"].startswith("python -m benchmarks scale")
    assert set(rec["machine"]) == {"cpu", "logical_cores", "memory_gib", "os", "python",
                                   "jax_backend", "jax_devices", "versions"}
    assert set(rec["machine"]["versions"]) == set(harness.VERSIONS)
    assert set(harness.platform_summary()) == {"machine", "processor", "jax", "devices"}


def test_load_average_is_rounded() -> None:
    load = harness.load_average()
    assert load is not None and len(load) == 3
    assert all(round(x, 2) == x for x in load)
    assert math.isnan(harness.load_1min()) or round(harness.load_1min(), 2) == harness.load_1min()


def test_timers_time_first_and_later_calls() -> None:
    calls = []

    def fn() -> int:
        calls.append(1)
        return len(calls)

    seconds, out = harness.timed(fn)
    assert out == 1 and seconds >= 0
    summary = harness.interleaved({"a": fn, "b": lambda: 0}, 3)
    assert len(calls) == 1 + 1 + 3  # the timed call, one warm call, three rounds
    assert set(summary) == {"a", "b"}
    assert summary["a"]["repeats"] == 3
    assert summary["a"]["min_ms"] <= summary["a"]["median_ms"]
    assert harness.summary_ms([0.002]) == {"median_ms": 2.0, "min_ms": 2.0, "q1_ms": 2.0,
                                           "q3_ms": 2.0, "repeats": 1}


# ------------------------------------------------------------------------------------------------
# workloads
# ------------------------------------------------------------------------------------------------
def test_mutual_information_is_exact() -> None:
    x = np.array([0, 0, 1, 1])
    independent = np.stack([x, np.array([0, 1, 0, 1])], axis=1)
    assert workloads.mutual_information(independent, [2, 2], 0, 1) == pytest.approx(0.0,
                                                                                    abs=1e-15)
    copy = np.stack([x, x], axis=1)
    assert workloads.mutual_information(copy, [2, 2], 0, 1) == pytest.approx(math.log(2))


def test_tree_and_three_way_workloads() -> None:
    # four columns: 0 and 1 copies, 2 a noisy copy of 1, 3 independent of all
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 400)
    noisy = np.where(rng.random(400) < 0.1, 1 - a, a)
    records = np.stack([a, a, noisy, rng.integers(0, 2, 400)], axis=1)
    wl = workloads.tree_workload(records, ["p", "q", "r", "s"], [2, 2, 2, 2])
    assert wl.name == "tree" and wl.query == workloads.QUERY
    assert wl.cliques[:4] == (("p",), ("q",), ("r",), ("s",))
    pairs = wl.cliques[4:]
    assert len(pairs) == 3 + 2  # the spanning tree of 4 nodes and the next 2 pairs
    assert pairs[0] == ("p", "q")  # the highest mutual information first
    three = workloads.three_way_workload(["a", "b", "c", "d"])
    assert three.cliques == (("a", "b", "c"), ("b", "c", "d"))


def test_adult_workloads_by_name() -> None:
    from numpyro_dpgm import load_demo

    adult = load_demo()
    tree = workloads.adult_workload("tree", adult)
    assert tree == workloads.tree_workload(adult.to_array(), adult.domain.attrs,
                                           adult.domain.shape)
    assert len(tree.cliques) == 14 + 13 + 2
    three = workloads.adult_workload("3way", adult)
    assert len(three.cliques) == 12 and three.query == workloads.QUERY
    with pytest.raises(ValueError, match="unknown workload 'star'"):
        workloads.adult_workload("star", adult)


def test_seed002_release_is_the_reproduction_model() -> None:
    from studies.bernstein2017 import dirichlet_theta, model_edges

    net, truth, meas, b = workloads.seed002_release("chain3", 2, 5, 50, 2.0)
    assert list(net.cliques) == model_edges("chain3")
    assert net.domain.shape == (2,) * 10
    np.testing.assert_array_equal(np.asarray(truth.theta),
                                  dirichlet_theta(net, np.random.default_rng(5)))
    assert b == 24 / 2.0
    assert [m.clique for m in meas] == list(net.cliques)
    assert all(m.noise.scale == b for m in meas)
    # seed002_records are the records released: the same noise key gives the same values
    import jax

    from numpyro_dpgm.privacy import simulate_release

    records = workloads.seed002_records(truth, 5, 50)
    assert records.shape == (50, 10)
    again = simulate_release(records, list(net.cliques), 2.0, jax.random.key(1005),
                             domain=net.domain)
    for m, m2 in zip(meas, again, strict=True):
        np.testing.assert_array_equal(m.values, m2.values)


def test_converge_verdicts_from_curves() -> None:
    """The error-against-time verdicts read the curves as stated: the least time to an error,
    the best error within a time, and the default against mbi's best final error."""
    from benchmarks import converge

    curve = [(50, 1.0, 0.30), (100, 2.0, 0.20), (150, 3.0, 0.25)]
    assert converge.time_to_reach(curve, 0.21) == 2.0
    assert converge.time_to_reach(curve, 0.1) is None
    assert converge.error_at(curve, 2.5) == 0.20 and converge.error_at(curve, 0.5) is None
    ours = {"library": "numpyro_dpgm", "contender": "prox_pgm defaults", "l1": 0.204,
            "seconds": 1.5, "curve": [(25, 0.5, 0.4), (300, 1.5, 0.204)]}
    slow = {"library": "mbi", "contender": "A", "l1": 0.25, "seconds": 3.0, "curve": curve}
    best = {"library": "mbi", "contender": "B", "l1": 0.20, "seconds": 2.0,
            "curve": [(50, 1.0, 0.5), (100, 2.0, 0.20)]}
    v = converge.verdict([ours, slow, best])
    assert v["mbi_best"] == "B" and v["error_target_met"] and v["faster_to_target"]
    assert v["time_to_within_5pct_ours"] == 1.5 and v["time_to_within_5pct_mbi"] == 2.0
    assert v["mbi_l1_at_our_time"] == 0.5
    assert converge.verdict([ours]) is None
    truth = {("a",): np.array([3.0, 1.0])}
    assert converge.l1_error({("a",): np.array([2.0, 2.0])}, truth, 4.0) == 0.5


def test_stopping_runs_and_writes_one_row_per_rule(tmp_path: Path) -> None:
    """``python -m benchmarks stopping`` on two releases of the smallest problem: a row per
    rule, errors against the records' true tables, the least one marked."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_main(["stopping", "--releases", "2", "--problems", "cycle",
                           "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "stopping.json").read_text())
    rows = record["rows"]
    assert [r["rule"] for r in rows] == ["optimum", "discrepancy", "risk"]
    assert sum(r["best"] for r in rows) == 1
    assert all(0 < r["l1_mean"] < 2 for r in rows)
    with pytest.raises(SystemExit, match="--problems"):
        bench_main(["stopping", "--problems", "nope", "--out", str(tmp_path)])


def _one_small_release(name: str, tmp_path: Path, *options: str) -> dict:
    """Run benchmark ``name`` on one Laplace release (Erdős–Rényi, N = 500, ε = 1) with
    ``options``; return its JSON record."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert bench_main([name, "--data", "er", "--sizes", "500", "--epsilons", "1",
                           "--seeds", "1", *options, "--out", str(tmp_path)]) == 0
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_cgm_defaults_compares_every_setting_with_naive_on_the_same_release(
        tmp_path: Path) -> None:
    """``python -m benchmarks cgm_defaults`` on one small release: one row per release with an
    error and a time per setting and for naive MLE; one EM iteration from the naive fit with
    one NLBP step cannot be exactly naive's fit, nor the same as ten iterations (``1:1:1``
    against ``1:1:10``), and each error is a KL (non-negative). (``4:3`` takes the iteration
    count of least estimated risk, which may be 0, naive's own fit.)"""
    record = _one_small_release("cgm_defaults", tmp_path, "--configs", "1:1:10", "4:3", "1:1:1")
    (row,) = record["rows"]
    assert row["data"] == "er N=500" and row["epsilon"] == 1.0
    assert row["1:1:1 error"] != row["1:1:10 error"]
    for label in ("naive", "1:1:10", "4:3", "1:1:1"):
        assert row[f"{label} error"] >= 0 and row[f"{label} s"] > 0
        assert 0 < row[f"{label} released L1"] < 2
    assert 0 < row["noisy released L1"] < 2
    assert row["1:1:1 error"] != row["naive error"]
    summary = record["summary"]["er N=500 eps=1"]
    assert summary["4:3 / naive time (median)"] == pytest.approx(row["4:3 s"] / row["naive s"])
    assert (tmp_path / "cgm_defaults.csv").exists()


def test_naive_l2_fits_every_strength_to_convergence_on_the_same_release(tmp_path: Path) -> None:
    """``python -m benchmarks naive_l2`` on one small release: the default and each fixed
    multiplier converge; ``s = 1`` is the default where ``r = b·K/N ≥ 0.3`` (so their fits
    agree), and a weaker strength fits the released tables' noise more closely, so its KL to the
    population differs."""
    record = _one_small_release("naive_l2", tmp_path, "--scales", "1", "0.1")
    (row,) = record["rows"]
    assert row["data"] == "er N=500" and row["r"] >= 0.3
    for label in ("default", "1", "0.1"):
        assert row[f"{label} converged"] and row[f"{label} iterations"] > 0
        assert 0 < row[f"{label} released L1"] < 2 and row[f"{label} error"] >= 0
    assert row["1 error"] == pytest.approx(row["default error"], rel=1e-6)
    assert row["0.1 error"] != pytest.approx(row["1 error"], rel=1e-3)
    assert 0 < row["noisy released L1"] < 2
    assert (tmp_path / "naive_l2.csv").exists()


def test_rhat_floor_chains_have_the_stated_law() -> None:
    """The floor's chains are stationary AR(1) series: unit variance and lag-one
    autocorrelation ``ρ`` (closed forms), so the R-hat measured on them is noise alone."""
    from benchmarks.rhat_floor import ar1_chains, one_setting

    rng = np.random.default_rng(0)
    for rho in (0.0, 0.6):
        x = ar1_chains(rng, 4, 4000, 50, rho)
        lag1 = np.mean(x[:, 1:] * x[:, :-1]) / np.mean(x * x)
        assert abs(np.var(x) - 1.0) < 0.03 and abs(lag1 - rho) < 0.02, (rho, np.var(x), lag1)
    row = one_setting(rng, 4, 500, 20, 0.0, 2)
    # independent draws: ESS near the 2,000 draws, R-hat within a percent of 1
    assert row["min_ess_bulk_median"] > 1200 and row["max_r_hat_median"] < 1.01
    assert row["pass_share"] == 1.0
