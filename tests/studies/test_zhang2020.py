"""The seed-001 reproduction study runs end to end in quick mode and writes its outputs."""

from __future__ import annotations

import csv

import numpy as np

from studies import zhang2020


def test_quick_run_writes_tables_and_figures(tmp_path):
    result = zhang2020.run(tmp_path, quick=True, verbose=False)
    names = {p.name for p in result["files"]}
    assert names == {
        "ising_error.csv", "pairwise_error.csv", "structure.csv", "summary.csv",
        "ising_error.png", "pairwise_error.png", "structure.png",
    }
    for name in names:
        path = tmp_path / name
        assert path.stat().st_size > 0
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "ising_error.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["privacy"] for r in rows} >= {"non-private"}
    errors = [float(r["error"]) for r in rows]
    assert all(np.isfinite(errors)) and min(errors) >= 0.0
    summary = {(r["study"], r["setting"], r["n"]): r["value"] for r in result["summary"]}
    # the curves behave as the sample-complexity statements say: error falls with n at every
    # privacy level, and privacy costs accuracy
    for (study, setting), slope in result["slopes"].items():
        assert slope < 0, (study, setting, slope)
    nmax = max(n for s, _, n in summary if s == "ising parameter error")
    assert (summary["ising parameter error", "non-private", nmax]
            < summary["ising parameter error", "eps=8", nmax]
            < summary["ising parameter error", "eps=1", nmax])
    rates = [v for (s, setting, _), v in summary.items()
             if s == "ising structure recovery rate" and setting.startswith("stable")]
    assert max(rates) >= 2 / 3
