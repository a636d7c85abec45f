"""``python -m studies``: every study is listed, bad input is an ``error:`` line and exit code 2
before anything is written, and ``--set`` bounds a run."""

from __future__ import annotations

import csv
import importlib
import inspect
import pkgutil

import pytest

import studies
from studies.__main__ import main


def test_every_study_is_listed():
    found = set()
    for info in pkgutil.iter_modules(studies.__path__):
        if info.name.startswith("_"):
            continue
        run = getattr(importlib.import_module(f"studies.{info.name}"), "run", None)
        if callable(run) and "quick" in inspect.signature(run).parameters:
            found.add(info.name)
    assert found == set(studies.STUDIES) == {"bernstein2017", "mckenna2021", "zhang2020"}


def _fails(args, needle, capsys):
    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err, err


def test_bad_input_is_refused_before_any_work(tmp_path, capsys):
    _fails(["no-such-paper"], "unknown study 'no-such-paper'", capsys)
    (tmp_path / "repro").mkdir()
    (tmp_path / "repro" / "notes.txt").write_text("keep me")
    _fails(["zhang2020", "--quick", "--out", tmp_path / "repro"], "already holds notes.txt",
           capsys)
    _fails(["zhang2020", "--quick", "--out", tmp_path / "repro" / "notes.txt"], "is a file",
           capsys)
    assert (tmp_path / "repro" / "notes.txt").read_text() == "keep me"


def test_set_bounds_a_run_and_refuses_bad_settings(tmp_path, capsys):
    """``--set KEY=VALUE`` replaces settings of mckenna2021's run (a bounded run: the
    scalability part alone at two clique counts); bad settings fail before anything is written."""
    out = tmp_path / "bounded"
    assert main(["mckenna2021", "--quick", "--out", str(out), "--set", "parts=scalability",
                 "--set", "scal_m=1,8", "--set", "scal_iters=2", "--set", "oracles=exact"]) == 0
    with open(out / "scalability.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["m"], r["oracle"]) for r in rows] == [("1", "exact"), ("8", "exact")]
    assert not (out / "adult_errors.csv").exists()
    bad = tmp_path / "bad"
    for setting, needle in (("nope=1", "unknown settings ['nope']"),
                            ("epsilons", "--set expects KEY=VALUE"),
                            ("epsilons=", "--set expects KEY=VALUE"),
                            ("epsilons=7", "epsilons must be among"),
                            ("oracles=exact,bp", "oracles must be a non-empty subset"),
                            ("iters_exact=0", "iters_exact must be a positive integer")):
        _fails(["mckenna2021", "--quick", "--out", bad, "--set", setting], needle, capsys)
        assert not bad.exists()
    _fails(["zhang2020", "--quick", "--out", bad, "--set", "trials=1"],
           "zhang2020 has no settings to replace", capsys)
    assert not bad.exists()


@pytest.mark.parametrize("text", ["a", "=1", "a="])
def test_a_setting_is_key_equals_value(text):
    from studies.__main__ import setting

    with pytest.raises(ValueError, match="KEY=VALUE|no value"):
        setting(text)
