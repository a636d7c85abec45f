"""Reproduction study for "Relaxed marginal consistency for differentially private query answering"
(seed 003, McKenna, Pradhan, Sheldon & Miklau 2021).

1. **Appendix C.4 (Adult, accuracy).** 32 random 2-way marginals of the Adult data (the cliques
   ``RandomState(0).choice(91, 32, replace=False)`` over ``itertools.combinations`` of the
   attributes, as in the paper's script) are measured with the Gaussian mechanism at
   (ε, δ = 10⁻⁶) and estimated with Prox-PGM using the exact oracle (Private-PGM) and the
   saturated region graph with Convex-GBP (APPGM). The error is the total-variation distance
   ``½‖μ̂_C − n_C‖₁/N`` averaged over the 32 marginals (the paper's "L1 error").
   **Calibration:** to reproduce the paper's numbers we use *its* calibration: add/remove
   neighbours (L2 sensitivity ``√32``) and ``σ = σ_RDP(ε, δ)·√32`` with ``σ_RDP`` the
   sensitivity-1 noise of autodp's RDP calibrator that the paper's script calls (values
   tabulated below). The paper's Definition 1 uses replace-one neighbours, under which the same
   σ would give a weaker guarantee (sensitivity ``√64``). Every σ used is checked to satisfy
   (ε, δ)-DP under add/remove with the analytic Gaussian bound (Balle & Wang 2018) and debited
   on a ledger. Noise comes from seeded JAX keys: a simulation study.
2. **Figure 2(c) (scalability).** 100 attributes with 10 values each, ``m`` random 3-way
   cliques measured with Laplace noise (scale ``m/ε``, ε = 1, on counts of 10,000 uniform random
   records; the values are irrelevant to the timing): seconds per Prox-PGM iteration with the
   exact and the Convex-GBP oracle, and the size of each oracle's state (junction-tree cells
   for exact, region-graph cells for APPGM, times 8 bytes) as the memory measure. The exact
   oracle is refused once its junction tree exceeds ``EXACT_CELL_CAP`` cells.

Implementation notes. The exact oracle uses the "min_size" triangulation (Private-PGM's
greedy order): on these 32 cliques min-fill gives a 5.9·10⁹-cell junction tree and min-size a
1.4·10⁷-cell one. Our Prox-PGM uses an Armijo line search with every oracle; with one warm-started
Convex-GBP sweep per call (the paper's practice, with a fixed step) the line search stalls, so
the region-graph oracle runs 5 sweeps per call (``ConvexGBPOracle(iters=5)``). The paper ran
10,000 iterations per fit; the iteration counts used here are in ``adult_config.csv``.

:func:`run` writes ``adult_errors.csv`` (one row per ε, oracle and trial), ``adult_summary.csv``
(means and standard deviations beside the paper's numbers), ``adult_config.csv``,
``adult_errors.png``, ``scalability.csv`` and ``scalability.png``, and returns the folder.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np

from numpyro_dpgm.data import count, load_demo
from numpyro_dpgm.domain import Domain
from numpyro_dpgm.estimation.prox_pgm import prox_pgm
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.oracles.protocol import ConvexGBPOracle, ExactOracle
from numpyro_dpgm.oracles.region_graph import build_region_graph
from numpyro_dpgm.privacy.calibration import analytic_gaussian_delta, gaussian_sigma_approx
from numpyro_dpgm.privacy.guarantees import ApproxDP
from numpyro_dpgm.privacy.ledger import PrivacyLedger
from numpyro_dpgm.privacy.samplers import simulate_noise

from ._common import pyplot, write_csv

__all__ = ["DELTA", "EXACT_CELL_CAP", "PAPER", "SIGMA_RDP", "adult_cliques", "run", "settings"]

#: δ of the Appendix C.4 experiment.
DELTA = 1e-6
#: Sensitivity-1 Gaussian σ of autodp's RDP calibrator at δ = 1e-6 (the paper's calibration).
SIGMA_RDP = {0.01: 525.75, 0.0316: 166.32, 0.1: 52.66, 0.316: 16.717, 1.0: 5.350,
             3.16: 1.7525, 10.0: 0.6079, 31.6: 0.23384, 100.0: 0.10172}
#: The paper's Appendix C.4 table: ε -> (exact mean, sd, region graph mean, sd, noisy input).
PAPER = {
    0.01: (0.4375, 0.0245, 0.5630, 0.0344, 28.050),
    0.0316: (0.2848, 0.0081, 0.3277, 0.0100, 8.8782),
    0.1: (0.1724, 0.0032, 0.1788, 0.0025, 2.8091),
    0.316: (0.0908, 0.0009, 0.0931, 0.0018, 0.8919),
    1.0: (0.0433, 0.0008, 0.0447, 0.0006, 0.2853),
    3.16: (0.0187, 0.0001, 0.0198, 0.0002, 0.0934),
    10.0: (0.0074, 0.0001, 0.0087, 0.0001, 0.0324),
    31.6: (0.0037, 0.0000, 0.0045, 0.0000, 0.0125),
    100.0: (0.0027, 0.0000, 0.0032, 0.0000, 0.0054),
}
#: Largest junction tree (cells) the exact oracle is run on in the scalability study (1.6 GB).
EXACT_CELL_CAP = 2e8

_QUICK = {"epsilons": (0.1, 10.0), "trials": 1, "iters_exact": 8, "iters_approx": 300,
          "scal_m": (1, 8, 24), "scal_iters": 3, "oracles": ("exact", "region_graph"),
          "scal_budget": math.inf, "parts": ("adult", "scalability")}
_FULL = {"epsilons": (0.01, 0.1, 1.0, 10.0, 100.0), "trials": 5, "iters_exact": 10000,
         "iters_approx": 10000,
         "scal_m": (1, 4, 13, 29, 42, 51, 91, 193, 409, 1048, 2048, 4096, 10000),
         "scal_iters": 25, "oracles": ("exact", "region_graph"), "scal_budget": math.inf,
         "parts": ("adult", "scalability")}


def adult_cliques(domain: Domain, k: int = 32, seed: int = 0) -> list[tuple[str, ...]]:
    """The paper's random 2-way marginals: ``RandomState(seed).choice(C(d, 2), k)``."""
    pairs = list(itertools.combinations(domain.attrs, 2))
    idx = np.random.RandomState(seed).choice(len(pairs), k, replace=False)
    return [pairs[i] for i in idx]


