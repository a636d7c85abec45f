"""Prox-PGM's stopping rules over many releases: optimum, discrepancy principle, least risk.

``prox_pgm(stop=...)`` with ``"optimum"`` (the minimiser of the loss),
``"discrepancy"`` (the mirror-descent path from the uniform distribution, stopped at the noise
level) and ``"risk"`` (the same path's iterate of least estimated risk, Stein's unbiased risk
estimate), on small problems where many releases are cheap, each with its own kind of data:

- ``cycle``: a dense 4-cycle of 6-cell tables (attributes of 2 and 3 values), strong
  interactions (θ ~ N(0, 1.5²)), 500 records, Gaussian σ = 30 on the four two-way tables;
- ``chain``: a chain of 6 attributes of 8 values, sparse tables (θ ~ N(0, 2²)), 5,000
  records, Laplace noise ``b = k/ε`` on the 6 one-way and 5 two-way tables at ε = 1;
- ``chain-low``: the same chain at ε = 20 (little noise);
- ``star``: 5 attributes of 10 values around a hub, 20,000 records, Gaussian σ = 20 on the
  four two-way tables.

Error: the mean over the released cliques of ``‖μ̂_C − n_C‖₁/N`` against the records' true
tables, averaged over ``--releases`` releases (mean and standard error; the noise is drawn with
the library's seeded simulation sampler). Time: the mean seconds of a fit after the first
(which compiles). The rule with the least mean error per problem is marked.

Run ``python -m benchmarks stopping [--releases 20] [--problems cycle,chain,...]``; writes
``stopping.json`` and ``stopping.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, load_average, new_record, write_results

DESCRIPTION = "Prox-PGM's stop rules (optimum, discrepancy, risk) over many releases"

RULES = ("optimum", "discrepancy", "risk")
#: name -> (attribute sizes, edges, θ scale, records, noise kind, noise parameter)
PROBLEMS: dict[str, tuple] = {
    "cycle": ((2, 3, 2, 3), ((0, 1), (1, 2), (2, 3), (3, 0)), 1.5, 500, "gaussian", 30.0),
    "chain": ((8,) * 6, tuple((i, i + 1) for i in range(5)), 2.0, 5000, "laplace", 1.0),
    "chain-low": ((8,) * 6, tuple((i, i + 1) for i in range(5)), 2.0, 5000, "laplace", 20.0),
    "star": ((10,) * 5, tuple((0, i) for i in range(1, 5)), 1.0, 20000, "gaussian", 20.0),
}
#: ``max_iters`` of every fit (the default rule stops by its tolerance long before).
MAX_ITERS = 20000


def problem(name: str, seed: int) -> tuple[Any, dict, list, float]:
    """The network, the true tables of its released cliques, their cliques and ``N``: records
    drawn from a model with random log-potentials on the problem's edges."""
    from numpyro_dpgm import MarkovNetwork, MarkovRandomField
    from numpyro_dpgm.data import count

    sizes, edges, scale, records, _, _ = PROBLEMS[name]
    attrs = [f"x{i}" for i in range(len(sizes))]
    domain = dict(zip(attrs, sizes, strict=True))
    net = MarkovNetwork(domain, [(attrs[a], attrs[b]) for a, b in edges])
    rng = np.random.default_rng(seed)
    model = MarkovRandomField(net, scale * rng.normal(size=net.num_params))
    data = np.asarray(model.sample(jax.random.key(seed), (records,)))
    released = list(net.cliques)
    if PROBLEMS[name][4] == "laplace":
        released = [(a,) for a in attrs] + released
    tables = count(data, released, net.domain)
    return net, {c: np.asarray(tables[c], dtype=float) for c in released}, released, \
        float(records)


def release(truth: dict, name: str, key: Any) -> list:
    """Noisy tables of every released clique."""
    from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
    from numpyro_dpgm.privacy.samplers import simulate_noise

    kind, parameter = PROBLEMS[name][4:]
    noise = Gaussian(parameter) if kind == "gaussian" else Laplace(len(truth) / parameter)
    keys = jax.random.split(key, len(truth))
    return [Measurement(c, t.ravel() + np.asarray(simulate_noise(k, noise, t.size)), noise)
            for (c, t), k in zip(truth.items(), keys, strict=True)]


def error(fit: Any, truth: dict, total: float) -> float:
    return float(np.mean([np.abs(total * np.asarray(fit.model.marginal(c)) - t).sum() / total
                          for c, t in truth.items()]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out_argument(parser, "stopping")
    parser.add_argument("--releases", type=int, default=20,
                        help="noisy releases per problem (default %(default)s)")
    parser.add_argument("--problems", default=",".join(PROBLEMS),
                        help="comma-separated subset of " + ",".join(PROBLEMS))
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    jax.config.update("jax_enable_x64", True)
    from numpyro_dpgm.estimation.prox_pgm import prox_pgm

    names = [p for p in args.problems.split(",") if p]
    if not names or set(names) - set(PROBLEMS) or args.releases < 2:
        raise SystemExit(f"--problems must name some of {','.join(PROBLEMS)} and --releases "
                         "must be at least 2")
    start = time.perf_counter()
    record = new_record("stopping", {"releases": args.releases, "seed": args.seed,
                                     "max_iters": MAX_ITERS, "problems": names,
                                     "error": "mean over released cliques of "
                                              "||mu_C - n_C||_1 / N"})
    rows: list[dict[str, Any]] = []
    for name in names:
        net, truth, _, total = problem(name, args.seed)
        per_rule: dict[str, list[tuple[float, float, int]]] = {r: [] for r in RULES}
        load0 = load_average()
        for i in range(args.releases):
            ms = release(truth, name, jax.random.fold_in(jax.random.key(args.seed), i))
            for rule in RULES:
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fit = prox_pgm(ms, net, total_count=total, stop=rule, max_iters=MAX_ITERS)
                per_rule[rule].append((error(fit, truth, total), time.perf_counter() - t0,
                                       fit.iterations))
        best = min(RULES, key=lambda r: np.mean([e for e, _, _ in per_rule[r]]))
        print(f"\n== {name}: {PROBLEMS[name][4]} noise, {args.releases} releases "
              f"(load {load0[0]:.1f}→{load_average()[0]:.1f})")
        for rule in RULES:
            errs = np.array([e for e, _, _ in per_rule[rule]])
            later = [s for _, s, _ in per_rule[rule][1:]]
            row = {"problem": name, "rule": rule, "l1_mean": float(errs.mean()),
                   "l1_se": float(errs.std(ddof=1) / math.sqrt(errs.size)),
                   "seconds_first": per_rule[rule][0][1],
                   "seconds_later": float(np.mean(later)),
                   "iterations_mean": float(np.mean([t for _, _, t in per_rule[rule]])),
                   "best": rule == best, "load_before": load0, "load_after": load_average()}
            rows.append(row)
            print(f"  {rule:12s} L1 {row['l1_mean']:.4f} ± {row['l1_se']:.4f}  "
                  f"{row['seconds_later']:6.2f} s/fit  {row['iterations_mean']:7.0f} it"
                  + ("   <- least" if row["best"] else ""), flush=True)
        record.update(rows=rows, wall_s=time.perf_counter() - start,
                      load_average_end=load_average())
        write_results(args.out, "stopping", record, rows)
    print(f"\nwrote {args.out / 'stopping.json'} ({time.perf_counter() - start:.0f} s)")
    return 0
