"""The default fit against each of mbi's estimators: error against wall time on noisy Adult.

The same noisy marginals of Adult (``numpyro_dpgm.load_demo()``, 48,842 records) go to
``numpyro_dpgm.prox_pgm`` with its defaults and to each estimator of mbi 2.0
(``MirrorDescent``, ``LBFGS``, ``InteriorGradient``, ``UniversalAcceleratedMethod``,
``DualAveraging``, each with its defaults), all with the same known total ``N`` and the same
loss: mbi's, ``Σ_C ½‖(μ_C − y_C)/σ_C‖²`` with σ the noise's standard deviation (√2·b for
Laplace noise of scale b), which is also this library's default loss (``loss="l2"``).

Workloads (seed 003 §5 and Appendix C.4):

- ``tree``: the 14 one-way marginals and 17 two-way marginals chosen by mutual information
  (:func:`benchmarks.workloads.tree_workload`), Laplace noise ``b = k/ε`` for the ``k`` tables
  (each of L1 sensitivity 1 under add/remove neighbours), ε ∈ {0.1, 1};
- ``c4``: Appendix C.4's 32 random two-way marginals, Gaussian noise
  ``σ = σ_RDP(ε, 10⁻⁶)·√k``, ε ∈ {0.1, 1, 10, 100}.

Error: the mean over the measured cliques of ``‖μ̂_C − n_C‖₁/N`` (``l1``; the noisy tables
themselves, clipped at 0 and scaled to ``N``, are reported as ``noisy_l1``); the paper's
Appendix C.4 reports half of it, the total-variation distance (``tvd``).

This library runs four times: with its defaults (``stop="auto"``: the path's iterate of least
estimated risk where the path reaches the noise level within a third of ``max_iters``, else
the optimum), with ``stop="optimum"`` (the optimum of the loss), with ``stop="discrepancy"``
(mirror descent from the uniform distribution stopped at the noise level, a regularised fit)
and with ``stop="risk"`` (the same path, and the fit is its iterate of least estimated risk,
Stein's unbiased risk estimate; ``max_iters`` = :data:`RISK_MAX_ITERS`); see
:func:`numpyro_dpgm.prox_pgm`. ``--skip`` leaves contenders out by name.

Timing: each workload's ε run in turn in one process, so the first ε of a workload is each
library's *first call* on that structure (compilation included) and the others are *later
calls*. mbi runs fused blocks of 50 iterations and calls back after each: the curve of an mbi
estimator is its error after every block against the wall time spent in the estimator (the
time of computing the error is left out). This library's curve is its default fit (whatever
iterations its stopping rule takes) and refits of the same measurements with
``max_iters`` ∈ ``--checkpoints``, each a later call timed on its own: what a user who asked
for that many iterations would wait. The load average is recorded before and after each fit.

Verdicts per case: the default's final error and time, mbi's best final error and the time
its estimator took, the time each library needs to come within 5 % of the better of the two
final errors, and the ratio of errors at the default's wall time.

Run ``python -m benchmarks converge [--plan quick|full] [--workloads tree,c4] [--mbi ...]``;
writes ``converge.json`` and ``converge.csv`` under ``--out`` (default ``bench-results``).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, l1_error, load_average, new_record, write_results
from .workloads import Clique, adult_workload

DESCRIPTION = "Default Prox-PGM vs each mbi estimator on noisy Adult: error against wall time"

#: ε of each workload in the full plan; ``quick`` keeps the marked subset.
EPSILONS = {"tree": (0.1, 1.0), "c4": (0.1, 1.0, 10.0, 100.0)}
QUICK = {"tree": (0.1, 1.0), "c4": (10.0,)}
#: mbi's estimators, by the name used in the tables.
MBI_ESTIMATORS = ("MirrorDescent", "LBFGS", "InteriorGradient", "UniversalAcceleratedMethod",
                  "DualAveraging")
#: ``max_iters`` of the ``stop="risk"`` contender (its path runs past the least estimated risk).
RISK_MAX_ITERS = 5000
#: Within this factor of the better final error counts as "reached".
REACHED = 1.05


# ------------------------------------------------------------------------------------------------
# Measurements and errors
# ------------------------------------------------------------------------------------------------
def _cliques(name: str, dataset: Any) -> list[Clique]:
    from studies.mckenna2021 import adult_cliques

    return adult_cliques(dataset.domain) if name == "c4" else list(
        adult_workload("tree", dataset).cliques)


def measure(dataset: Any, cliques: Sequence[Clique], name: str, epsilon: float,
            seed: int) -> tuple[list, dict[Clique, np.ndarray], Any]:
    """The noisy tables of ``cliques`` at ``epsilon`` (Laplace for ``tree``, Gaussian for
    ``c4``), drawn with the library's seeded simulation sampler.

    Returns
    -------
    (measurements, truth, noise)
    """
    from numpyro_dpgm.data import count
    from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
    from numpyro_dpgm.privacy.samplers import simulate_noise
    from studies.mckenna2021 import SIGMA_RDP

    tables = count(dataset.records, list(cliques), dataset.domain)
    truth = {c: np.asarray(tables[c], dtype=float) for c in cliques}
    k = len(cliques)
    noise = (Gaussian(SIGMA_RDP[epsilon] * math.sqrt(k)) if name == "c4"
             else Laplace(k / epsilon))
    keys = jax.random.split(jax.random.key(seed), k)
    ms = [Measurement(c, truth[c].ravel() + np.asarray(simulate_noise(key, noise, truth[c].size)),
                      noise) for c, key in zip(cliques, keys, strict=True)]
    return ms, truth, noise


def noisy_error(ms: Sequence[Any], truth: dict, total: float) -> float:
    """:func:`l1_error` of the noisy tables clipped at 0 and scaled to ``total``."""
    tables = {}
    for m in ms:
        t = np.clip(np.asarray(m.values, dtype=float), 0.0, None)
        tables[m.clique] = t * total / t.sum() if t.sum() > 0 else np.full(t.shape, total / t.size)
    return l1_error(tables, truth, total)


# ------------------------------------------------------------------------------------------------
# Contenders
# ------------------------------------------------------------------------------------------------
def _ours_tables(fit: Any, network: Any, cliques: Sequence[Clique]) -> dict:
    from numpyro_dpgm.tables import project_table

    tables = fit.extras["marginals"]
    out = {}
    for c in cliques:
        parent = next(p for p in network.cliques if set(c) <= set(p))
        out[c] = np.asarray(project_table(tables[parent], parent, c))
    return out


def fit_ours(ms: list, network: Any, truth: dict, total: float,
             checkpoints: Sequence[int], **settings: Any) -> dict[str, Any]:
    """``prox_pgm`` with its defaults (or ``settings``), then refits with ``max_iters`` ∈
    ``checkpoints`` below the first fit's iterations; the curve holds one point per fit."""
    from numpyro_dpgm.estimation.prox_pgm import prox_pgm

    def one(**options: Any) -> tuple[float, Any]:
        t0 = time.perf_counter()
        fit = prox_pgm(ms, network, total_count=total, **{**settings, **options})
        jax.block_until_ready(fit.extras["marginals"])
        return time.perf_counter() - t0, fit

    load0 = load_average()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seconds, fit = one()
    tables = _ours_tables(fit, network, list(truth))
    curve = []
    for k in sorted(checkpoints):
        if k < fit.iterations:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s, f = one(max_iters=k)
            curve.append((f.iterations, s, l1_error(_ours_tables(f, network, list(truth)),
                                                    truth, total)))
    final = l1_error(tables, truth, total)
    curve.append((fit.iterations, seconds, final))
    return {"iterations": fit.iterations, "seconds": seconds, "l1": final,
            "converged": bool(fit.converged), "stopped_by": fit.extras["stopped_by"],
            "stop": fit.extras["stop"], "risk_path_iterations": fit.extras["risk_path_iterations"],
            "curve": curve,
            "warnings": sorted({type(w.message).__name__ for w in caught}),
            "load_before": load0, "load_after": load_average()}


