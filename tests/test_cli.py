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


# ------------------------------------------------------------------------------------------------
# release -> fit -> synth on Titanic
# ------------------------------------------------------------------------------------------------
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import SHARED_DATA  # noqa: E402

from numpyro_dpgm.data import count  # noqa: E402
from numpyro_dpgm.io import load_ledger, load_measurements, load_model  # noqa: E402

TITANIC = SHARED_DATA / "titanic.csv"
TITANIC_DOMAIN = SHARED_DATA / "titanic-domain.json"
CLIQUES = ["--clique", "Pclass,Survived", "--clique", "Sex,Survived", "--clique", "Age,Sex"]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Titanic with string labels for Sex and Survived, and a domain file naming them."""
    folder = tmp_path_factory.mktemp("titanic")
    frame = pd.read_csv(TITANIC)
    frame["Sex"] = frame["Sex"].map({0: "female", 1: "male"})
    frame["Survived"] = frame["Survived"].map({0: "no", 1: "yes", 2: "unknown"})
    frame.to_csv(folder / "titanic.csv", index=False)
    domain = json.loads(TITANIC_DOMAIN.read_text())
    domain["Sex"] = ["female", "male"]
    domain["Survived"] = ["no", "yes", "unknown"]
    (folder / "domain.json").write_text(json.dumps(domain))
    return folder, frame


def _ok(args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def chain(tmp_path_factory, labelled):
    """One release -> fit (CGM-EM, one iteration) -> synth session; its files and outputs."""
    folder, _ = labelled
    tmp = tmp_path_factory.mktemp("chain")
    paths = {n: tmp / f for n, f in (("meas", "m.json"), ("ledger", "l.json"),
                                     ("model", "model.json"), ("synth", "synth.csv"))}
    outputs = {
        "release": _ok(["release", folder / "titanic.csv", "--domain", folder / "domain.json",
                        *CLIQUES, "--epsilon", "1", "--ledger", paths["ledger"], "--budget",
                        "1.5", "-o", paths["meas"]]),
        "fit": _ok(["fit", paths["meas"], "--method", "cgm-em", "--iters", "1", "-o",
                    paths["model"]]),
        "synth": _ok(["synth", paths["model"], "--records", 3000, "--seed", 0, "-o",
                      paths["synth"]]),
    }
    return paths, outputs


def test_release_fit_synth_chain(tmp_path, labelled, chain):
    folder, _ = labelled
    paths, outputs = chain
    assert "OpenDP" in outputs["release"] and "remaining 0.5" in outputs["release"]
    saved = load_measurements(paths["meas"])
    assert [m.clique for m in saved.measurements] == [("Pclass", "Survived"),
                                                      ("Sex", "Survived"), ("Age", "Sex")]
    assert saved.categories["Sex"] == ["female", "male"] and saved.total is None
    assert saved.measurements[0].noise.scale == 3.0  # 3 tables, add/remove: Δ₁ = 3, ε = 1
    assert saved.ledger.spent == 1.0

    assert "not modelled" in outputs["fit"]
    fitted = load_model(paths["model"])
    assert fitted.provenance["estimator"] == "cgm_em"
    assert fitted.provenance["options"] == {"max_em_iters": 1}
    assert set(fitted.model.network.domain) == {"Pclass", "Survived", "Sex", "Age"}
    codes = pd.read_csv(TITANIC)
    truth = np.asarray(count(codes, [("Pclass", "Survived")], fitted.model.network.domain)[
        ("Pclass", "Survived")])
    estimate = np.asarray(fitted.model.marginal(("Pclass", "Survived")))
    # noise scale 3 on 9 cells of 1304 records: the expected L1 error is about 0.02
    assert np.abs(estimate - truth / truth.sum()).sum() < 0.1

    assert "seed 0" in outputs["synth"]
    data = pd.read_csv(paths["synth"])
    assert list(data.columns) == ["Survived", "Pclass", "Sex", "Age"] and len(data) == 3000
    assert set(data["Sex"]) == {"female", "male"}
    assert set(data["Survived"]) <= {"no", "yes", "unknown"}
    # the synthetic Sex marginal matches the model's (3000 draws: s.e. ≈ 0.009)
    p_male = float(fitted.model.marginal(("Sex",))[1])
    assert abs((data["Sex"] == "male").mean() - p_male) < 0.04

    # a second release within the remaining budget debits the same ledger
    ledger = tmp_path / "l.json"
    ledger.write_bytes(paths["ledger"].read_bytes())
    assert load_ledger(ledger).history == saved.ledger.history
    _ok(["release", folder / "titanic.csv", "--domain", folder / "domain.json",
         "--clique", "Fare,Pclass", "--epsilon", "0.5", "--ledger", ledger, "-o",
         tmp_path / "m2.json", "--mechanism", "discrete_laplace", "--seed", "3"])
    assert len(load_ledger(ledger).history) == 2
    second = load_measurements(tmp_path / "m2.json")
    assert np.all(second.measurements[0].values == np.rint(second.measurements[0].values))
    assert second.ledger.history[1].details["sampler"] == "jax"


def test_simulated_release_is_seeded_and_named_as_such(tmp_path):
    args = ["release", TITANIC, "--domain", TITANIC_DOMAIN, "--clique", "Pclass,Survived",
            "--epsilon", "1", "--seed", "7", "--neighbours", "replace_one"]
    out = _ok(args + ["-o", tmp_path / "a.json"])
    assert "SIMULATION" in out
    _ok(args + ["-o", tmp_path / "b.json"])
    a, b = load_measurements(tmp_path / "a.json"), load_measurements(tmp_path / "b.json")
    np.testing.assert_array_equal(a.measurements[0].values, b.measurements[0].values)
    assert a.total == 1304.0  # replace-one neighbours: N is public
    # no --domain: inferred with a warning, from the released columns only
    result = runner.invoke(app, ["release", str(TITANIC), "--clique", "Pclass,Sex",
                                 "--epsilon", "1", "--seed", "1", "-o", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    assert "discloses" in result.output
    assert list(load_measurements(tmp_path / "c.json").domain) == ["Pclass", "Sex"]
    # cliques from a file: JSON, or one comma-separated clique per line
    (tmp_path / "cliques.json").write_text('[["Pclass", "Survived"], ["Sex"]]')
    (tmp_path / "cliques.txt").write_text("# tables\nPclass,Survived\nSex\n")
    for name in ("cliques.json", "cliques.txt"):
        _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "--cliques", tmp_path / name,
             "--epsilon", "1", "--seed", "0", "-o", tmp_path / "f.json"])
        saved = load_measurements(tmp_path / "f.json")
        assert [m.clique for m in saved.measurements] == [("Pclass", "Survived"), ("Sex",)]


def test_fit_prox_pgm_and_naive(tmp_path, chain):
    meas = chain[0]["meas"]
    _ok(["fit", meas, "--method", "prox-pgm", "--iters", 30, "-o", tmp_path / "p.json"])
    fitted = load_model(tmp_path / "p.json")
    assert fitted.provenance["iterations"] == 30 and fitted.provenance["options"] == {"iters": 30}
    _ok(["fit", meas, "--method", "naive", "--total", 1304, "-o", tmp_path / "n.json"])
    fitted = load_model(tmp_path / "n.json")
    assert fitted.provenance["estimator"] == "naive_mle" and fitted.total == 1304.0
    _ok(["synth", tmp_path / "n.json", "--seed", 1, "-o", tmp_path / "s.parquet"])
    data = pd.read_parquet(tmp_path / "s.parquet")
    assert len(data) == 1304 and isinstance(data["Sex"].dtype, pd.CategoricalDtype)


# ------------------------------------------------------------------------------------------------
# bad input: exit code 2, one line, nothing written
# ------------------------------------------------------------------------------------------------
def _fails(args, needle, *unwritten):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert needle in lines[0], lines[0]
    for path in unwritten:
        assert not path.exists(), path
    return lines[0]


def test_release_bad_input(tmp_path):
    out = tmp_path / "m.json"
    base = ["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", out]
    _fails(base + ["--clique", "Age,Boat", "--epsilon", "1"], "unknown attribute(s) ['Boat']",
           out)
    _fails(base + CLIQUES + ["--epsilon", "0"], "--epsilon must be positive", out)
    _fails(base + ["--epsilon", "1"], "no cliques", out)
    _fails(base + CLIQUES + ["--epsilon", "1", "--mechanism", "gaussian"], "needs --delta", out)
    # the domain names a column the data lack
    domain = json.loads(TITANIC_DOMAIN.read_text())
    (tmp_path / "d.json").write_text(json.dumps({**domain, "Boat": 20}))
    _fails(["release", TITANIC, "--domain", tmp_path / "d.json", "-o", out, *CLIQUES,
            "--epsilon", "1"], "no column 'Boat'", out)
    # a code outside the domain
    frame = pd.read_csv(TITANIC)
    frame.loc[5, "Age"] = 95
    frame.to_csv(tmp_path / "bad.csv", index=False)
    _fails(["release", tmp_path / "bad.csv", "--domain", TITANIC_DOMAIN, "-o", out, *CLIQUES,
            "--epsilon", "1"], "column 'Age' has code 95 (row 5) outside its domain 0 … 90", out)
    _fails(["release", tmp_path / "none.csv", "--domain", TITANIC_DOMAIN, "-o", out, *CLIQUES,
            "--epsilon", "1"], "does not exist", out)


def test_overspending_is_refused_and_nothing_changes(tmp_path):
    ledger = tmp_path / "ledger.json"
    base = ["release", TITANIC, "--domain", TITANIC_DOMAIN, *CLIQUES, "--ledger", ledger]
    _ok(base + ["--epsilon", "0.8", "--budget", "1", "-o", tmp_path / "a.json"])
    before = ledger.read_bytes()
    line = _fails(base + ["--epsilon", "0.5", "-o", tmp_path / "b.json"],
                  "privacy budget exceeded", tmp_path / "b.json")
    assert "ε = 0.5 but only ε = 0.2 is left" in line
    assert ledger.read_bytes() == before
    _fails(["release", TITANIC, "--domain", TITANIC_DOMAIN, *CLIQUES, "--epsilon", "1",
            "--ledger", tmp_path / "new.json", "-o", tmp_path / "c.json"],
           "create it by giving its total budget", tmp_path / "new.json", tmp_path / "c.json")


def test_fit_and_synth_bad_files(tmp_path, chain):
    meas, model = chain[0]["meas"], chain[0]["model"]
    out = tmp_path / "s.csv"
    text = model.read_text()
    (tmp_path / "truncated.json").write_text(text[: len(text) // 2])
    _fails(["synth", tmp_path / "truncated.json", "-o", out], "is corrupt", out)
    (tmp_path / "altered.json").write_text(text.replace('"total": 1', '"total": 2', 1))
    _fails(["synth", tmp_path / "altered.json", "-o", out], "checksum does not match", out)
    (tmp_path / "newer.json").write_text(text.replace('"version": 1', '"version": 2', 1))
    _fails(["synth", tmp_path / "newer.json", "-o", out], "format version 2, newer", out)
    _fails(["synth", meas, "-o", out], "not a model file", out)
    _fails(["synth", model, "--records", "0", "-o", out], "--records must be", out)
    _fails(["fit", model, "-o", tmp_path / "x.json"], "not a measurements file",
           tmp_path / "x.json")
    _fails(["fit", meas, "--method", "magic", "-o", tmp_path / "x.json"], "unknown --method",
           tmp_path / "x.json")


def test_help_everywhere():
    for command in ([], ["release"], ["fit"], ["synth"], ["bench"], ["demo"], ["reproduce"]):
        result = runner.invoke(app, command + ["--help"])
        assert result.exit_code == 0 and "Usage" in result.output


def test_bench_needs_a_source_checkout(monkeypatch, tmp_path):
    import numpyro_dpgm.cli as cli

    monkeypatch.setattr(cli, "_source_root", lambda: tmp_path)
    _fails(["bench"], "source checkout")


# ------------------------------------------------------------------------------------------------
# posterior draws -> m synthetic data sets (for the combining rules)
# ------------------------------------------------------------------------------------------------
def test_nuts_fit_and_posterior_synth(tmp_path, labelled):
    folder, frame = labelled
    meas, post, point = tmp_path / "m.json", tmp_path / "post.json", tmp_path / "point.json"
    _ok(["release", folder / "titanic.csv", "--domain", folder / "domain.json",
         "--clique", "Pclass,Survived", "--clique", "Sex,Survived", "--epsilon", "1",
         "--seed", 3, "-o", meas])
    out = _ok(["fit", meas, "--method", "nuts", "--iters", 60, "--chains", 1, "-o", post])
    assert "60 posterior draws" in out and "R-hat" in out
    saved = load_model(post)
    assert saved.model.batch_shape == (60,)
    # the posterior mean of P(Sex, Survived) is close to the confidential table (ε = 1 Laplace
    # noise of scale 2 on ~1,300 records: errors of a few counts per cell)
    mean = np.asarray(saved.model.marginal(("Sex", "Survived"))).mean(axis=0)
    truth = count(pd.read_csv(TITANIC), [("Sex", "Survived")],
                  json.loads(TITANIC_DOMAIN.read_text()))[("Sex", "Survived")]
    assert 0.5 * np.abs(mean - truth / truth.sum()).sum() < 0.03

    synth = tmp_path / "s.csv"
    out = _ok(["synth", post, "--posterior", "--datasets", 3, "--records", 500, "--seed", 0,
               "-o", synth])
    files = [tmp_path / f"s-{i}.csv" for i in (1, 2, 3)]
    assert all(f.exists() for f in files) and not synth.exists()
    sets = [pd.read_csv(f) for f in files]
    assert all(len(s) == 500 and set(s["Sex"]) <= {"female", "male"} for s in sets)
    assert not sets[0].equals(sets[1])  # one data set per posterior draw

    # point estimates and posterior draws are not confused; nothing is written
    _ok(["fit", meas, "--method", "naive", "-o", point])
    _fails(["synth", point, "--posterior", "--datasets", 2, "-o", tmp_path / "p.csv"],
           "holds a point estimate", tmp_path / "p-1.csv", tmp_path / "p.csv")
    _fails(["synth", post, "-o", tmp_path / "q.csv"], "posterior draws", tmp_path / "q.csv")
    _fails(["synth", point, "--datasets", 2, "-o", tmp_path / "r.csv"], "needs --posterior",
           tmp_path / "r-1.csv")
    _fails(["synth", post, "--posterior", "--datasets", 61, "-o", tmp_path / "t.csv"],
           "exceeds the 60 posterior draws", tmp_path / "t-01.csv")
