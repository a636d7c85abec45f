"""``dpgm synth DATA --mechanism aim|mst``: one command from records to synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from numpyro_dpgm.cli import app
from numpyro_dpgm.io import load_ledger

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A labelled CSV of 400 records over three attributes and its domain file."""
    folder = tmp_path_factory.mktemp("mech")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 400)
    frame = pd.DataFrame({"sex": np.where(a == 1, "f", "m"),
                          "smoker": np.where(a ^ (rng.random(400) < 0.2), "yes", "no"),
                          "age": rng.integers(0, 3, 400)})
    frame.to_csv(folder / "data.csv", index=False)
    (folder / "domain.json").write_text(json.dumps(
        {"sex": ["f", "m"], "smoker": ["no", "yes"], "age": 3}))
    return folder


def _synth(folder, *args):
    return runner.invoke(app, ["synth", str(folder / "data.csv"), "--domain",
                               str(folder / "domain.json"), *args])


@pytest.mark.parametrize("mechanism", ["mst", "aim"])
def test_seeded_run_writes_labelled_synthetic_data_and_says_it_simulates(tiny, mechanism):
    out = tiny / f"{mechanism}.csv"
    res = _synth(tiny, "--mechanism", mechanism, "--epsilon", "2", "--delta", "1e-6",
                 "--seed", "3", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "SIMULATION: seeded JAX sampler, seed 3" in res.output
    synthetic = pd.read_csv(out)
    assert synthetic.shape == (400, 3)
    assert set(synthetic["sex"]) <= {"f", "m"} and set(synthetic["smoker"]) <= {"no", "yes"}
    again = tiny / f"{mechanism}-again.csv"
    _synth(tiny, "--mechanism", mechanism, "--epsilon", "2", "--delta", "1e-6", "--seed", "3",
           "-o", str(again))
    pd.testing.assert_frame_equal(pd.read_csv(again), synthetic)  # the seed repeats the run
    # the records are rounded unless --sampling sample asks for draws
    assert "rounding 400 records" in res.output
    sampled = tiny / f"{mechanism}-sampled.csv"
    res = _synth(tiny, "--mechanism", mechanism, "--epsilon", "2", "--delta", "1e-6",
                 "--seed", "3", "--sampling", "sample", "-o", str(sampled))
    assert res.exit_code == 0 and "sampling 400 records" in res.output
    assert not pd.read_csv(sampled).equals(synthetic)


def test_opendp_run_with_a_new_ledger_and_several_data_sets(tiny):
    ledger = tiny / "ledger.json"
    res = _synth(tiny, "--mechanism", "aim", "--epsilon", "1", "--delta", "1e-6",
                 "--workload", "2", "--target", "smoker", "--ledger", str(ledger),
                 "--budget", "3", "--datasets", "2", "-o", str(tiny / "s.csv"))
    assert res.exit_code == 0, res.output
    assert "OpenDP" in res.output
    assert (tiny / "s-1.csv").exists() and (tiny / "s-2.csv").exists()
    book = load_ledger(ledger)
    assert book.currency == "zcdp" and 0 < book.spent < book.budget
    # the ledger is debited again by a second run and refuses a third that does not fit
    res = _synth(tiny, "--mechanism", "mst", "--epsilon", "1", "--delta", "1e-6",
                 "--ledger", str(ledger), "-o", str(tiny / "t.csv"))
    assert res.exit_code == 0, res.output
    before = load_ledger(ledger).spent
    res = _synth(tiny, "--mechanism", "mst", "--epsilon", "3", "--delta", "1e-6",
                 "--ledger", str(ledger), "-o", str(tiny / "u.csv"))
    assert res.exit_code == 2 and "budget exceeded" in res.output
    assert not (tiny / "u.csv").exists() and load_ledger(ledger).spent == before


@pytest.mark.parametrize("args, message", [
    (["--epsilon", "0", "--delta", "1e-6"], "--epsilon must be positive"),
    (["--epsilon", "1", "--delta", "1.5"], "delta must lie strictly between 0 and 1"),
    (["--epsilon", "1"], "needs --epsilon and --delta"),
    (["--epsilon", "1", "--delta", "1e-6", "--target", "zz"], "unknown --target column 'zz'"),
    (["--epsilon", "1", "--delta", "1e-6", "--workload", "0"], "--workload must be a positive"),
    (["--epsilon", "1", "--delta", "1e-6", "--max-model-size", "-1"], "--max-model-size"),
])
def test_bad_input_one_line_errors_and_nothing_written(tiny, args, message):
    out = tiny / "bad.csv"
    res = _synth(tiny, "--mechanism", "aim", *args, "-o", str(out))
    assert res.exit_code == 2, res.output
    assert message in res.output and res.output.count("error:") == 1
    assert not out.exists()


def test_option_mix_ups(tiny):
    res = _synth(tiny, "--mechanism", "mst", "--epsilon", "1", "--delta", "1e-6",
                 "--workload", "2", "-o", str(tiny / "x.csv"))
    assert res.exit_code == 2 and "AIM's options" in res.output
    res = _synth(tiny, "--mechanism", "pgm", "--epsilon", "1", "--delta", "1e-6",
                 "-o", str(tiny / "x.csv"))
    assert res.exit_code == 2 and "unknown --mechanism 'pgm'" in res.output
    res = runner.invoke(app, ["synth", str(tiny / "data.csv"), "--mechanism", "mst", "--epsilon",
                              "1", "--delta", "1e-6", "-o", str(tiny / "x.csv")])
    assert res.exit_code == 2 and "--domain" in res.output
    res = _synth(tiny, "--mechanism", "mst", "--epsilon", "1", "--delta", "1e-6",
                 "-o", str(tiny / "data.csv"), "--force")
    assert res.exit_code == 2  # never overwrites its input
    res = runner.invoke(app, ["synth", str(tiny / "model.json"), "--epsilon", "1",
                              "-o", str(tiny / "x.csv")])
    assert res.exit_code == 2 and "apply to --mechanism only" in res.output
    res = _synth(tiny, "--mechanism", "mst", "--epsilon", "1", "--delta", "1e-6",
                 "--sampling", "exact", "-o", str(tiny / "x.csv"))
    assert res.exit_code == 2 and "--sampling must be sample or round" in res.output
    assert not (tiny / "x.csv").exists()
