"""The `dpgm` command line: the demo end to end (reduced iterations) and its input errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    assert fitted.provenance["options"] == {"max_iters": 1}
    # the model file keeps the whole domain; the cliques cover four of its nine attributes
    domain = json.loads(TITANIC_DOMAIN.read_text())
    assert list(fitted.model.network.domain) == list(domain)
    assert {a for c in fitted.model.network.cliques for a in c} == {"Pclass", "Survived", "Sex",
                                                                    "Age"}
    codes = pd.read_csv(TITANIC)
    truth = np.asarray(count(codes, [("Pclass", "Survived")], fitted.model.network.domain)[
        ("Pclass", "Survived")])
    estimate = np.asarray(fitted.model.marginal(("Pclass", "Survived")))
    # noise scale 3 on 9 cells of 1304 records: the expected L1 error is about 0.02
    assert np.abs(estimate - truth / truth.sum()).sum() < 0.1

    assert "seed 0" in outputs["synth"]
    data = pd.read_csv(paths["synth"])
    assert list(data.columns) == list(domain) and len(data) == 3000
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
        out = tmp_path / f"from-{name}.json"  # a new file each time: a release is never replaced
        _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "--cliques", tmp_path / name,
             "--epsilon", "1", "--seed", "0", "-o", out])
        saved = load_measurements(out)
        assert [m.clique for m in saved.measurements] == [("Pclass", "Survived"), ("Sex",)]


def test_fit_prox_pgm_and_naive(tmp_path, chain):
    meas = chain[0]["meas"]
    _ok(["fit", meas, "--method", "prox-pgm", "--iters", 30, "-o", tmp_path / "p.json"])
    fitted = load_model(tmp_path / "p.json")
    assert fitted.provenance["iterations"] == 30
    assert fitted.provenance["options"] == {"max_iters": 30}
    _ok(["fit", meas, "--method", "naive", "--total", 1304, "-o", tmp_path / "n.json"])
    fitted = load_model(tmp_path / "n.json")
    assert fitted.provenance["estimator"] == "naive_mle" and fitted.total == 1304.0
    _ok(["synth", tmp_path / "n.json", "--seed", 1, "-o", tmp_path / "s.parquet"])
    data = pd.read_parquet(tmp_path / "s.parquet")
    assert len(data) == 1304 and isinstance(data["Sex"].dtype, pd.CategoricalDtype)


def test_fit_prox_pgm_stop_rules(tmp_path):
    """--stop is prox_pgm's stop; the summary names the iterate of least estimated risk."""
    from numpyro_dpgm.cli._fit import STOP_RULES
    from numpyro_dpgm.estimation.prox_pgm import STOP_RULES as RULES

    assert set(STOP_RULES) == set(RULES)
    # a seeded release (the module's chain is released by OpenDP, new noise each run)
    meas = tmp_path / "m.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, *CLIQUES, "--epsilon", "0.3",
         "--seed", "2", "-o", meas])
    output = _ok(["fit", meas, "--method", "prox-pgm", "--stop", "risk", "--iters", 5000,
                  "-o", tmp_path / "r.json"])
    fitted = load_model(tmp_path / "r.json")
    assert fitted.provenance["options"] == {"max_iters": 5000, "stop": "risk"}
    assert re.search(r"least estimated risk at iteration \d+ \(stopped by (risk|tolerance)\)",
                     output), output
    out = tmp_path / "x.json"
    _fails(["fit", meas, "--method", "naive", "--stop", "risk", "-o", out],
           "--stop applies to --method prox-pgm only", out)
    _fails(["fit", meas, "--method", "prox-pgm", "--stop", "early", "-o", out],
           "unknown --stop 'early'", out)
    # the options of nuts are refused by the point estimators, not ignored
    _fails(["fit", meas, "--method", "naive", "--target-accept", 0.9, "-o", out],
           "--target-accept applies to --method nuts only, not naive", out)
    _fails(["fit", meas, "--chains", 4, "--time-limit", 60, "--keep-draws", 10, "--path",
            "exact", "-o", out], "--chains, --time-limit, --keep-draws, --path apply to "
           "--method nuts only, not cgm-em", out)


