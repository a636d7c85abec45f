"""How far the worst split R-hat of a run stays above 1 when every chain mixes as it should.

``run_nuts``'s convergence rule asks for the worst rank-normalised split R-hat (bulk and folded,
:func:`numpyro_dpgm.infer.bayes.checks.convergence_figures`) at most 1.01 over every parameter
and latent cell, and the smallest bulk ESS at least 400. Over thousands of quantities the worst
R-hat of chains that have converged is a maximum of noise, and how far it rises depends on the
draws and their autocorrelation. This benchmark measures that floor with chains whose law is
known: every quantity an independent stationary AR(1) series of autocorrelation ``ρ`` (from its
stationary law, so there is nothing to converge), ``--chains`` chains of ``--draws`` draws, the
library's own R-hat and ESS, ``--reps`` repetitions per setting. A run whose smallest ESS is
like an AR(1)'s with the same smallest ESS, and whose worst R-hat is at this floor, needs more
draws, not a better sampler, to pass the rule.

Run ``python -m benchmarks rhat_floor [--quantities 200,600,2300] [--draws 500,1000]``; writes
``rhat_floor.json``/``.csv`` (each row: the setting, the median and 10 %/90 % quantiles over
repetitions of the worst R-hat, the median smallest and median bulk ESS, and the share of
repetitions that pass R-hat ≤ 1.01 and ESS ≥ 400).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .harness import add_out_argument, load_average, new_record, write_results

DESCRIPTION = "the worst split R-hat of chains that mix as they should (AR(1)): its noise floor"


def ar1_chains(rng: np.random.Generator, chains: int, draws: int, quantities: int,
               rho: float) -> np.ndarray:
    """``(chains, draws, quantities)`` stationary AR(1) draws of unit variance."""
    noise = rng.standard_normal((chains, draws, quantities))
    x = np.empty_like(noise)
    x[:, 0] = noise[:, 0]
    scale = np.sqrt(1.0 - rho * rho)
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + scale * noise[:, t]
    return x


def one_setting(rng: np.random.Generator, chains: int, draws: int, quantities: int, rho: float,
                reps: int) -> dict[str, Any]:
    """Figures over ``reps`` runs of :func:`ar1_chains`."""
    from numpyro.diagnostics import effective_sample_size

    from numpyro_dpgm.infer.bayes.checks import MAX_R_HAT, TARGET_ESS, convergence_figures

    worst, smallest, median = [], [], []
    for _ in range(reps):
        x = ar1_chains(rng, chains, draws, quantities, rho)
        fig = convergence_figures({"x": x}, ["x"])
        worst.append(fig.max_r_hat)
        smallest.append(fig.min_ess_bulk)
        median.append(float(np.median(effective_sample_size(x))))
    worst, smallest = np.asarray(worst), np.asarray(smallest)
    return {"chains": chains, "draws": draws, "quantities": quantities, "rho": rho,
            "reps": reps, "max_r_hat_median": float(np.median(worst)),
            "max_r_hat_q10": float(np.quantile(worst, 0.1)),
            "max_r_hat_q90": float(np.quantile(worst, 0.9)),
            "min_ess_bulk_median": float(np.median(smallest)),
            "ess_bulk_median": float(np.median(median)),
            "pass_share": float(np.mean((worst <= MAX_R_HAT) & (smallest >= TARGET_ESS)))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantities", default="200,600,2300",
                        help="comma-separated numbers of quantities (parameters and cells)")
    parser.add_argument("--draws", default="500,1000", help="comma-separated draws per chain")
    parser.add_argument("--rho", default="0,0.3,0.5,0.6,0.7,0.8",
                        help="comma-separated lag-one autocorrelations")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser, "rhat_floor")
    parser.add_argument("--tag", default="rhat_floor", help="the results' file stem")


def main(args: argparse.Namespace) -> int:
    record = new_record("rhat_floor", {k: v for k, v in vars(args).items() if k != "out"})
    rng = np.random.default_rng(args.seed)
    rows = []
    for quantities in (int(q) for q in args.quantities.split(",")):
        for draws in (int(d) for d in args.draws.split(",")):
            for rho in (float(r) for r in args.rho.split(",")):
                start = time.perf_counter()
                row = one_setting(rng, args.chains, draws, quantities, rho, args.reps)
                row["wall_s"] = time.perf_counter() - start
                rows.append(row)
                print(f"{quantities} quantities, {draws} draws, rho {rho}: worst R-hat "
                      f"{row['max_r_hat_median']:.4f}, smallest ESS "
                      f"{row['min_ess_bulk_median']:.0f}, pass {row['pass_share']:.0%}",
                      file=sys.stderr, flush=True)
    record.update(rows=rows, load_average_end=load_average())
    for p in write_results(Path(args.out), args.tag, record, rows):
        print(p, file=sys.stderr)
    return 0
