"""The `dpgm` command line: the demo end to end (reduced iterations) and its input errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from numpyro_dpgm.cli import app

runner = CliRunner()


def test_demo_runs_and_writes_its_outputs(tmp_path):
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--seed", "0", "--em-iters", "2", "--prox-iters", "200",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 48842
    assert set(summary["methods"]) == {"naive MLE", "CGM-EM", "Prox-PGM"}
    # the ledger holds exactly the one release, at the requested budget
    assert len(summary["ledger"]) == 1
    # model-based estimates beat the raw noisy tables on the released marginals
    for name in ("naive MLE", "CGM-EM"):
        assert summary["methods"][name]["l1_in_model"] < summary["noisy_tables_l1"]
    assert (out / "errors.png").stat().st_size > 0
    assert (out / "age_marginal.png").stat().st_size > 0


def test_bad_input_gives_one_line_errors_and_exit_code_2(tmp_path):
    result = runner.invoke(app, ["demo", "--epsilon", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--epsilon must be positive" in result.output
    result = runner.invoke(app, ["reproduce", "no-such-paper"])
    assert result.exit_code == 2
    assert "unknown experiment" in result.output