def test_fit_any_registered_estimator(tmp_path, chain):
    """--method selects from the estimators' registry; --seed is a stochastic one's rng_key."""
    meas = chain[0]["meas"]
    _ok(["fit", meas, "--method", "mcem", "--iters", 1, "--seed", 3, "-o", tmp_path / "m.json"])
    fitted = load_model(tmp_path / "m.json")
    assert fitted.provenance["estimator"] == "mcem"
    assert fitted.provenance["options"] == {"max_iters": 1, "seed": 3}
    assert fitted.provenance["iterations"] == 1


# ------------------------------------------------------------------------------------------------
# bad input: exit code 2, one line, nothing written
# ------------------------------------------------------------------------------------------------
def _errors(output):
    """The output's lines less the progress lines (stage lines when not on a terminal)."""
    return [line for line in output.strip().splitlines() if not line.startswith("progress: ")]


def _fails(args, needle, *unwritten):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = _errors(result.output)
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
    _fails(["fit", meas, "--method", "magic", "-o", tmp_path / "x.json"], "variational-em",
           tmp_path / "x.json")  # the error lists the registry's names


def test_help_everywhere():
    for command in ([], ["release"], ["fit"], ["synth"], ["bench"], ["demo"]):
        result = runner.invoke(app, command + ["--help"])
        assert result.exit_code == 0 and "Usage" in result.output


def test_bench_needs_a_source_checkout(monkeypatch, tmp_path):
    from numpyro_dpgm.cli import _jobs

    monkeypatch.setattr(_jobs, "_source_root", lambda: tmp_path)
    _fails(["bench"], "source checkout")


# ------------------------------------------------------------------------------------------------
# posterior draws -> m synthetic data sets (for the combining rules)
# ------------------------------------------------------------------------------------------------
def test_laplace_fit_gives_posterior_draws(tmp_path, labelled):
    """``--method laplace``: draws of the Laplace approximation of the posterior, said to be
    approximate, close to the confidential table, ready for ``synth --posterior``; options of
    NUTS refused."""
    folder, _ = labelled
    meas, post = tmp_path / "m.json", tmp_path / "post.json"
    _ok(["release", folder / "titanic.csv", "--domain", folder / "domain.json",
         "--clique", "Pclass,Survived", "--clique", "Sex,Survived", "--epsilon", "1",
         "--seed", 3, "-o", meas])
    out = _ok(["fit", meas, "--method", "laplace", "--iters", 200, "-o", post])
    assert "200 draws of the Laplace approximation" in out and "approximate" in out
    provenance = json.loads(post.read_text())["provenance"]
    assert provenance["estimator"] == "run_laplace"
    assert provenance["options"]["path"] == "laplace" and provenance["options"]["mode_converged"]
    saved = load_model(post)
    assert saved.model.batch_shape == (200,)
    mean = np.asarray(saved.model.marginal(("Sex", "Survived"))).mean(axis=0)
    truth = count(pd.read_csv(TITANIC), [("Sex", "Survived")],
                  json.loads(TITANIC_DOMAIN.read_text()))[("Sex", "Survived")]
    assert 0.5 * np.abs(mean - truth / truth.sum()).sum() < 0.03
    _ok(["synth", post, "--posterior", "--datasets", 2, "--records", 50, "--seed", 0,
         "-o", tmp_path / "s.csv"])
    assert (tmp_path / "s-2.csv").exists()
    _fails(["fit", meas, "--method", "laplace", "--chains", 2, "-o", tmp_path / "x.json"],
           "--method nuts only", tmp_path / "x.json")
    _fails(["fit", meas, "--method", "laplace", "--iters", 1, "-o", tmp_path / "x.json"],
           "at least 2", tmp_path / "x.json")