def _tvd(estimate: Any, truth: dict, total: float) -> float:
    return float(np.mean([0.5 * np.abs(np.asarray(estimate[c]) - t).sum() / total
                          for c, t in truth.items()]))


def _oracles() -> dict[str, Any]:
    return {"exact": partial(ExactOracle, method="min_size"),
            "region_graph": partial(ConvexGBPOracle, iters=5)}


def _adult(cfg: dict, verbose: bool, log: Path | None = None) -> tuple[list[dict], list[dict]]:
    data = load_demo()
    dom = data.domain
    cliques = adult_cliques(dom)
    tables = count(data.records, cliques, dom)
    truth = {c: np.asarray(tables[c]) for c in cliques}
    total = float(data.total)
    network = MarkovNetwork(dom, cliques)
    sens = math.sqrt(len(cliques))  # add/remove L2 sensitivity of the 32 tables
    rows = []
    for eps in cfg["epsilons"]:
        sigma = SIGMA_RDP[eps] * sens
        # the paper's σ is at least the analytic one, so the release is (ε, δ)-DP (add/remove)
        assert analytic_gaussian_delta(sigma, eps, sens) <= DELTA
        sigma_analytic = gaussian_sigma_approx(eps, DELTA, sens)
        for trial in range(cfg["trials"]):
            ledger = PrivacyLedger(ApproxDP(eps, DELTA))
            ledger.debit(ApproxDP(eps, DELTA), f"Gaussian release of 32 marginals (trial {trial})",
                         {"sigma": sigma, "neighbours": "add_remove", "sampler": "jax"})
            key = jax.random.fold_in(jax.random.key(2021), trial * 1000 + int(eps * 1000))
            keys = jax.random.split(key, len(cliques))
            ms = [Measurement(c, truth[c].ravel()
                              + np.asarray(simulate_noise(k, Gaussian(sigma), truth[c].size)),
                              Gaussian(sigma)) for c, k in zip(cliques, keys, strict=True)]
            noisy = _tvd({c: m.values.reshape(truth[c].shape) for c, m in zip(cliques, ms,
                                                                               strict=True)},
                         truth, total)
            for name, factory in _oracles().items():
                if name not in cfg["oracles"]:
                    continue
                iters = cfg["iters_exact"] if name == "exact" else cfg["iters_approx"]
                t0 = time.perf_counter()
                # the paper's fixed iterations; its error is of the oracle's marginals
                # (the maximum-entropy model is not fitted: model_fit="oracle")
                fit = prox_pgm(ms, network, total_count=total, max_iters=iters, oracle=factory,
                               tol=0.0, stop="optimum", model_fit="oracle")
                err = _tvd(fit.extras["marginals"], truth, total)
                rows.append({"epsilon": eps, "oracle": name, "trial": trial, "error": err,
                             "noisy_error": noisy, "sigma": sigma,
                             "sigma_analytic": sigma_analytic, "iterations": fit.iterations,
                             "converged": fit.converged,
                             "seconds": time.perf_counter() - t0,
                             "load_average": os.getloadavg()[0]})
                if log is not None:
                    write_csv(log, rows)
                if verbose:
                    print(f"eps={eps:g} {name} trial {trial}: error {err:.4f} "
                          f"({fit.iterations} it, {rows[-1]['seconds']:.0f}s)", flush=True)
    summary = []
    for eps in cfg["epsilons"]:
        paper = PAPER[eps]
        for j, name in enumerate(("exact", "region_graph")):
            errs = [r["error"] for r in rows if r["epsilon"] == eps and r["oracle"] == name]
            if not errs:
                continue
            summary.append({"epsilon": eps, "oracle": name, "mean_error": float(np.mean(errs)),
                            "sd_error": float(np.std(errs, ddof=1)) if len(errs) > 1 else 0.0,
                            "trials": len(errs), "paper_mean": paper[2 * j],
                            "paper_sd": paper[2 * j + 1],
                            "noisy_error": float(np.mean([r["noisy_error"] for r in rows
                                                          if r["epsilon"] == eps])),
                            "paper_noisy": paper[4]})
    return rows, summary


