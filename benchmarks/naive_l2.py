"""Naive MLE's L2 strength against the noise-to-count ratio, every fit run to convergence.

Naive MLE (seed 002, §3.1) fits ``θ̂ = argmax θ·μ̃ − A(θ) − ½Σ_C λ_C‖θ_C‖²`` to the simplex-
projected noisy tables ``μ̃``. Its default strength is ``λ_C = max(s_C·b_C/N, floor)`` with
``s_C = min(1, max(0.3, r_C/0.3))`` and the noise-to-count ratio ``r_C = b_C·K_C/N`` (the noise
scale over the mean count of the clique's ``K_C`` cells;
:func:`numpyro_dpgm.estimation.default_l2`). This benchmark fits, on the same releases, every
fixed multiplier ``s`` of ``--scales`` (``λ_C = max(s·b_C/N, floor)`` for every clique) and the
default rule, each to a gradient norm of 10⁻⁸ (up to ``--max-iters`` L-BFGS iterations), and
reports two errors and the iterations:

- ``released L1``: the mean L1 of the model's marginals on the released tables against the
  records' own tables, beside that of the clipped, normalised noisy tables (``noisy``);
- ``error``: for seed 002's models the exact KL from the population's model to the fit (seed
  002's measure), for Adult and Titanic the released L1 again.

Releases: :func:`benchmarks.workloads.releases` (Laplace noise of scale ``b = |C|/ε`` on every
table, add/remove neighbours, the seeded JAX sampler), ``--seeds`` per data set, size and ε.
``r`` in the rows is the mean of ``r_C`` over the released tables. The 1-minute load average is
recorded beside every row (the iterations, not the times, are the measure of cost here).

Run ``python -m benchmarks naive_l2 [--data ...] [--sizes N ...] [--epsilons ...] [--seeds K]
[--scales S ...] [--max-iters M] [--out DIR]``; writes ``naive_l2.json`` and ``naive_l2.csv``.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np

from . import workloads
from .harness import add_out_argument, load_1min, new_record, write_results

DESCRIPTION = "naive MLE's L2 strength (fixed multiples of b/N and the default) vs noisy tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workloads.add_release_arguments(parser, sizes=[1_000, 10_000, 100_000], seeds=2)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.3, 0.1],
                        help="fixed multipliers s of b/N")
    parser.add_argument("--max-iters", type=int, default=20_000)
    add_out_argument(parser, "naive_l2")


def _fits(network: Any, meas: list, total: float, scales: list[float],
          max_iters: int) -> dict[str, Any]:
    """The default fit and one fit per fixed multiplier, on the default fit's targets."""
    from numpyro_dpgm.estimation import fit_mle, naive_mle
    from numpyro_dpgm.estimation.naive import vanishing_floor

    default = naive_mle(meas, network, total_count=total, max_iters=max_iters)
    floor = vanishing_floor(total)
    fits = {"default": default}
    for s in scales:
        lam = {c: max(s * b / total, floor) for c, b in default.extras["noise_scale"].items()}
        fits[f"{s:g}"] = fit_mle(network, default.extras["mu_tilde"], lam, max_iters=max_iters)
    return fits


def main(args: argparse.Namespace) -> int:
    import warnings

    import numpyro

    from numpyro_dpgm.estimation.naive import vanishing_floor
    from numpyro_dpgm.metrics import marginal_l1_error, noisy_tables_l1

    numpyro.enable_x64()
    data = workloads.available_release_data(args.data)
    labels = ["default"] + [f"{s:g}" for s in args.scales]
    record = new_record("naive_l2", {"data": data, "sizes": args.sizes,
                                     "epsilons": args.epsilons, "seeds": args.seeds,
                                     "scales": args.scales, "max_iters": args.max_iters})
    rows = []
    for name, size in workloads.release_cases(data, args.sizes):
        label_of = name if size is None else f"{name} N={size}"
        for eps in args.epsilons:
            for seed, (net, meas, total, error, tables) in enumerate(
                    workloads.releases(name, size, eps, range(args.seeds))):
                ratio = statistics.mean(m.noise.scale * m.num_cells / total for m in meas)
                row: dict[str, Any] = {"data": label_of, "epsilon": eps, "seed": seed,
                                       "r": ratio, "floor": vanishing_floor(total),
                                       "noisy released L1": noisy_tables_l1(meas, tables)}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fits = _fits(net, meas, total, args.scales, args.max_iters)
                for label, fit in fits.items():
                    row[f"{label} released L1"] = float(marginal_l1_error(fit.model, tables))
                    row[f"{label} error"] = error(fit.model)
                    row[f"{label} iterations"] = int(fit.iterations)
                    row[f"{label} converged"] = bool(fit.converged)
                row["load_1min"] = load_1min()
                rows.append(row)
                print(f"{label_of:12s} ε={eps:<4g} seed={seed} r={ratio:.3g} noisy "
                      f"{row['noisy released L1']:.4g}  " + "  ".join(
                          f"{k} {row[k + ' released L1']:.4g}/{row[k + ' error']:.4g}"
                          f"({row[k + ' iterations']})" for k in labels), flush=True)
    summary = {}
    for name in dict.fromkeys(r["data"] for r in rows):
        for eps in args.epsilons:
            sel = [r for r in rows if r["data"] == name and r["epsilon"] == eps]
            entry = {"r (mean)": statistics.mean(r["r"] for r in sel),
                     "noisy released L1 (mean)": statistics.mean(r["noisy released L1"]
                                                                 for r in sel)}
            for k in labels:
                for what in ("released L1", "error", "iterations"):
                    entry[f"{k} {what} (mean)"] = statistics.mean(r[f"{k} {what}"] for r in sel)
                entry[f"{k} converged (all)"] = all(r[f"{k} converged"] for r in sel)
            summary[f"{name} eps={eps:g}"] = entry
    record.update(summary=summary, rows=rows, error=workloads.RELEASE_ERRORS)
    write_results(args.out, "naive_l2", record, rows, indent=2)
    print("\nmean released L1 / error (mean iterations); noisy: the clipped noisy tables")
    for key, v in summary.items():
        print(f"  {key:26s} r={v['r (mean)']:<7.3g} noisy {v['noisy released L1 (mean)']:.4g}  "
              + "  ".join(f"{k} {v[f'{k} released L1 (mean)']:.4g}/{v[f'{k} error (mean)']:.4g}"
                          f"({v[f'{k} iterations (mean)']:.0f})" for k in labels))
    finite = np.isfinite([r[f"{k} error"] for r in rows for k in labels]).all()
    converged = all(r[f"{k} converged"] for r in rows for k in labels)
    if not converged:
        print("some fit did not converge within --max-iters: raise it")
    return 0 if finite and converged else 1