def test_nuts_fit_and_posterior_synth(tmp_path, labelled):
    folder, frame = labelled
    meas, post, point = tmp_path / "m.json", tmp_path / "post.json", tmp_path / "point.json"
    _ok(["release", folder / "titanic.csv", "--domain", folder / "domain.json",
         "--clique", "Pclass,Survived", "--clique", "Sex,Survived", "--epsilon", "1",
         "--seed", 3, "-o", meas])
    out = _ok(["fit", meas, "--method", "nuts", "--iters", 60, "--chains", 1, "--time-limit", 0,
               "--target-accept", 0.9, "-o", post])
    assert "60 posterior draws" in out and "R-hat" in out
    assert json.loads(post.read_text())["provenance"]["options"]["target_accept"] == 0.9
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
    # numbered with the width of m; all m files are checked before any is written
    _ok(["synth", post, "--posterior", "--datasets", 10, "--records", 20, "--seed", 0,
         "-o", tmp_path / "v.csv"])
    assert sorted(p.name for p in tmp_path.glob("v-*.csv")) == [f"v-{i:02d}.csv"
                                                               for i in range(1, 11)]
    (tmp_path / "u-2.csv").write_text("keep me")
    _fails(["synth", post, "--posterior", "--datasets", 3, "--records", 20, "-o",
            tmp_path / "u.csv"], "u-2.csv exists; give --force", tmp_path / "u-1.csv",
           tmp_path / "u-3.csv")
    assert (tmp_path / "u-2.csv").read_text() == "keep me"
    _fails(["synth", post, "--posterior", "--datasets", 3, "--records", 20, "--force", "-o",
            tmp_path / "post.json"], "expected a file name ending in", tmp_path / "post-1.json")

    # point estimates and posterior draws are not confused; nothing is written
    _ok(["fit", meas, "--method", "naive", "-o", point])
    _fails(["synth", point, "--posterior", "--datasets", 2, "-o", tmp_path / "p.csv"],
           "holds a point estimate", tmp_path / "p-1.csv", tmp_path / "p.csv")
    _fails(["synth", post, "-o", tmp_path / "q.csv"], "posterior draws", tmp_path / "q.csv")
    _fails(["synth", point, "--datasets", 2, "-o", tmp_path / "r.csv"], "needs --posterior",
           tmp_path / "r-1.csv")
    _fails(["synth", post, "--posterior", "--datasets", 61, "-o", tmp_path / "t.csv"],
           "exceeds the 60 posterior draws", tmp_path / "t-01.csv")


# ------------------------------------------------------------------------------------------------
# outputs: nothing lost, nothing silent
# ------------------------------------------------------------------------------------------------
UNMODELLED = ["SibSp", "Parch", "Fare", "Embarked", "Cabin"]


