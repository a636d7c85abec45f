"""Where a fit's time goes: XLA compilation against iterations, program by program.

A user who fits a new structure waits for JAX to trace and compile the fit's programs, then for
the iterations. This benchmark fits ``numpyro_dpgm.prox_pgm`` (its defaults) in one fresh
process, in four stages, and for each stage records the wall time, the seconds JAX spent
tracing, lowering and compiling (``jax.monitoring``'s events), the number of compilations, and
every compiled program with its own compile time (JAX's compile log, ``jax_log_compiles``):

1. ``first``: the first fit of Adult's tree workload (14 one-way and 17 two-way marginals,
   Laplace ε = 1, :func:`benchmarks.workloads.adult_workload`) — what ``dpgm fit`` pays;
2. ``again``: the same measurements again (every program cached);
3. ``new_noise``: a new draw of the noise on the same structure (the same programs);
4. ``aim_start`` and ``aim_round``: AIM's refit (:class:`numpyro_dpgm.mechanisms.refit.Refit`,
   1,000 iterations warm-started, as AIM runs it) of the workload, then of the workload and one
   more two-way marginal (the first pair of attributes, in the domain's order, that it lacks):
   what a round of AIM that adds a clique pays.

Then, beside the peer: the *first call* of a fit on the same release, each in a fresh process
(``--first-calls``, default every stopping rule of ``prox_pgm`` and mbi 2.0's
``MirrorDescent`` with its defaults, mbi's own loss ``Σ ½‖(μ_C − y_C)/σ_C‖²``): the wall time of
the first call from the measurements (compilation included; the libraries and the data are
loaded before the clock starts), of a second call in the same process, and the error of the
fit, the mean over the measured tables of ``‖μ̂_C − n_C‖₁/N`` against the true tables. These are
what a user who fits a new release waits for, and what the fit is worth. ``--data heldout``
takes the held-out split of Adult instead (``../shared/data/adult_pub025_01``: 15 attributes,
the tree chosen by mutual information on the public records, released from the private ones).

Run ``python -m benchmarks compile_time [--epsilon 1] [--top 12] [--first-calls ...]``; writes
``compile_time-cpu.json``/``.csv`` (``--tag``) under ``--out``, with the load average around
every stage and first call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .harness import add_out_argument, l1_error, load_average, new_record, write_results
from .workloads import adult_workload, tree_workload

DESCRIPTION = "where a first fit's time goes: XLA compilation vs iterations, per program"

#: AIM's iterations per refit (mbi's default).
AIM_ITERS = 1000
#: The first calls measured by default: ``ours:<stop>`` (``prox_pgm``'s defaults but ``stop``)
#: and ``mbi:<estimator>`` (its defaults).
FIRST_CALLS = ("ours:auto", "ours:risk", "ours:discrepancy", "ours:optimum", "mbi:MirrorDescent")

_FINISHED = re.compile(r"Finished (?:XLA compilation|tracing \+ transforming|"
                       r"jaxpr to MLIR module conversion) of (.+?) in ([0-9.eE+-]+) sec")


@contextlib.contextmanager
def compile_log() -> Iterator[dict[str, Any]]:
    """Per-program compile seconds inside the block (JAX's compile log, captured), and the
    totals of ``jax.monitoring``'s compile events."""
    import jax

    from numpyro_dpgm.mechanisms.refit import compile_seconds

    seen: dict[str, Any] = {"programs": {}}

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            match = _FINISHED.search(record.getMessage())
            if match:
                name, seconds = match.group(1), float(match.group(2))
                seen["programs"][name] = seen["programs"].get(name, 0.0) + seconds

    handler = Capture(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("jax._src.dispatch", "jax._src.interpreters.pxla",
                                                "jax._src.compiler")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)
    try:
        with compile_seconds() as totals:
            yield seen
        seen.update(totals)
    finally:
        jax.config.update("jax_log_compiles", False)
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def stage(name: str, fit: Any, top: int) -> dict[str, Any]:
    """Run ``fit()`` (which returns its iterations) under :func:`compile_log`; the row."""
    row: dict[str, Any] = {"stage": name, "load_before": load_average()}
    with compile_log() as seen:
        start = time.perf_counter()
        iterations = fit()
        wall = time.perf_counter() - start
    programs = sorted(seen["programs"].items(), key=lambda kv: -kv[1])
    row.update(wall_s=wall, compile_s=seen["seconds"], compiles=seen["compiles"],
               run_s=max(wall - seen["seconds"], 0.0), iterations=int(iterations),
               programs=len(programs),
               top_programs=[{"program": p, "seconds": s} for p, s in programs[:top]],
               load_after=load_average())
    print(f"{name:>14}: {wall:6.1f} s, compiling {seen['seconds']:6.1f} s "
          f"({seen['compiles']} compilations, {len(programs)} programs), "
          f"{row['iterations']} iterations", flush=True)
    for p, s in programs[:top]:
        print(f"{'':>16}{s:7.2f} s  {p}", flush=True)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=12, help="programs listed per stage")
    parser.add_argument("--tag", default="compile_time-cpu", help="results' file stem")
    parser.add_argument("--first-calls", default=",".join(FIRST_CALLS),
                        help="comma-separated ours:<stop> and mbi:<estimator> first calls, each "
                             "in a fresh process ('none': skip)")
    parser.add_argument("--data", choices=("adult", "heldout"), default="adult",
                        help="adult: the demo's records and its tree workload; heldout: the "
                             "private part of Adult's public/private split, its tree chosen on "
                             "the public part (15 attributes)")
    parser.add_argument("--first-call-seeds", type=int, default=1,
                        help="releases (seeds --seed, --seed + 1, ...) of each first call")
    parser.add_argument("--first-calls-only", action="store_true",
                        help="skip the in-process stages")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_out_argument(parser, "compile_time")


