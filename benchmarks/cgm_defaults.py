"""CGM-EM's start and E-step length against naive MLE, on data its defaults were not set on.

``cgm_em`` starts from a naive MLE with ``init_l2_scale`` times the naive rule's L2 strength and
runs ``max_iters`` EM iterations (default 10) of ``inner_iters`` NLBP steps each: all three
settings regularise (a smoother start, a shorter E-step, fewer iterations) and set its cost.
This benchmark fits every setting given by ``--configs`` (``SCALE:INNER``, or
``SCALE:INNER:ITERS`` to run ``ITERS`` iterations; ``SCALE`` ``d`` for ``cgm_em``'s own
candidate starts; without ``ITERS`` the
iteration count is chosen by ``cgm_em``'s risk rule, ``max_iters="risk"``, each data set with
the estimand its error measures, :data:`TARGET`) and naive MLE with its defaults to the same
releases and reports each fit's error and wall time, so that a default is chosen by
measurement and checked on data it was not chosen on.

Releases (Laplace noise of scale ``b = |C|/ε`` on every released table, add/remove neighbours,
the seeded JAX sampler; ``--seeds`` releases per data set and ε):

- ``adult``: the demo's release, Adult's tree (``ADULT_TREE``) and its 14 one-way tables;
  error: mean L1 of the model's marginals on the released tables against the true tables (the
  records' own, normalised);
- ``titanic`` (read from ``../shared/data/`` when present): Titanic's 9 one-way tables and the
  maximum-mutual-information spanning tree plus 2 pairs
  (:func:`benchmarks.workloads.tree_workload`); same error;
- ``chain3``, ``er``: seed 002's 10-node models with 10 values and ``N`` records for each ``N``
  of ``--sizes`` (default ``10⁴``; :func:`benchmarks.workloads.seed002_release`); error: exact
  KL(truth ‖ fit) against the population's model (seed 002's measure);
- ``chain3-v5``: the third-order chain with 5 values and ``N = 10⁵``; KL.

For every data set each fit also gets the first error, the mean L1 on the released tables
against the records' true tables (``released L1``; the issue's measure, which does not count
the sample's own distance from its population), beside that of the clipped, normalised noisy
tables themselves (``noisy released L1``).

Every fit is timed after its structure compiled (an untimed fit of an extra release first);
the time ratio divides by naive MLE's time on the same release. The 1-minute load average is
recorded beside every row.

Run ``python -m benchmarks cgm_defaults [--data ...] [--epsilons ...] [--seeds K]
[--sizes N ...] [--configs 4:50 1:15 1:15:1 ...] [--tuned 0.25 0.5 1 2 4 ...] [--out DIR]``;
writes ``cgm_defaults.json`` and
``cgm_defaults.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .harness import add_out_argument, load_1min, new_record, write_results
from .workloads import (
    RELEASE_ERRORS,
    add_release_arguments,
    available_release_data,
    release_cases,
    releases,
)

#: ``cgm_em``'s estimand per data set: the one its error measures (KL to the population's
#: model for seed 002's models; the records' own tables for Adult and Titanic).
TARGET = {"adult": "sample", "titanic": "sample", "chain3": "population", "er": "population",
          "chain3-v5": "population"}

DESCRIPTION = "CGM-EM's start scale and E-step length vs naive MLE: error and time ratio"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_release_arguments(parser, sizes=[10_000], seeds=3)
    parser.add_argument("--configs", nargs="+", default=["1:15:10", "d:15"],
                        help="cgm_em settings as INIT_L2_SCALE:INNER_ITERS[:MAX_ITERS]")
    parser.add_argument("--tuned", type=float, nargs="*", default=[],
                        help="also fit naive MLE with each of these multipliers of its rule's "
                             "strength and report the best per release, chosen with the truth "
                             "(the truth-tuned naive MLE, a bound no release-based rule has)")
    add_out_argument(parser, "cgm_defaults")


def _timed(fit: Callable[[], Any]) -> tuple[float, Any]:
    import jax

    t0 = time.perf_counter()
    result = fit()
    jax.block_until_ready(result.model.theta)
    return time.perf_counter() - t0, result


def _config(text: str) -> tuple[float | None, int, int | None]:
    """``SCALE:INNER[:ITERS]`` → ``(init_l2_scale, inner_iters, max_iters)``; ``SCALE`` ``d``
    is ``None`` (``cgm_em``'s own starts); without ``ITERS``, ``None`` (the risk rule)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--configs: {text!r} is not SCALE:INNER or SCALE:INNER:ITERS")
    scale = None if parts[0] == "d" else float(parts[0])
    return scale, int(parts[1]), int(parts[2]) if len(parts) == 3 else None


def _label(config: tuple[float | None, int, int | None]) -> str:
    scale, inner, iters = config
    return (("d" if scale is None else f"{scale:g}") + f":{inner}"
            + ("" if iters is None else f":{iters}"))


def _fits(configs: list[tuple[float | None, int, int | None]], network: Any, meas: list,
          total: float, target: str) -> dict[str, Callable[[], Any]]:
    from numpyro_dpgm.estimation import cgm_em, naive_mle

    fits = {"naive": lambda: naive_mle(meas, network, total_count=total)}
    for scale, inner, iters in configs:
        options = {"init_l2_scale": scale, "inner_iters": inner, "target": target,
                   "max_iters": "risk" if iters is None else iters}
        fits[_label((scale, inner, iters))] = (lambda o=options: cgm_em(
            meas, network, total_count=total, **o))
    return fits


def _paired_z(differences: list[float]) -> float:
    """The mean of paired differences over its standard error (``nan`` for one pair)."""
    if len(differences) < 2:
        return float("nan")
    se = statistics.stdev(differences) / len(differences) ** 0.5
    return statistics.mean(differences) / se if se > 0 else 0.0


def main(args: argparse.Namespace) -> int:
    import warnings

    import numpyro

    from numpyro_dpgm.metrics import marginal_l1_error, noisy_tables_l1

    numpyro.enable_x64()
    configs = [_config(c) for c in args.configs]
    data = available_release_data(args.data)
    record = new_record("cgm_defaults", {"data": data, "epsilons": args.epsilons,
                                         "seeds": args.seeds, "sizes": args.sizes,
                                         "configs": args.configs})
    rows = []
    cases = release_cases(data, args.sizes)
    for name, size in cases:
        label_of = name if size is None else f"{name} N={size}"
        for eps in args.epsilons:
            # compile every fit on an extra release (not reported)
            for net, meas, total, _, _ in releases(name, size, eps,
                                                   range(args.seeds, args.seeds + 1)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for fit in _fits(configs, net, meas, total, TARGET[name]).values():
                        _timed(fit)
            for seed, (net, meas, total, error, tables) in enumerate(
                    releases(name, size, eps, range(args.seeds))):
                row: dict[str, Any] = {"data": label_of, "epsilon": eps, "seed": seed,
                                       "noisy released L1": noisy_tables_l1(meas, tables)}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for label, fit in _fits(configs, net, meas, total, TARGET[name]).items():
                        seconds, result = _timed(fit)
                        row[f"{label} error"] = error(result.model)
                        row[f"{label} released L1"] = float(marginal_l1_error(result.model,
                                                                              tables))
                        row[f"{label} s"] = seconds
                if args.tuned:
                    from numpyro_dpgm.estimation import naive_mle

                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        tuned = {k: error(naive_mle(meas, net, total_count=total,
                                                    l2_scale=k).model) for k in args.tuned}
                    row["tuned naive scale"] = min(tuned, key=tuned.__getitem__)
                    row["tuned naive error"] = tuned[row["tuned naive scale"]]
                row["load_1min"] = load_1min()
                rows.append(row)
                print(f"{label_of:12s} ε={eps:<4g} seed={seed} " + "  ".join(
                    f"{k} {row[k + ' error']:.4f} ({row[k + ' s']:.2f}s)"
                    for k in ["naive"] + [_label(c) for c in configs]), flush=True)
    summary = {}
    labels = ["naive"] + [_label(c) for c in configs]
    for name in dict.fromkeys(r["data"] for r in rows):
        for eps in args.epsilons:
            sel = [r for r in rows if r["data"] == name and r["epsilon"] == eps]
            entry = {f"{k} error (mean)": statistics.mean(r[f"{k} error"] for r in sel)
                     for k in labels}
            if args.tuned:
                entry["tuned naive error (mean)"] = statistics.mean(r["tuned naive error"]
                                                                    for r in sel)
            entry["noisy released L1 (mean)"] = statistics.mean(r["noisy released L1"]
                                                                for r in sel)
            entry.update({f"{k} released L1 (mean)": statistics.mean(r[f"{k} released L1"]
                                                                     for r in sel)
                          for k in labels})
            entry.update({f"{k} - naive error (paired z)": _paired_z(
                [r[f"{k} error"] - r["naive error"] for r in sel]) for k in labels[1:]})
            entry.update({f"{k} / naive time (median)": statistics.median(
                r[f"{k} s"] / r["naive s"] for r in sel) for k in labels[1:]})
            summary[f"{name} eps={eps:g}"] = entry
    record.update(summary=summary, rows=rows, error=RELEASE_ERRORS)
    write_results(args.out, "cgm_defaults", record, rows, indent=2)
    print("\nmean error (time / naive, median):")
    for key, v in summary.items():
        tuned = (f"tuned naive {v['tuned naive error (mean)']:.4f}  " if args.tuned else "")
        print(f"  {key:26s} naive {v['naive error (mean)']:.4f}  {tuned}" + "  ".join(
            f"{k} {v[f'{k} error (mean)']:.4f} (z {v[f'{k} - naive error (paired z)']:+.1f}, "
            f"{v[f'{k} / naive time (median)']:.2f}×)" for k in labels[1:]))
    print("\nmean L1 on the released tables against the records' true tables:")
    for key, v in summary.items():
        print(f"  {key:26s} noisy {v['noisy released L1 (mean)']:.4f}  " + "  ".join(
            f"{k} {v[f'{k} released L1 (mean)']:.4f}" for k in labels))
    return 0 if np.isfinite([r[f"{k} error"] for r in rows for k in labels]).all() else 1