def test_attributes_in_no_released_table_are_kept_uniform_with_a_warning(tmp_path, chain):
    """dpgm synth keeps the attributes no released table measured: drawn uniformly over their
    values, independently of the rest, and named in a warning; --drop-unmodelled drops them."""
    model = chain[0]["model"]
    result = runner.invoke(app, ["synth", str(model), "--records", "4000", "--seed", "1", "-o",
                                 str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output and str(UNMODELLED) in result.output
    assert "uniformly" in result.output and "--drop-unmodelled" in result.output
    data = pd.read_csv(tmp_path / "s.csv")
    domain = json.loads(TITANIC_DOMAIN.read_text())
    assert list(data.columns) == list(domain)
    for attr in UNMODELLED:  # uniform: 4000 draws, s.e. of a share below 0.008
        shares = data[attr].value_counts(normalize=True).reindex(range(domain[attr]),
                                                                 fill_value=0)
        assert np.abs(shares - 1 / domain[attr]).max() < 0.035, attr
    # independent of the modelled attributes: Cabin's shares hardly move with Sex
    by_sex = pd.crosstab(data["Sex"], data["Cabin"], normalize="index")
    assert np.abs(by_sex.loc["female"] - by_sex.loc["male"]).max() < 0.06
    out = _ok(["synth", model, "--records", 100, "--seed", 1, "--drop-unmodelled", "-o",
               tmp_path / "d.csv"])
    assert "warning" not in out
    assert list(pd.read_csv(tmp_path / "d.csv").columns) == ["Survived", "Pclass", "Sex", "Age"]


def test_no_output_replaces_an_existing_file_without_force(tmp_path, labelled, chain):
    folder, _ = labelled
    paths = chain[0]
    release = ["release", folder / "titanic.csv", "--domain", folder / "domain.json",
               "--clique", "Sex,Survived", "--epsilon", "1", "--seed", 0]
    for command in (release, ["fit", paths["meas"], "--method", "naive"],
                    ["synth", paths["model"], "--seed", 0, "--records", 10]):
        taken = tmp_path / ("taken.csv" if command[0] == "synth" else "taken.json")
        taken.write_text("keep me")
        line = _fails(command + ["-o", taken], "exists; give --force")
        assert str(taken) in line and taken.read_text() == "keep me"
        _ok(command + ["-o", taken, "--force"])
        assert taken.read_text() != "keep me"
    # demo: existing files in the output folder are refused before any work
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "errors.png").write_text("keep me")
    _fails(["demo", "--out", tmp_path / "demo"], "already holds errors.png; give --force")
    assert (tmp_path / "demo" / "errors.png").read_text() == "keep me"


def test_no_command_writes_over_its_input_even_with_force(tmp_path, labelled, chain):
    folder, _ = labelled
    data = tmp_path / "data.csv"
    data.write_bytes((folder / "titanic.csv").read_bytes())
    before = data.read_bytes()
    domain = tmp_path / "domain.json"
    domain.write_bytes((folder / "domain.json").read_bytes())
    release = ["release", data, "--domain", domain, "--clique", "Sex,Survived", "--epsilon", "1",
               "--seed", 0, "--force"]
    _fails(release + ["-o", data], "is the input file")
    _fails(release + ["-o", domain], "is the input file")
    # the same file under another name: a relative path, a symbolic link
    link = tmp_path / "link.csv"
    link.symlink_to(data)
    _fails(release + ["-o", link], "is the input file")
    _fails(release + ["-o", tmp_path / "sub" / ".." / "data.csv"], "folder")  # no folder sub
    (tmp_path / "sub").mkdir()
    _fails(release + ["-o", tmp_path / "sub" / ".." / "data.csv"], "is the input file")
    assert data.read_bytes() == before
    model = tmp_path / "model.json"
    model.write_bytes(chain[0]["model"].read_bytes())
    _fails(["fit", chain[0]["meas"], "--force", "-o", chain[0]["meas"]], "is the input file")
    _fails(["synth", model, "--records", 10, "-o", link], "exists; give --force")
    assert data.read_bytes() == before


def test_a_recorded_release_is_never_replaced(tmp_path, labelled, chain):
    """A measurements or ledger file whose ledger records a release is refused as an output even
    with --force: its budget is spent, the file is the only copy of what it bought."""
    folder, _ = labelled
    meas, ledger = tmp_path / "m.json", tmp_path / "l.json"
    meas.write_bytes(chain[0]["meas"].read_bytes())
    ledger.write_bytes(chain[0]["ledger"].read_bytes())
    saved = {p: p.read_bytes() for p in (meas, ledger)}
    release = ["release", folder / "titanic.csv", "--domain", folder / "domain.json",
               "--clique", "Sex,Survived", "--epsilon", "0.1", "--seed", 0, "--force"]
    line = _fails(release + ["-o", meas], "records 1 release(s)")
    assert "even with --force" in line and "laplace release of" in line
    _fails(release + ["-o", ledger], "a privacy ledger whose ledger records 1 release(s)")
    _fails(["fit", chain[0]["meas"], "--method", "naive", "--force", "-o", meas],
           "refusing to overwrite")
    assert all(p.read_bytes() == b for p, b in saved.items())
    # a file that merely looks like JSON, or a ledger with no debit yet, is an ordinary file
    (tmp_path / "empty.json").write_text('{"format": "numpyro_dpgm.ledger", "ledger": '
                                         '{"entries": []}}')
    _ok(release + ["-o", tmp_path / "empty.json"])


def _flat(text):
    """Help text with its line breaks and panel borders taken out."""
    return " ".join(text.replace("│", " ").split())


def test_help_shows_square_brackets():
    result = runner.invoke(app, ["release", "--help"])
    assert result.exit_code == 0
    assert '{"attr": size or [labels], ...}' in _flat(result.output)


def test_error_messages_keep_square_brackets(tmp_path):
    (tmp_path / "domain.json").write_text("[]")
    line = _fails(["release", TITANIC, "--domain", tmp_path / "domain.json", "--clique", "Sex",
                   "--epsilon", "1", "-o", tmp_path / "m.json"], "must hold one non-empty")
    assert '{"attr": number of values or [labels], ...}' in line
    # a file name with brackets prints as written
    odd = tmp_path / "[red]x[/red].csv"
    line = _fails(["release", odd, "--domain", TITANIC_DOMAIN, "--clique", "Sex",
                   "--epsilon", "1", "-o", tmp_path / "m.json"], "does not exist")
    assert "[red]x[/red].csv" in line


def test_table_writes_are_atomic(tmp_path, monkeypatch):
    from numpyro_dpgm.cli._common import write_table

    frame = pd.DataFrame({"a": range(1000)})
    target = tmp_path / "s.csv"
    target.write_text("old")

    def broken(self, sink, *args, **kwargs):
        sink.write("partial")  # the writer hands pandas an open handle
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    with pytest.raises(OSError, match="disk full"):
        write_table(frame, target)
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]
    monkeypatch.undo()
    # the temporary file has the output's suffix, so a .csv.gz comes out gzip-compressed
    write_table(frame, tmp_path / "s.csv.gz")
    assert (tmp_path / "s.csv.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert pd.read_csv(tmp_path / "s.csv.gz")["a"].tolist() == list(range(1000))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.csv.gz"]


