"""The study's entry point: the full and quick grids and :func:`run`."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import jax

from .._common import write_csv
from .fits import resolve_batch
from .mobility import mobility_grid
from .report import plot_mobility, summarise, summary_markdown, write_synthetic
from .synthetic import synthetic_grid

__all__ = ["FULL", "METHODS", "PSGD_OPTIONS", "QUICK", "run"]

#: The methods of the synthetic grid (``method`` column of ``synthetic.csv``).
METHODS = ("naive", "cgm_em", "psgd", "nonprivate", "random")

#: The grids. Quick: the middle of the paper's grid (N = 10⁴, ε ∈ {0.1, 1}) on both models with
#: 3 × 3 nested trials instead of 5 × 5, and one small mobility cell.
#: PSGD (the slowest method) gets ``psgd_replicates`` noise draws per population.
FULL = {"k": (10, 20), "models": ("chain3", "er"), "sizes": (1_000, 10_000, 100_000),
        "epsilons": (0.1, 1.0, 10.0), "populations": 5, "replicates": 5, "psgd_replicates": 5,
        "timing_cell": (10, 10_000, 1.0), "batch": "auto",
        "mobility": {"sizes": (1_000, 10_000), "epsilons": (0.1, 1.0, 10.0),
                     "populations": 2, "replicates": 1}}
QUICK = {"k": (10,), "models": ("chain3", "er"), "sizes": (10_000,), "epsilons": (0.1, 1.0),
         "populations": 3, "replicates": 3, "psgd_replicates": 1, "timing_cell": None,
         "batch": "auto",
         "mobility": {"sizes": (2_000,), "epsilons": (1.0,), "populations": 1,
                      "replicates": 1}}
#: PSGD's settings (psgd's defaults: 5 epochs, lot √N, clip √|𝒞|, learning rate 0.5).
PSGD_OPTIONS: dict = {}


def run(out: Path | str, quick: bool = False, grid: dict | None = None,
        log: Any = print) -> Path:
    """Run the study and write its tables and figures to ``out``; returns ``out``.

    ``grid`` overrides :data:`FULL` / :data:`QUICK` (same keys). Needs float64 (the CLI enables
    it).
    """
    if not jax.config.jax_enable_x64:
        raise RuntimeError("bernstein2017 needs float64: call numpyro.enable_x64() first")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = dict(QUICK if quick else FULL, **(grid or {}))
    start = time.perf_counter()
    load0 = os.getloadavg()
    rows, timing, speed = [], [], []
    cell = tuple(g["timing_cell"]) if g.get("timing_cell") else None
    batch = resolve_batch(g.get("batch", "auto"))
    log(f"bernstein2017: trials of a cell run as {batch!r} on {jax.default_backend()}")
    mob = g.get("mobility")
    for pos, k in enumerate(g["k"]):
        for kind in g["models"]:
            def flush(r: list, t: list, s: list, kind: str = kind, k: int = k,
                      done: tuple = (rows, timing, speed)) -> None:
                write_synthetic(out, done[0] + r, done[1] + t, done[2] + s, kind, k)

            r, t, s = synthetic_grid(kind, k, g["sizes"], g["epsilons"], g["populations"],
                                     g["replicates"], g["psgd_replicates"], cell, PSGD_OPTIONS,
                                     log, flush, batch)
            rows += r
            timing += t
            speed += s
        if mob and pos == 0:  # after the first |X|, so that a cut-off run has every part
            mrows = mobility_grid(mob["sizes"], mob["epsilons"], mob["populations"],
                                  mob["replicates"], PSGD_OPTIONS, log)
            write_csv(out / "mobility.csv", mrows)
            msum = summarise(mrows, ("N", "epsilon", "method"), "heldout_ll")
            write_csv(out / "mobility_summary.csv", msum)
            plot_mobility(msum, out / "mobility.png")
    meta = {"quick": quick, "grid": g, "batch": batch, "backend": jax.default_backend(),
            "wall_s": time.perf_counter() - start,
            "loadavg_start": load0, "loadavg_end": os.getloadavg(),
            "machine": platform.platform(), "jax": jax.__version__,
            "cpus": os.cpu_count()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    (out / "summary.md").write_text(summary_markdown(out))
    log(f"bernstein2017: {meta['wall_s']:.0f} s wall, load {load0} -> {meta['loadavg_end']}")
    return out