def fit_mbi(ms: list, domain: Any, truth: dict, total: float, estimator: str,
            iters: int) -> dict[str, Any]:
    """mbi's ``estimator`` with its defaults for ``iters`` iterations (blocks of 50), its
    error after every block against the time spent in the estimator."""
    from mbi import estimation, marginal_loss

    mdom = estimation.Domain(domain.attrs, domain.shape)
    lms = [marginal_loss.LinearMeasurement(np.asarray(m.values), tuple(m.clique),
                                           stddev=math.sqrt(m.noise.variance)) for m in ms]
    loss_fn = marginal_loss.from_linear_measurements(lms, mdom)
    est = getattr(estimation, estimator)()
    block = estimation.CALLBACK_EVERY
    curve: list[tuple[int, float, float]] = []
    excluded = 0.0
    load0 = load_average()
    t0 = time.perf_counter()

    def record(mu: Any) -> None:
        nonlocal excluded
        jax.block_until_ready(mu)
        now = time.perf_counter()
        tables = {c: np.asarray(mu.project(c).datavector(flatten=False)) for c in truth}
        curve.append(((len(curve) + 1) * block, now - t0 - excluded,
                      l1_error(tables, truth, total)))
        excluded += time.perf_counter() - now

    model = est.estimate(mdom, loss_fn, known_total=total, iters=iters, callback_fn=record)
    jax.block_until_ready(model.marginals)
    seconds = time.perf_counter() - t0 - excluded
    tables = {c: np.asarray(model.marginals.project(c).datavector(flatten=False)) for c in truth}
    final = l1_error(tables, truth, total)
    curve.append((iters, seconds, final))
    return {"iterations": iters, "seconds": seconds, "l1": final, "converged": None,
            "curve": curve, "warnings": [], "load_before": load0, "load_after": load_average()}