#: The held-out split of Adult (15 attributes): its tree is chosen on the public records and
#: released from the private ones (read from ``../shared/data/`` beside the repository).
HELDOUT = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult_pub025_01"


def _heldout() -> tuple[Any, Any]:
    """The held-out split's private records and the tree workload chosen on its public ones."""
    import pandas as pd

    from numpyro_dpgm.data import Dataset, records_to_array
    from numpyro_dpgm.domain import Domain

    if not HELDOUT.is_dir():
        raise SystemExit(f"--data heldout reads {HELDOUT}, which is missing")
    domain = Domain(json.loads((HELDOUT / "adult_pub025_01-domain.json").read_text()))
    public, private = (pd.read_csv(HELDOUT / f"{part}.csv")[list(domain.attrs)]
                       for part in ("pub", "priv"))
    workload = tree_workload(records_to_array(public, domain), domain.attrs, domain.shape)
    return Dataset(private, domain), workload


def _problem(epsilon: float, seed: int, data_name: str = "adult") -> dict[str, Any]:
    """The tree workload, its true tables, the releases of the stages and the extra pair."""
    import itertools

    import jax

    from numpyro_dpgm.data import count, load_demo
    from numpyro_dpgm.measurements import Laplace, Measurement
    from numpyro_dpgm.privacy.samplers import simulate_noise

    if data_name == "heldout":
        data, workload = _heldout()
    else:
        data = load_demo()
        workload = adult_workload("tree", data)
    cliques = list(workload.cliques)
    pairs = {frozenset(c) for c in cliques if len(c) == 2}
    extra = next(p for p in itertools.combinations(data.domain.attrs, 2)
                 if frozenset(p) not in pairs)
    tables = count(data.records, cliques + [extra], data.domain)
    noise = Laplace(len(cliques) / epsilon)

    def release(seed: int, which: list) -> list:
        keys = jax.random.split(jax.random.key(seed), len(which))
        return [Measurement(c, np.asarray(tables[c], float).ravel()
                            + np.asarray(simulate_noise(k, noise, np.asarray(tables[c]).size)),
                            noise) for c, k in zip(which, keys, strict=True)]

    first = release(seed, cliques)
    return {"data": data, "cliques": cliques, "extra": extra, "noise": noise, "first": first,
            "second": release(seed + 1, cliques), "grown": first + release(seed + 2, [extra]),
            "truth": {c: np.asarray(tables[c], float) for c in cliques},
            "total": float(data.total)}