def _scalability(cfg: dict, verbose: bool, log: Path | None = None) -> list[dict]:
    d, k = 100, 10
    dom = Domain({f"x{i}": k for i in range(d)})
    rng = np.random.RandomState(0)
    records = rng.randint(0, k, size=(10_000, d))
    triples = list(itertools.combinations(range(d), 3))
    rows: list[dict] = []
    start = time.perf_counter()
    for m in cfg["scal_m"]:
        if rows and time.perf_counter() - start > cfg["scal_budget"]:
            rows.append({"m": m, "oracle": "-", "cells": float("nan"), "state_mb": float("nan"),
                         "seconds_per_iteration": float("nan"),
                         "status": f"not run (time budget {cfg['scal_budget']:g}s spent)",
                         "load_average": os.getloadavg()[0]})
            if log is not None:
                write_csv(log, rows)
            break
        idx = rng.choice(len(triples), m, replace=False)
        cliques = [tuple(f"x{i}" for i in triples[j]) for j in idx]
        tables = count(records, cliques, dom)
        scale = m / 1.0
        key = jax.random.key(m)
        ms = [Measurement(c, np.asarray(tables[c]).ravel()
                          + np.asarray(simulate_noise(jax.random.fold_in(key, i), Laplace(scale),
                                                      np.asarray(tables[c]).size)),
                          Laplace(scale)) for i, c in enumerate(cliques)]
        net = MarkovNetwork(dom, cliques)
        for name, factory in _oracles().items():
            if name not in cfg["oracles"]:
                continue
            if name == "exact":
                cells = float(jt.build_junction_tree(net, "min_size").num_cells)
            else:
                cells = float(build_region_graph(net, "saturated", "convex", True).num_cells)
            row = {"m": m, "oracle": name, "cells": cells, "state_mb": cells * 8 / 2**20,
                   "seconds_per_iteration": float("nan"), "status": "ok"}
            if name == "exact" and cells > EXACT_CELL_CAP:
                row["status"] = "refused (junction tree too large)"
            else:
                try:
                    # the same call twice: the first compiles, the second is timed; the
                    # oracle's iterations only (no maximum-entropy model after them)
                    options = dict(total_count=10_000, max_iters=cfg["scal_iters"],
                                   oracle=factory, tol=0.0, stop="optimum", model_fit="oracle")
                    prox_pgm(ms, net, **options)
                    t0 = time.perf_counter()
                    fit = prox_pgm(ms, net, **options)
                    row["seconds_per_iteration"] = ((time.perf_counter() - t0)
                                                    / max(fit.iterations, 1))
                except (MemoryError, RuntimeError) as err:  # XLA out-of-memory
                    row["status"] = f"failed: {type(err).__name__}"
            row["load_average"] = os.getloadavg()[0]
            rows.append(row)
            if log is not None:
                write_csv(log, rows)
            if verbose:
                print(f"m={m} {name}: {row['status']} {row['seconds_per_iteration']:.3g}s/it "
                      f"{row['state_mb']:.3g}MB", flush=True)
    return rows


