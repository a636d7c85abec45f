"""The exact path of the Bayesian model (record swaps inside HMCGibbs) against relaxed NUTS.

Three studies, each run on both paths of :func:`numpyro_dpgm.infer.bayes.run_nuts`
(``exact=True``: NUTS on ``φ`` within Gibbs, exact record swaps on the integer tables ``n``;
``exact=False``: NUTS on ``φ`` and the relaxed tables together):

- ``adult``: Adult models, a release at each ``--eps`` (Laplace or ``--mechanism``, add/remove,
  ε split by the sensitivity rule, JAX sampler seeded), run as ``dpgm fit --method nuts`` runs
  them (``--chains`` chains of ``--draws`` warm-up + ``--draws`` draws, started from the NLBP-EM
  estimate ``em_start``). Models (``--models``): ``small``, Adult's ``sex – relationship –
  income>50K – education-num`` and ``sex – race`` edges of the demo's tree with their one-way
  tables (97 cells, 48,842 records); ``mid``, the demo tree's edges among ``marital-status,
  relationship, sex, race, income>50K, education-num, occupation, workclass, hours-per-week``
  with their one-way tables (842 cells); ``capital``, ``income>50K – capital-gain –
  capital-loss`` (the demo tree's leakiest table, 10,402 cells); ``tree``, the demo's whole tree
  with its one-way tables (20,774 cells); ``big-small``, ``big-mid``, ``big-tree``:
  the same networks on ``--records`` records (default 250,000) drawn from the model fitted to
  Adult's true tables (junction-tree MLE). Figures per run: wall time (compilation included),
  worst rank-normalised split R-hat and smallest bulk ESS over ``φ`` (run_nuts's own checks),
  bulk ESS per second, draws at the maximum tree depth, the relaxation leak of the leakiest
  latent table at the posterior mean ``θ``, and for that table the posterior mean mass in cells
  whose exact-path posterior mean is below one record (both paths). ``--interweave 0,16,64``
  runs the exact path once per number of non-centred moves per step. ``--paths`` picks the runs
  per release: ``exact``, ``relaxed`` (the default pair), ``normal`` (the relaxed path on the
  normal relaxation, ``relaxation="normal"``) and ``default``, ``run_nuts``'s own choice (also
  in the coverage study, which runs ``exact``, ``relaxed`` and ``normal`` as asked).
  ``--mechanism gaussian`` releases with Gaussian noise at the ρ = ε²/2 zCDP that ε-DP
  implies (default Laplace at ε). ``--coding conditional`` puts the prior on the junction tree's
  conditional log odds instead of the reference coding, ``--reference released`` the reference
  levels at the release's most frequent levels. Every run records the path, the reason it was
  chosen and the median noise share of the released values (``released_noise_share``), on which
  the choice rests.
- ``coverage``: sparse tables: ``--releases`` simulated releases of one attribute of
  ``--levels`` levels (``θ`` drawn from the prior, scale 3, so most cells expect under one
  record; ``N = --coverage-n`` records; Laplace ``b = 2``), fitted in one plate-batched run per
  path; the fraction of true cell probabilities inside the central 90 % posterior intervals.

Writes ``gibbs.json`` and ``gibbs.csv`` under ``--out`` with the machine and its load average
before and after every run. Run ``python -m benchmarks gibbs [--studies adult,coverage]
[--models small,mid] [--eps 1,0.1]``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, json_default, load_average, machine
from .workloads import ADULT_EDGES, adult_data

DESCRIPTION = "exact (HMCGibbs record swaps) vs relaxed NUTS: Adult posteriors, ESS/s, coverage"

EDGES = ADULT_EDGES


def _tree() -> list:
    from numpyro_dpgm.demo import ADULT_TREE

    return list(ADULT_TREE)


def run_path(model: Any, exact: bool, args: argparse.Namespace, seed: int,
             **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """One run of ``run_nuts`` on a path; its figures and the MCMC object."""
    from numpyro_dpgm.infer.bayes import run_nuts
    from numpyro_dpgm.infer.bayes.checks import convergence_figures
    from numpyro_dpgm.infer.bayes.interweave import released_noise_share

    noise_share = float(np.median(released_noise_share(model)))

    load0 = load_average()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = run_nuts(model, jax.random.key(seed), num_warmup=args.draws,
                        num_samples=args.draws, num_chains=args.chains, exact=exact,
                        gibbs_moves=args.moves, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
    wall = time.perf_counter() - t0
    grouped = mcmc.get_samples(group_by_chain=True)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    fig = convergence_figures(grouped, ["phi"], extra.get("num_steps"), 10)
    out = {"path": mcmc.path, "chosen": "default" if exact is None else "given",
           "path_reason": mcmc.path_reason, "noise_share": noise_share, "wall_s": wall,
           "max_r_hat": fig.max_r_hat, "worst": fig.worst,
           "min_ess_bulk": fig.min_ess_bulk, "min_ess_per_s": fig.min_ess_bulk / wall,
           "max_depth_hits": fig.max_depth_hits, "draws": fig.num_draws,
           "divergences": int(np.sum(np.asarray(extra.get("diverging", 0)))),
           "warnings": sorted({w.category.__name__ for w in caught}),
           "load_before": load0, "load_after": load_average()}
    return out, mcmc


def leaky_table(model: Any, exact_n: np.ndarray, relaxed_n: np.ndarray,
                theta: np.ndarray) -> dict[str, Any]:
    """The leakiest latent table at ``θ``: its leak, and both paths' posterior mean mass in the
    cells whose exact posterior mean is below one record."""
    leak = model.relaxation_leak(theta)
    clique, worst = max(leak.items(), key=lambda kv: kv[1])
    sl = model.latent_network.slice_of(clique)
    e, r = exact_n[:, sl].mean(0), relaxed_n[:, sl].mean(0)
    sparse = e < 1.0
    return {"leaky_clique": ",".join(clique), "leak_at_mean_theta": worst,
            "sparse_cells": int(sparse.sum()), "leaky_table_cells": int(sparse.size),
            "exact_sparse_mass": float(e[sparse].sum()),
            "relaxed_sparse_mass": float(r[sparse].sum()),
            "max_abs_mean_diff": float(np.max(np.abs(e - r)))}


def study_adult(args: argparse.Namespace) -> list[dict[str, Any]]:
    from numpyro_dpgm.estimation.cgm_em import em_start
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.privacy import ZCDP, simulate_release

    rows = []
    for name in args.models:
        big = name.startswith("big-")
        edges = _tree() if name.endswith("tree") else EDGES[name.removeprefix("big-")]
        data, net = adult_data(edges, args.records if big else None, args.seed)
        for eps in args.eps:
            budget = eps if args.mechanism == "laplace" else ZCDP(eps**2 / 2)
            ms = simulate_release(data, net, budget, jax.random.key(args.seed + 7),
                                  mechanism=args.mechanism)
            model = noisy_marginals_model(net, ms, int(data.total), coding=args.coding,
                                          reference=args.reference or None)
            start = em_start(model)
            base = {"study": "adult", "model": name, "records": int(data.total), "eps": eps,
                    "mechanism": args.mechanism, "coding": model.coding.name,
                    "reference": args.reference or ("released" if args.coding == "auto"
                                                    and model.coding.name == "conditional"
                                                    else "level 0"),
                    "cells": net.num_params, "params": model.coding.dim}
            runs, first = {}, len(rows)
            paths = ([(True, k) for k in args.interweave] * ("exact" in args.paths)
                     + [(False, None)] * ("relaxed" in args.paths)
                     + [("normal", None)] * ("normal" in args.paths)
                     + [(None, None)] * ("default" in args.paths))
            for exact, weave in paths:
                kwargs = {"interweave": weave} if exact is True else {}
                sampled = model.with_relaxation("normal") if exact == "normal" else model
                fig, mcmc = run_path(sampled, False if exact == "normal" else exact, args,
                                     args.seed, init=start, **kwargs)
                runs[exact] = mcmc
                rows.append({**base, **fig, "interweave": weave,
                             "relaxation": (mcmc.model.relaxation if fig["path"] != "exact"
                                            else None)})
                print(json.dumps(rows[-1], default=json_default), file=sys.stderr)
            if True in runs and False in runs:
                theta = np.asarray(runs[True].get_samples()["theta"]).mean(0)
                cmp = leaky_table(model, np.asarray(runs[True].get_samples()["n"]),
                                  np.asarray(runs[False].get_samples()["n"]), theta)
                for row in rows[first:]:
                    row.update(cmp)
    return rows


def study_coverage(args: argparse.Namespace) -> list[dict[str, Any]]:
    from numpyro_dpgm import MarkovNetwork
    from numpyro_dpgm.distributions import CollectiveGraphicalModel
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.measurements import Laplace, Measurement

    k, total, reps, b = args.levels, args.coverage_n, args.releases, 2.0
    net = MarkovNetwork({"a": k}, [("a",)])
    rng = np.random.default_rng(args.seed)
    phi = rng.normal(0.0, 3.0, size=(reps, k - 1))
    theta = np.concatenate([np.zeros((reps, 1)), phi], axis=1)
    mu = np.exp(theta - theta.max(1, keepdims=True))
    mu /= mu.sum(1, keepdims=True)
    counts = np.stack([np.asarray(CollectiveGraphicalModel(net, t, total).sample(
        jax.random.key(args.seed + i))) for i, t in enumerate(theta)])
    y = counts + rng.laplace(0.0, b, size=counts.shape)
    model = noisy_marginals_model(net, [Measurement(("a",), y[0], Laplace(b))], total,
                                  prior_scale=3.0, coding="reference")  # θ's prior
    rows = []
    runs = ([(model, True)] * ("exact" in args.paths) + [(model, False)] * ("relaxed" in args.paths)
            + [(model.with_relaxation("normal"), False)] * ("normal" in args.paths))
    for sampled, exact in runs:
        fig, mcmc = run_path(sampled, exact, args, args.seed, y=y)
        draws = np.asarray(mcmc.get_samples()["mu"])  # (draws, R, k)
        lo, hi = np.quantile(draws, [0.05, 0.95], axis=0)
        inside = (lo <= mu) & (mu <= hi)
        sparse = mu * total < 1.0
        rows.append({"study": "coverage", "model": f"one attribute, {k} levels",
                     "relaxation": mcmc.model.relaxation if fig["path"] != "exact" else None,
                     "records": total, "releases": reps, "cells": k, **fig,
                     "coverage": float(inside.mean()),
                     "coverage_sparse_cells": float(inside[sparse].mean()),
                     "sparse_fraction": float(sparse.mean())})
        print(json.dumps(rows[-1], default=json_default), file=sys.stderr)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--studies", default="adult,coverage")
    parser.add_argument("--models", default="small,mid,big-small")
    parser.add_argument("--eps", default="1,0.1")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=500, help="warm-up and draws per chain")
    parser.add_argument("--moves", type=int, default=None, help="record swaps per step")
    parser.add_argument("--interweave", default="",
                        help="comma-separated non-centred moves per step, one exact run each "
                             "(default: the library's default only)")
    parser.add_argument("--paths", default="exact,relaxed",
                        help="comma-separated runs per release: exact, relaxed, normal (the "
                             "normal relaxation, relaxation='normal') and default (run_nuts's own "
                             "choice of path)")
    parser.add_argument("--mechanism", choices=("laplace", "gaussian"), default="laplace",
                        help="noise of the Adult releases: Laplace at ε, or Gaussian at the "
                             "ρ = ε²/2 zCDP that ε-DP implies")
    parser.add_argument("--records", type=int, default=250_000,
                        help="records drawn for the big- models")
    parser.add_argument("--coding", choices=("reference", "conditional", "auto"),
                        default="reference",
                        help="the parameters the prior sits on (noisy_marginals_model's coding)")
    parser.add_argument("--reference", choices=("", "released"), default="",
                        help="reference levels: level 0 (empty) or the release's most frequent")
    parser.add_argument("--levels", type=int, default=6)
    parser.add_argument("--coverage-n", type=int, default=30)
    parser.add_argument("--releases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser, "gibbs-cpu")
    parser.add_argument("--tag", default="gibbs")


def main(args: argparse.Namespace) -> int:
    jax.config.update("jax_enable_x64", True)
    args.models = [m for m in args.models.split(",") if m]
    args.eps = [float(e) for e in args.eps.split(",") if e]
    args.interweave = [int(k) for k in args.interweave.split(",") if k] or [None]
    args.paths = [p for p in args.paths.split(",") if p]
    rows: list[dict[str, Any]] = []
    studies = args.studies.split(",")
    if "coverage" in studies:
        rows += study_coverage(args)
    if "adult" in studies:
        rows += study_adult(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "gibbs", "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": machine(), "options": {k: v for k, v in vars(args).items()
                                               if k != "func"}}
    (out / f"{args.tag}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2,
                                                     default=json_default))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"{args.tag}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v
                             for k, v in r.items()})
    return 0