def test_posterior_data_set_names_are_zero_padded_everywhere():
    """One naming scheme: OUT numbered 1..m, zero-padded to the width of m; the help, the README
    and docs/cli.md say the same."""
    from numpyro_dpgm.cli._synth import _numbered

    assert [_numbered(Path("synth.csv"), i, 20).name for i in (1, 20)] == ["synth-01.csv",
                                                                           "synth-20.csv"]
    assert _numbered(Path("s.csv.gz"), 3, 3).name == "s-3.csv.gz"
    assert _numbered(Path("s.parquet"), 7, 100).name == "s-007.parquet"
    result = runner.invoke(app, ["synth", "--help"])
    assert "synth-01.csv ... synth-20.csv" in _flat(result.output)
    root = Path(__file__).resolve().parents[1]
    assert "synth-01.csv … synth-20.csv" in (root / "README.md").read_text()
    cli_doc = (root / "docs" / "cli.md").read_text()
    assert "synthetic-01.csv` … `synthetic-20.csv" in cli_doc
    assert "synthetic-1.csv" not in cli_doc and "OUT-1" not in result.output


def test_demo_default_folder_is_its_own(tmp_path, monkeypatch):
    """The README's demo command runs again: the default folder is rewritten, a named one is
    not (checked before any work, so the refusal costs nothing)."""
    from numpyro_dpgm.cli import _jobs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "demo").mkdir(parents=True)
    (tmp_path / "outputs" / "demo" / "summary.json").write_text("{}")
    calls = []
    monkeypatch.setattr("numpyro_dpgm.demo.run_demo",
                        lambda *a, **k: calls.append(a[1]) or (_ for _ in ()).throw(
                            RuntimeError("stop after the checks")))
    result = runner.invoke(app, ["demo", "--seed", "0"])
    assert calls == [_jobs.DEMO_OUT]  # no refusal: the run started in the default folder
    result = runner.invoke(app, ["demo", "--seed", "0", "--out", "outputs/demo"])
    assert result.exit_code == 2 and "give --force" in result.output


