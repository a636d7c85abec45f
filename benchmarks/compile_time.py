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

Run ``python -m benchmarks compile_time [--epsilon 1] [--top 12]``; writes
``compile_time-cpu.json``/``.csv`` (``--tag``) under ``--out``, with the load average around
every stage.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .harness import add_out_argument, load_average, new_record, write_results
from .workloads import adult_workload

DESCRIPTION = "where a first fit's time goes: XLA compilation vs iterations, per program"

#: AIM's iterations per refit (mbi's default).
AIM_ITERS = 1000

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
    add_out_argument(parser, "compile_time")


def main(args: argparse.Namespace) -> int:
    import itertools

    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dpgm import prox_pgm
    from numpyro_dpgm.data import count, load_demo
    from numpyro_dpgm.measurements import Laplace, Measurement
    from numpyro_dpgm.mechanisms.refit import Refit
    from numpyro_dpgm.privacy.samplers import simulate_noise

    data = load_demo()
    cliques = list(adult_workload("tree", data).cliques)
    pairs = {frozenset(c) for c in cliques if len(c) == 2}
    extra = next(p for p in itertools.combinations(data.domain.attrs, 2)
                 if frozenset(p) not in pairs)
    tables = count(data.records, cliques + [extra], data.domain)
    noise = Laplace(len(cliques) / args.epsilon)

    def release(seed: int, which: list) -> list:
        keys = jax.random.split(jax.random.key(seed), len(which))
        return [Measurement(c, np.asarray(tables[c], float).ravel()
                            + np.asarray(simulate_noise(k, noise, np.asarray(tables[c]).size)),
                            noise) for c, k in zip(which, keys, strict=True)]

    first, second = release(args.seed, cliques), release(args.seed + 1, cliques)
    grown = first + release(args.seed + 2, [extra])
    total = float(data.total)

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
    record = new_record("compile_time", vars(args), rows=rows,
                        workload=f"Adult tree workload, {len(cliques)} marginals, Laplace "
                                 f"b = {noise.scale:g}; new structure adds {extra}")
    write_results(args.out, args.tag, record, rows)
    return 0
