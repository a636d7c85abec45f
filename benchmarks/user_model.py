"""A model the user writes against the library's own, on the same Adult release, exact path.

For each model of ``--models`` (``small``: 97 cells; ``mid``: 842 cells; networks of
:mod:`benchmarks.gibbs`) and each ``--eps``, one Laplace release of Adult's records (JAX sampler,
seeded), then ``run_nuts`` on:

- ``library``: ``noisy_marginals_model(net, release, N)`` on the exact path (record moves within
  Gibbs, NUTS on ``φ``), with its default non-centred moves, started from ``em_start``;
- ``library-plain``: the same without non-centred moves (``interweave=0``): the same sweep as
  the user's model;
- ``user``: the same model written by hand with the public distributions (``phi`` with the
  library's prior on the library model's ``coding``, ``CollectiveGraphicalModel(net, theta, N)``,
  ``LaplaceNoise(n, b)``), run by ``run_nuts(user_model, key, y)``, which finds the exact CGM site
  by tracing and builds :class:`~numpyro_dpgm.infer.bayes.CGMGibbs`; started from the same
  ``φ``.

Figures per run: wall time (compilation included) and its time per draw, worst split R-hat and
smallest bulk ESS over ``phi``, ESS per second, and the user's time per draw against
``library-plain``'s (the issue's target: at most 1.2×). Writes ``user_model.json`` /
``.csv`` under ``--out`` with the load average around every run. Run ``python -m benchmarks
user_model [--models small] [--eps 1] [--draws 500]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, json_default, load_average, new_record, write_results
from .workloads import ADULT_EDGES, adult_data, user_model_of

DESCRIPTION = "a user-written NumPyro model vs the library's model, exact path, same release"


def _run(model: Any, args: argparse.Namespace, *margs: Any, **kwargs: Any) -> dict[str, Any]:
    from numpyro_dpgm.infer.bayes import run_nuts
    from numpyro_dpgm.infer.bayes.checks import convergence_figures

    load0, t0 = load_average(), time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = run_nuts(model, jax.random.key(args.seed), *margs, num_warmup=args.draws,
                        num_samples=args.draws, num_chains=args.chains, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    extra = mcmc.get_extra_fields(group_by_chain=True)
    fig = convergence_figures(mcmc.get_samples(group_by_chain=True), ["phi"],
                              extra.get("num_steps"), 10)
    steps = 2 * args.draws * args.chains
    return {"path": mcmc.path, "path_reason": mcmc.path_reason, "wall_s": wall,
            "s_per_draw": wall / steps, "max_r_hat": fig.max_r_hat,
            "min_ess_bulk": fig.min_ess_bulk, "min_ess_per_s": fig.min_ess_bulk / wall,
            "max_depth_hits": fig.max_depth_hits,
            "warnings": sorted({w.category.__name__ for w in caught}),
            "load_before": load0, "load_after": load_average()}


def _one(kind: str, lib: Any, start: dict, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``kind`` (``library``, ``library-plain`` or ``user``) on the release."""
    if kind == "library":
        return _run(lib, args, init=start)
    if kind == "library-plain":
        return _run(lib, args, init=start, interweave=0)
    return _run(user_model_of(lib), args, np.asarray(lib.y), init={"phi": start["phi"]})


def study(args: argparse.Namespace) -> list[dict[str, Any]]:
    from numpyro_dpgm.estimation.cgm_em import em_start
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.privacy import simulate_release

    rows = []
    for name in args.models:
        data, net = adult_data(ADULT_EDGES[name], None, args.seed)
        for eps in args.eps:
            ms = simulate_release(data, net, eps, jax.random.key(args.seed + 7))
            lib = noisy_marginals_model(net, ms, int(data.total), relaxed=False)
            start = em_start(lib)
            base = {"model": name, "cells": net.num_params, "records": int(data.total),
                    "eps": eps, "params": lib.coding.dim, "coding": lib.coding.name}
            for kind in args.runs:
                rows.append({**base, "run": kind, **_one(kind, lib, start, args)})
                print(json.dumps(rows[-1], default=json_default), file=sys.stderr)
            done = {r["run"]: r for r in rows if r["model"] == name and r["eps"] == eps}
            if "user" in done and "library-plain" in done:
                done["user"]["cost_vs_library"] = (done["user"]["s_per_draw"]
                                                   / done["library-plain"]["s_per_draw"])
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="small")
    parser.add_argument("--eps", default="1")
    parser.add_argument("--runs", default="library,library-plain,user")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=500, help="warm-up and draws per chain")
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser, "user_model-cpu")
    parser.add_argument("--tag", default="user_model-cpu", help="the results' file stem")


def main(args: argparse.Namespace) -> int:
    jax.config.update("jax_enable_x64", True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    args.models = [m for m in args.models.split(",") if m]
    args.eps = [float(e) for e in args.eps.split(",") if e]
    args.runs = [r for r in args.runs.split(",") if r]
    record = new_record("user_model", settings)
    rows = study(args)
    record.update(rows=rows, load_average_end=load_average())
    for path in write_results(Path(args.out), args.tag, record, rows):
        print(path, file=sys.stderr)
    return 0