def test_release_size_is_checked_and_sparse_tables_warned(tmp_path):
    """A release above --max-cells is a one-line error before anything is spent; a table with
    more cells than records gives one warning line and the release goes on."""
    import inspect

    from numpyro_dpgm import cli
    from numpyro_dpgm.privacy.releases import DEFAULT_MAX_CELLS

    assert inspect.signature(cli.release).parameters["max_cells"].default == DEFAULT_MAX_CELLS
    out = tmp_path / "m.json"
    base = ["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", out, *CLIQUES, "--epsilon", "1",
            "--seed", "0"]
    _fails(base + ["--max-cells", "10"], "above max_cells = 10", out)
    few = pd.read_csv(TITANIC).iloc[:3]
    few.to_csv(tmp_path / "few.csv", index=False)
    result = runner.invoke(app, [str(a) for a in ["release", tmp_path / "few.csv", "--domain",
                                                  TITANIC_DOMAIN, "-o", out, *CLIQUES,
                                                  "--epsilon", "1", "--seed", "0"]])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warned and all("cells" in line and "3 records" in line for line in warned)
    assert out.exists()


def test_progress_lines_when_the_output_is_not_a_terminal(tmp_path, monkeypatch):
    """Without a terminal (a pipe, a log file) every stage prints plain lines: its start, its
    updates with the time left, and its end with the time taken."""
    from numpyro_dpgm.cli import _progress

    meas, model = tmp_path / "m.json", tmp_path / "model.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", meas, *CLIQUES, "--epsilon", "1",
         "--seed", "0"])
    monkeypatch.setattr(_progress, "PROGRESS_EVERY", 0.0)  # every update gives a line
    output = _ok(["fit", meas, "--method", "prox-pgm", "--iters", "300", "-o", model])
    lines = [line for line in output.splitlines() if line.startswith("progress: ")]
    assert lines[0] == "progress: prox-pgm …"
    assert any(re.search(r"prox-pgm: \d+/300, about .* left \(", line) for line in lines)
    assert re.match(r"progress: prox-pgm: done in \d", lines[-1])
    output = _ok(["synth", model, "--records", "50", "--seed", "0", "-o", tmp_path / "s.csv"])
    assert "progress: sampling 50 records …" in output
    assert re.search(r"progress: sampling 50 records: done in", output)


def test_fit_lists_every_registered_estimator() -> None:
    """``dpgm fit --method`` spells the registry out (so that ``--help`` needs no JAX)."""
    from numpyro_dpgm.cli._fit import ESTIMATOR_NAMES
    from numpyro_dpgm.estimation import ESTIMATORS

    assert sorted(ESTIMATOR_NAMES) == sorted(ESTIMATORS)  # registration order follows imports