def _plots(out: Path, summary: list[dict], scal: list[dict]) -> None:
    """Write ``adult_errors.png`` and ``scalability.png`` for the parts that ran."""
    plt = pyplot()

    if summary:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, color in (("exact", "C0"), ("region_graph", "C1")):
            rows = [r for r in summary if r["oracle"] == name]
            eps = [r["epsilon"] for r in rows]
            ax.errorbar(eps, [r["mean_error"] for r in rows], [r["sd_error"] for r in rows],
                        marker="o", color=color, label=f"{name} (ours)")
            peps = sorted(PAPER)
            ax.plot(peps, [PAPER[e][0 if name == "exact" else 2] for e in peps], "--",
                    color=color, alpha=0.6, label=f"{name} (paper)")
        ax.set(xscale="log", yscale="log", xlabel="ε (δ = 1e-6)", ylabel="mean TVD, 32 marginals",
               title="Adult, 32 random 2-way marginals (App. C.4)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "adult_errors.png", dpi=120)
        plt.close(fig)
    if scal:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, color in (("exact", "C0"), ("region_graph", "C1")):
            rows = [r for r in scal if r["oracle"] == name and r["status"] == "ok"]
            ax.plot([r["m"] for r in rows], [r["seconds_per_iteration"] for r in rows], "o-",
                    color=color, label=name)
        ax.set(xscale="log", yscale="log", xlabel="number of random 3-way cliques",
               ylabel="seconds per iteration", title="100 attributes, domain 10 (Fig. 2c)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "scalability.png", dpi=120)
        plt.close(fig)


def settings(quick: bool = False, **overrides: Any) -> dict[str, Any]:
    """The settings of a run: the mode's, with ``overrides`` checked and applied.

    A single value given for a setting that holds several (``epsilons=10``) is taken as a
    one-element tuple. See :func:`run` for the names.

    Raises
    ------
    ValueError
        An unknown setting, an ε without a tabulated σ, or an unknown oracle or part.

    Examples
    --------
    >>> settings(quick=True, epsilons=10.0, oracles="exact")["epsilons"]
    (10.0,)
    """
    cfg = dict(_QUICK if quick else _FULL)
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; valid: {sorted(cfg)}")
    for key, value in overrides.items():
        several = isinstance(cfg[key], tuple)
        cfg[key] = (tuple(value) if isinstance(value, tuple | list) else (value,)) if several \
            else value
    if not set(cfg["epsilons"]) <= set(SIGMA_RDP):
        raise ValueError(f"epsilons must be among {sorted(SIGMA_RDP)}, got {cfg['epsilons']}")
    if not set(cfg["oracles"]) <= {"exact", "region_graph"} or not cfg["oracles"]:
        raise ValueError(f"oracles must be a non-empty subset of ('exact', 'region_graph'), "
                         f"got {cfg['oracles']!r}")
    if not set(cfg["parts"]) <= {"adult", "scalability"} or not cfg["parts"]:
        raise ValueError(f"parts must be a non-empty subset of ('adult', 'scalability'), "
                         f"got {cfg['parts']!r}")
    for key in ("trials", "iters_exact", "iters_approx", "scal_iters"):
        if not isinstance(cfg[key], int | np.integer) or cfg[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {cfg[key]!r}")
    return cfg


def run(out_dir: str | Path, quick: bool = False, verbose: bool = False,
        **overrides: Any) -> Path:
    """Run the study and write its tables and figures (see the module notes).

    Parameters
    ----------
    out_dir : path
        Output folder (created).
    quick : bool
        Two ε values (0.1, 10), one trial, 8 exact and 300 region-graph iterations, up to 24
        cliques in the scalability study: a few minutes on two cores. The full mode follows the
        paper (five ε, five trials, 10,000 iterations; scalability up to 10⁴ cliques) and
        takes days for the exact oracle on a CPU (about 1.2 s per iteration on two cores).
    verbose : bool
        Print progress.
    **overrides
        Replace settings of the chosen mode (for bounded runs): ``epsilons`` (values among
        ``SIGMA_RDP``), ``trials``, ``iters_exact``, ``iters_approx``, ``oracles`` (a subset of
        ``("exact", "region_graph")``), ``parts`` (a subset of ``("adult", "scalability")``),
        ``scal_m`` (clique counts), ``scal_iters`` and ``scal_budget`` (seconds after which
        no further clique count is started), checked by :func:`settings`
        (``python -m studies mckenna2021 --set KEY=VALUE``). Rows are written to the CSV files as
        they finish.

    Returns
    -------
    Path
        The output folder.

    Raises
    ------
    ValueError
        An unknown override, an ε without a tabulated σ, or an unknown oracle or part.
    """
    if not jax.config.jax_enable_x64:
        raise RuntimeError("enable float64 first: numpyro.enable_x64()")
    cfg = settings(quick, **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    summary: list[dict] = []
    scal: list[dict] = []
    if "adult" in cfg["parts"]:
        rows, summary = _adult(cfg, verbose, out / "adult_errors.csv")
        write_csv(out / "adult_summary.csv", summary)
        write_csv(out / "adult_config.csv", [{
            "mode": "quick" if quick else "full",
            "epsilons": " ".join(map(str, cfg["epsilons"])),
            "trials": cfg["trials"], "iters_exact": cfg["iters_exact"],
            "iters_region_graph": cfg["iters_approx"], "oracles": " ".join(cfg["oracles"]),
            "exact_triangulation": "min_size", "region_graph_sweeps_per_call": 5,
            "delta": DELTA, "calibration":
            "add/remove, sigma = sigma_RDP(eps, delta) * sqrt(32) (the paper's)",
            "seconds": time.perf_counter() - start, "load_average": os.getloadavg()[0]}])
    if "scalability" in cfg["parts"]:
        scal = _scalability(cfg, verbose, out / "scalability.csv")
    _plots(out, summary, scal)
    return out