# ------------------------------------------------------------------------------------------------
# Verdicts
# ------------------------------------------------------------------------------------------------
def time_to_reach(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The least wall time of a curve point with error ≤ ``target`` (None if none)."""
    times = [t for _, t, e in curve if e <= target]
    return min(times) if times else None


def error_at(curve: Sequence[Sequence[float]], seconds: float) -> float | None:
    """The best error of the curve's points reached within ``seconds`` (None if none)."""
    errs = [e for _, t, e in curve if t <= seconds]
    return min(errs) if errs else None


def verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Our default against mbi's best estimator (by final error) on one case."""
    ours = [r for r in rows if r["library"] == "numpyro_dpgm"]
    peer = [r for r in rows if r["library"] == "mbi"]
    if not ours or not peer:
        return None
    a, b = ours[0], min(peer, key=lambda r: r["l1"])
    target = min(a["l1"], b["l1"]) * REACHED
    t_ours, t_mbi = time_to_reach(a["curve"], target), time_to_reach(b["curve"], target)
    at = error_at(b["curve"], a["seconds"])
    return {"mbi_best": b["contender"], "l1_ours": a["l1"], "l1_mbi_best": b["l1"],
            "seconds_ours": a["seconds"], "seconds_mbi_best": b["seconds"],
            "time_to_within_5pct_ours": t_ours, "time_to_within_5pct_mbi": t_mbi,
            "mbi_l1_at_our_time": at,
            "error_target_met": a["l1"] <= b["l1"] * REACHED,
            "faster_to_target": t_ours is not None and (t_mbi is None or t_ours < t_mbi)}


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks converge``."""
    add_out_argument(parser, "converge")
    parser.add_argument("--plan", choices=("quick", "full"), default="quick",
                        help="quick: tree at ε 0.1, 1 and c4 at ε 10; full: tree at ε 0.1, 1 "
                             "and c4 at ε 0.1, 1, 10, 100 (default %(default)s)")
    parser.add_argument("--workloads", default="tree,c4",
                        help="comma-separated subset of tree,c4 (default %(default)s)")
    parser.add_argument("--mbi", default=",".join(MBI_ESTIMATORS),
                        help="comma-separated mbi estimators, or 'none' (default: all five)")
    parser.add_argument("--mbi-iters", type=int, default=1000,
                        help="iterations of each mbi estimator (default %(default)s, mbi's own)")
    parser.add_argument("--checkpoints", default="25,100,250,500",
                        help="max_iters of this library's timed refits (default %(default)s)")
    parser.add_argument("--epsilons", default=None,
                        help="comma-separated ε to run instead of the plan's (each must be one of "
                             "the workload's in the full plan)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise")
    parser.add_argument("--skip", nargs="*", default=[], metavar="CONTENDER",
                        help="contenders to leave out, e.g. 'prox_pgm stop=discrepancy'")


def _parse(args: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    workloads = [s for s in args.workloads.split(",") if s]
    if not workloads or set(workloads) - set(EPSILONS):
        raise SystemExit(f"--workloads must name some of tree,c4; got {args.workloads!r}")
    peers = [] if args.mbi == "none" else [s for s in args.mbi.split(",") if s]
    if set(peers) - set(MBI_ESTIMATORS):
        raise SystemExit(f"--mbi must name some of {','.join(MBI_ESTIMATORS)} or none; got "
                         f"{args.mbi!r}")
    if args.mbi_iters < 50 or args.mbi_iters % 50:
        raise SystemExit(f"--mbi-iters must be a positive multiple of 50, got {args.mbi_iters}")
    try:
        checkpoints = [int(s) for s in args.checkpoints.split(",") if s]
    except ValueError:
        raise SystemExit(f"--checkpoints must be integers, got {args.checkpoints!r}") from None
    if any(k < 1 for k in checkpoints):
        raise SystemExit(f"--checkpoints must be positive, got {args.checkpoints!r}")
    return workloads, peers, checkpoints


def main(args: argparse.Namespace) -> int:
    """Every contender on every case, writing the results after each fit."""
    workloads, peers, checkpoints = _parse(args)
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    if peers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import mbi  # noqa: F401  (import-time notices about JAX flags, set above)
    from numpyro_dpgm import load_demo
    from numpyro_dpgm.network import MarkovNetwork

    dataset = load_demo()
    total = float(dataset.total)
    plan = EPSILONS if args.plan == "full" else QUICK
    if args.epsilons:
        chosen = [float(e) for e in args.epsilons.split(",") if e]
        known = {e for name in workloads for e in EPSILONS[name]}
        if not chosen or set(chosen) - known:
            raise SystemExit(f"--epsilons must name some of {sorted(known)} for these "
                             f"workloads; got {args.epsilons!r}")
        plan = {name: tuple(e for e in EPSILONS[name] if e in chosen) for name in EPSILONS}
    start = time.perf_counter()
    results = new_record("converge", {
        "plan": args.plan, "seed": args.seed, "mbi_iters": args.mbi_iters,
        "checkpoints": checkpoints, "x64": True, "compilation_cache": False,
        "loss": "sum 0.5*||(mu_C - y_C)/sd||^2 (both libraries)",
        "error": "mean over measured cliques of ||mu_C - n_C||_1 / N"})
    rows: list[dict[str, Any]] = []
    verdicts: dict[str, Any] = {}

    def write() -> None:
        results.update(load_average_end=load_average(), wall_s=time.perf_counter() - start,
                       verdicts=verdicts, rows=rows)
        flat = [{k: v for k, v in r.items() if k != "curve"} for r in rows]
        write_results(args.out, "converge", results, flat)

    for name in workloads:
        cliques = _cliques(name, dataset)
        network = MarkovNetwork(dataset.domain, cliques)
        for i, eps in enumerate(plan[name]):
            ms, truth, noise = measure(dataset, cliques, name, eps, args.seed)
            case = f"{name}/eps={eps:g}"
            base = {"case": case, "workload": name, "epsilon": eps, "noise": repr(noise),
                    "call": "first" if i == 0 else "later",
                    "noisy_l1": noisy_error(ms, truth, total)}
            print(f"\n== {case}: {len(cliques)} cliques, {noise!r}, noisy tables "
                  f"{base['noisy_l1']:.4f}", flush=True)
            jobs: list[tuple[str, str, Callable[..., dict], tuple]] = [
                ("numpyro_dpgm", "prox_pgm defaults", fit_ours,
                 (ms, network, truth, total, checkpoints)),
                ("numpyro_dpgm", "prox_pgm stop=optimum", partial(fit_ours, stop="optimum"),
                 (ms, network, truth, total, checkpoints)),
                ("numpyro_dpgm", "prox_pgm stop=discrepancy", partial(fit_ours,
                                                                     stop="discrepancy"),
                 (ms, network, truth, total, checkpoints)),
                ("numpyro_dpgm", "prox_pgm stop=risk", partial(
                    fit_ours, stop="risk", max_iters=RISK_MAX_ITERS),
                 (ms, network, truth, total, checkpoints))]
            jobs += [("mbi", e, fit_mbi, (ms, dataset.domain, truth, total, e, args.mbi_iters))
                     for e in peers]
            case_rows = []
            for library, contender, job, job_args in jobs:
                if contender in args.skip:
                    continue
                row = {**base, "library": library, "contender": contender, **job(*job_args)}
                row["tvd"] = row["l1"] / 2
                rows.append(row)
                case_rows.append(row)
                print(f"  {library:12s} {contender:28s} {row['iterations']:5d} it  L1 "
                      f"{row['l1']:.4f} (TVD {row['tvd']:.4f})  {row['seconds']:7.1f} s  (load "
                      f"{row['load_before'][0]:.1f}→{row['load_after'][0]:.1f})", flush=True)
                verdicts[case] = verdict(case_rows)
                write()
    print("\nverdicts (our default vs mbi's best final error):")
    for case, v in verdicts.items():
        if v:
            print(f"  {case:16s} ours {v['l1_ours']:.4f} in {v['seconds_ours']:.1f} s; mbi "
                  f"{v['mbi_best']} {v['l1_mbi_best']:.4f} in {v['seconds_mbi_best']:.1f} s; "
                  f"error target met: {v['error_target_met']}, faster to within 5 %: "
                  f"{v['faster_to_target']}")
    print(f"\nwrote {args.out / 'converge.json'} and {args.out / 'converge.csv'} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0