def test_help_does_not_import_jax() -> None:
    import subprocess
    import sys

    code = ("import sys; from numpyro_dpgm.cli import app; "
            "print('jax' in sys.modules, 'numpyro' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_fit_warns_about_a_sparse_clique_as_a_line(tmp_path):
    """A model clique with more cells than records gives a ``warning:`` line before the fit."""
    import warnings

    from numpyro_dpgm import Domain, Laplace, Measurement, save_measurements

    domain = Domain({"a": 10, "b": 10})
    path = save_measurements(tmp_path / "m.json",
                             [Measurement(("a", "b"), np.full(100, 0.5), Laplace(1.0))], domain)
    display = warnings.showwarning
    out = _ok(["fit", path, "--method", "naive", "-o", tmp_path / "model.json"])
    assert ("warning: the model's clique ('a', 'b') has 100 cells, 2× the 50 records"
            in " ".join(out.split())), out
    assert warnings.showwarning is display  # put back when the command ends


@pytest.mark.parametrize("path", ["exact", "relaxed"])
def test_nuts_says_its_path_and_shows_progress_when_not_a_terminal(tmp_path, monkeypatch, path):
    """``dpgm fit --method nuts --path`` runs the path asked for, says so with the convergence
    figures, and prints a progress line per step of each phase when the output is not a
    terminal (here every step: the interval is 0). NumPyro turns its per-step loop off under
    CI and pytest-xdist (the ``CI`` and ``PYTEST_XDIST_WORKER`` variables); without it the
    stage prints its start and end only."""
    from numpyro_dpgm.cli import _progress

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    meas, post = tmp_path / "m.json", tmp_path / "post.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", meas, "--clique",
         "Sex,Survived", "--epsilon", "1", "--seed", "0"])
    monkeypatch.setattr(_progress, "PROGRESS_EVERY", 0.0)
    output = _ok(["fit", meas, "--method", "nuts", "--iters", 20, "--chains", 1, "--path", path,
                  "--time-limit", 0, "-o", post])
    lines = [line for line in output.splitlines() if line.startswith("progress: ")]
    assert any(line.startswith(f"progress: NUTS, {path} path: 1 chain(s) × (20 warm-up + 20 "
                               "draws): warmup step 20 (") for line in lines)
    assert any("sample step 20 (" in line for line in lines)
    # the path is said before sampling starts, and again with the figures
    assert output.index(f"NUTS path: {path} (exact={path == 'exact'})") < output.index(lines[0])
    assert f"1 chain(s), {path} path: exact={path == 'exact'})" in output
    # the console wraps long lines where they fall
    assert re.search(r"worst R-hat \d\.\d{3}, smallest bulk ESS \d+", " ".join(output.split()))
    options = json.loads(post.read_text())["provenance"]["options"]
    assert options["path"] == path and options["max_depth_hits"] >= 0
    assert options["metric"] == "adapt"  # NumPyro's adaptation: the Laplace metric is collapsed
    assert options["coding"] == "conditional"  # the default on a decomposable network
    _fails(["fit", meas, "--method", "nuts", "--path", "both", "-o", tmp_path / "x.json"],
           "unknown --path 'both'", tmp_path / "x.json")
    _fails(["fit", meas, "--method", "nuts", "--metric", "curved", "-o", tmp_path / "x.json"],
           "unknown --metric 'curved'", tmp_path / "x.json")
    _fails(["fit", meas, "--method", "laplace", "--metric", "pilot", "-o",
            tmp_path / "x.json"], "--metric applies to --method nuts only", tmp_path / "x.json")
    # the pilot's map is the collapsed path's: on another path, an error that says so
    _fails(["fit", meas, "--method", "nuts", "--path", path, "--metric", "pilot", "--iters", 2,
            "-o", tmp_path / "x.json"], "--metric pilot is the collapsed path's",
           tmp_path / "x.json")