def _child(spec: str, epsilon: float, seed: int, data_name: str) -> dict[str, Any]:
    """One first call (``spec``) in this fresh process, then a second call: the JSON row."""
    import warnings

    import jax

    from numpyro_dpgm import prox_pgm


    library, name = spec.split(":", 1)
    problem = _problem(epsilon, seed, data_name)
    ms, domain, total, truth = (problem["first"], problem["data"].domain, problem["total"],
                                problem["truth"])
    if library == "ours":
        def fit() -> tuple[dict, dict]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = prox_pgm(ms, domain, total_count=total, stop=name)
            tables = result.extras["marginals"]
            jax.block_until_ready(result.model.theta)
            return {c: np.asarray(tables.project(c)) for c in truth}, {
                "iterations": result.iterations, "stop": result.extras["stop"],
                "converged": result.converged,
                "warnings": sorted({type(w.message).__name__ for w in caught})}
    elif library == "mbi":
        from mbi import estimation, marginal_loss

        mdom = estimation.Domain(domain.attrs, domain.shape)
        lms = [marginal_loss.LinearMeasurement(np.asarray(m.values), tuple(m.clique),
                                               stddev=math.sqrt(m.noise.variance)) for m in ms]
        loss_fn = marginal_loss.from_linear_measurements(lms, mdom)
        estimator = getattr(estimation, name)()

        def fit() -> tuple[dict, dict]:
            model = estimator.estimate(mdom, loss_fn, known_total=total)
            jax.block_until_ready(model.marginals)
            return {c: np.asarray(model.marginals.project(c).datavector(flatten=False))
                    for c in truth}, {}
    else:
        raise ValueError(f"unknown library in {spec!r}: use ours:<stop> or mbi:<estimator>")
    row: dict[str, Any] = {"stage": "first_call", "library": "numpyro_dpgm" if library == "ours"
                           else "mbi", "fit": name, "load_before": load_average()}
    start = time.perf_counter()
    tables, info = fit()
    row["first_call_s"] = time.perf_counter() - start
    row["l1"] = l1_error(tables, truth, total)
    start = time.perf_counter()
    fit()
    row.update(second_call_s=time.perf_counter() - start, **info, load_after=load_average())
    return row


def first_calls(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each of ``--first-calls`` in a fresh process, one after the other."""
    specs = [] if args.first_calls == "none" else [s for s in args.first_calls.split(",") if s]
    rows = []
    for seed in range(args.seed, args.seed + args.first_call_seeds):
        for spec in specs:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks", "compile_time", "--child", spec,
                 "--epsilon", str(args.epsilon), "--seed", str(seed), "--data", args.data],
                capture_output=True, text=True, check=True)
            row = {**json.loads(out.stdout.strip().splitlines()[-1]), "seed": seed}
            rows.append(row)
            print(f"{'first call':>14}: {row['library']:>12} {row['fit']:<14} seed {seed} "
                  f"{row['first_call_s']:6.1f} s (again {row['second_call_s']:5.1f} s), "
                  f"error {row['l1']:.4f}, load {row['load_before']}", flush=True)
    return rows


def main(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.child is not None:
        print(json.dumps(_child(args.child, args.epsilon, args.seed, args.data)))
        return 0
    if args.first_calls_only:
        rows = first_calls(args)
        write_results(args.out, args.tag, new_record("compile_time", vars(args), rows=rows),
                      rows)
        return 0
    from numpyro_dpgm import prox_pgm
    from numpyro_dpgm.mechanisms.refit import Refit

    problem = _problem(args.epsilon, args.seed, args.data)
    data, cliques, extra, noise = (problem["data"], problem["cliques"], problem["extra"],
                                   problem["noise"])
    first, second, grown, total = (problem["first"], problem["second"], problem["grown"],
                                   problem["total"])

    def fit(measurements: list) -> int:
        return prox_pgm(measurements, data.domain, total_count=total).iterations

    refit = Refit(data.domain, AIM_ITERS, total_count=total)

    def round_of(measurements: list, which: list) -> int:
        refit(measurements, which)
        return refit.costs[-1]["iterations"]

    rows = [stage("first", lambda: fit(first), args.top),
            stage("again", lambda: fit(first), args.top),
            stage("new_noise", lambda: fit(second), args.top),
            stage("aim_start", lambda: round_of(first, cliques), args.top),
            stage("aim_round", lambda: round_of(grown, cliques + [extra]), args.top)]
    rows += first_calls(args)
    record = new_record("compile_time", vars(args), rows=rows,
                        workload=f"{args.data}: tree workload, {len(cliques)} marginals, Laplace "
                                 f"b = {noise.scale:g}; new structure adds {extra}")
    write_results(args.out, args.tag, record, rows)
    return 0