def test_nuts_draws_batches_until_converged_within_the_time_limit(tmp_path):
    """By default ``dpgm fit --method nuts`` keeps drawing batches of ``--iters`` draws per
    chain while R-hat > 1.01 or bulk ESS < 400, says so, and the provenance counts them."""
    meas, post = tmp_path / "m.json", tmp_path / "post.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", meas, "--clique",
         "Sex,Survived", "--epsilon", "1", "--seed", "0"])
    output = _ok(["fit", meas, "--method", "nuts", "--iters", 40, "--chains", 2, "--keep-draws",
                  100, "-o", post])
    options = json.loads(post.read_text())["provenance"]["options"]
    assert options["batches"] >= 1 and options["time_limit"] == 600
    assert options["draws"] == 80 * (1 + options["batches"])
    # the model file keeps 100 draws, evenly spaced; R-hat and ESS are those of all draws
    assert options["draws_kept"] == 100 and load_model(post).model.batch_shape == (100,)
    assert (f"the model file keeps 100 of the {options['draws']} draws, evenly spaced "
            "(--keep-draws)") in output
    assert options["max_rhat"] <= 1.01 and options["min_ess_bulk"] >= 400
    assert (f"{options['draws']} posterior draws (2 chain(s), then {options['batches']} further "
            "batch(es) of 40 draws per chain to converge") in output
    assert re.search(r"after 80 draws: worst R-hat \d\.\d{3}, smallest bulk ESS \d+ \(aim: "
                     r"≤ 1\.01 and ≥ 400\); batch 1 of 40 more draws per chain, \d+ s left of "
                     r"the time limit", output)
    _fails(["fit", meas, "--method", "nuts", "--time-limit", -1, "-o", tmp_path / "x.json"],
           "--time-limit must be 0 or more seconds", tmp_path / "x.json")
    _fails(["fit", meas, "--method", "nuts", "--keep-draws", -1, "-o", tmp_path / "x.json"],
           "--keep-draws must be 0 (all) or more", tmp_path / "x.json")
    _fails(["fit", meas, "--method", "nuts", "--target-accept", 1, "-o", tmp_path / "x.json"],
           "--target-accept must lie strictly between 0 and 1", tmp_path / "x.json")


def test_parallel_chains_report_their_steps_as_lines():
    """NumPyro's per-chain bars of parallel chains (``tqdm_auto(range(total), position=chain)``,
    updated by increments) become ``advance_to(chain, step, total)``."""
    from numpyro_dpgm.cli._progress import _ChainLines

    seen = []
    bar = _ChainLines(lambda *a: seen.append(a))(range(10), position=1)
    bar.set_description("Compiling.. ", refresh=True)
    for step in (0, 5, 5):
        bar.update(step)
    bar.close()
    assert seen == [(1, 0, 10), (1, 5, 10), (1, 10, 10)]


def test_nuts_runs_its_chains_in_parallel_in_a_fresh_process(tmp_path):
    """A fresh ``dpgm fit --method nuts`` gives JAX one CPU device per chain before it starts,
    so that the chains run in parallel; the provenance says how they ran."""
    meas, post = tmp_path / "m.json", tmp_path / "post.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", meas, "--clique",
         "Sex,Survived", "--epsilon", "1", "--seed", "0"])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-m", "numpyro_dpgm.cli", "fit", str(meas),
                           "--method", "nuts", "--iters", "30", "--time-limit", "0", "-o",
                           str(post)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    options = json.loads(post.read_text())["provenance"]["options"]
    assert options["chain_method"] == "parallel" and options["draws"] == 60


def test_nuts_with_the_conditional_coding(tmp_path):
    """``--coding conditional`` puts the prior on the junction tree's conditionals (reference
    levels from the release) and the provenance says so; bad uses fail before writing."""
    meas, post = tmp_path / "m.json", tmp_path / "post.json"
    _ok(["release", TITANIC, "--domain", TITANIC_DOMAIN, "-o", meas, "--clique",
         "Sex,Survived", "--epsilon", "1", "--seed", "0"])
    output = _ok(["fit", meas, "--method", "nuts", "--iters", 20, "--chains", 1, "--path",
                  "relaxed", "--coding", "conditional", "--time-limit", 0, "-o", post])
    assert "NUTS path: relaxed" in output
    options = json.loads(post.read_text())["provenance"]["options"]
    assert options["coding"] == "conditional" and options["draws"] == 20
    _fails(["fit", meas, "--method", "nuts", "--coding", "cpt", "-o", tmp_path / "x.json"],
           "unknown --coding 'cpt'", tmp_path / "x.json")
    _fails(["fit", meas, "--coding", "reference", "-o", tmp_path / "x.json"],
           "--coding applies to --method nuts only", tmp_path / "x.json")

