"""APPGM at scale: compile time, time per iteration and peak memory against the number of cliques.

The workload of seed 003's Figure 2(c): ``--attrs`` attributes of ``--values`` values each and
``m`` distinct random 3-way cliques (uniform over the triples, ``--seed``), each released whole
with Gaussian noise of scale ``--sigma`` on the counts of ``--records`` uniform random records
(multinomial counts per clique; the values only matter for the fit, not for the timing). Each
``m`` of ``--cliques`` is fitted by
``prox_pgm(..., oracle=ConvexGBPOracle(net, iters=--sweeps), method="md", max_iters=--iters,
tol=0)`` in a fresh Python process, so its peak resident memory (``ru_maxrss``) is that fit's.

Recorded per ``m``: the region graph's regions, cells and message cells; the time to build the
measurements; the wall time of the whole fit and of its first call (``prox_pgm`` up to the end of
its first block of ``--every`` iterations, tracing and compilation included); the compilation
time proper (JAX's trace, lowering and XLA compile events, summed) and the number of XLA
compilations; the median seconds per iteration over the later blocks; the loss at the start and
at the end; the peak RSS; the load average before and after.

With ``--libraries numpyro_dpgm,mbi`` each ``m`` is also fitted by mbi 2.0's
``ApproxMirrorDescent`` (its own region graph and Convex-GBP, step ``2/(L·N)``) in a process of
its own, timed the same way (its callback marks every iteration; compilation from the same JAX
events).

Run ``python -m benchmarks appgm_scale [--cliques 250,1000,2500,10000] [--iters 100]``; writes
``appgm_scale.json`` and ``appgm_scale.csv`` under ``--out`` (default ``bench-results``) and
prints a table. ``--timeout`` (seconds) ends a child that runs too long; its row says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .harness import add_out_argument, load_average, new_record, write_results
from .workloads import mbi_problem

DESCRIPTION = "APPGM (Convex-GBP oracle) on m random 3-way cliques: compile, s/iter, peak RSS"

#: Compilation events of JAX whose durations make up ``compile_s``.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def random_triples(n: int, m: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """``m`` distinct 3-subsets of ``range(n)``, drawn uniformly, each sorted.

    Parameters
    ----------
    n : int
        Number of attributes (at least 3).
    m : int
        Number of triples, at most ``C(n, 3)``.
    rng : numpy Generator

    Returns
    -------
    list of (int, int, int)
        In the order drawn.

    Examples
    --------
    >>> t = random_triples(5, 10, np.random.default_rng(0))
    >>> len(set(t)) == 10 and all(a < b < c < 5 for a, b, c in t)
    True
    """
    if n < 3 or not 0 <= m <= n * (n - 1) * (n - 2) // 6:
        raise ValueError(f"{m} distinct triples cannot be drawn from {n} attributes")
    seen: set[tuple[int, int, int]] = set()
    out = []
    while len(out) < m:
        a, b, c = sorted(rng.choice(n, 3, replace=False).tolist())
        if (a, b, c) not in seen:
            seen.add((a, b, c))
            out.append((a, b, c))
    return out


def workload(n: int, values: int, m: int, records: int, sigma: float,
             seed: int) -> tuple[Any, list]:
    """The network of ``m`` random triples and its Gaussian measurements (module notes)."""
    from numpyro_dpgm import Domain, MarkovNetwork
    from numpyro_dpgm.measurements import Gaussian, Measurement

    rng = np.random.default_rng([seed, n, m])
    domain = Domain({f"x{i}": values for i in range(n)})
    cliques = [tuple(f"x{i}" for i in t) for t in random_triples(n, m, rng)]
    net = MarkovNetwork(domain, cliques)
    cells = values ** 3
    counts = rng.multinomial(records, np.full(cells, 1.0 / cells), size=m)
    noisy = counts + sigma * rng.standard_normal(counts.shape)
    return net, [Measurement(c, y, Gaussian(sigma)) for c, y in zip(cliques, noisy, strict=True)]


def child(argv: list[str]) -> dict[str, Any]:
    """One fit in this process (the body of a child run); returns its row."""
    import resource

    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dpgm.estimation.prox_pgm import prox_pgm
    from numpyro_dpgm.oracles.protocol import ConvexGBPOracle

    p = argparse.ArgumentParser()
    for name in ("m", "attrs", "values", "records", "iters", "sweeps", "every", "seed"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--sigma", type=float)
    p.add_argument("--library", default="numpyro_dpgm")
    a = p.parse_args(argv)
    compile_s = {"seconds": 0.0, "xla": 0}

    def on_event(event: str, seconds: float, **_: Any) -> None:
        if event in COMPILE_EVENTS:
            compile_s["seconds"] += seconds
            compile_s["xla"] += event == COMPILE_EVENTS[-1]

    jax.monitoring.register_event_duration_secs_listener(on_event)
    row: dict[str, Any] = {"library": a.library, "cliques": a.m, "attributes": a.attrs,
                           "values": a.values, "sweeps": a.sweeps, "iters": a.iters,
                           "load_before": load_average()}
    t0 = time.perf_counter()
    net, ms = workload(a.attrs, a.values, a.m, a.records, a.sigma, a.seed)
    if a.library == "mbi":
        row["setup_s"] = time.perf_counter() - t0
        row.update(_fit_mbi(ms, net, a))
        row.update(compile_s=compile_s["seconds"], xla_compilations=compile_s["xla"],
                   peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   load_after=load_average())
        return row
    oracle = ConvexGBPOracle(net, iters=a.sweeps)
    rg = oracle.region_graph
    row.update(regions=len(rg.regions), region_cells=rg.num_cells,
               message_cells=rg.num_message_cells, setup_s=time.perf_counter() - t0)
    stamps: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    fit = prox_pgm(ms, net, total_count=float(a.records), max_iters=a.iters, tol=0.0,
                   oracle=oracle, method="md", callback_every=a.every,
                   callback=lambda t, f: stamps.append((t, time.perf_counter(), f)))
    row["fit_s"] = time.perf_counter() - start
    row["first_call_s"] = stamps[1][1] - start if len(stamps) > 1 else row["fit_s"]
    rates = [(t1 - t0_) / (i1 - i0) for (i0, t0_, _), (i1, t1, _) in
             zip(stamps[1:], stamps[2:], strict=False) if i1 > i0]
    row.update(
        compile_s=compile_s["seconds"], xla_compilations=compile_s["xla"],
        s_per_iter=float(np.median(rates)) if rates else None, iterations=fit.iterations,
        loss_start=float(fit.loss_trace[0]), loss_end=float(fit.loss_trace[-1]),
        rejected_steps=fit.extras["rejected_steps"],
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        load_after=load_average(),
    )
    return row


def _fit_mbi(ms: list, net: Any, a: argparse.Namespace) -> dict[str, Any]:
    """mbi 2.0's ``ApproxMirrorDescent`` (its region graph of the cliques, its defaults, step
    ``2/(L·N)`` as :mod:`benchmarks.appgm` gives it) for ``--iters`` iterations, timed per
    iteration by its callback; the first call is up to the end of iteration ``--every``."""
    import jax
    from mbi.approximate_oracles import ApproxMirrorDescent

    mdom, loss_fn, _ = mbi_problem(ms, net.domain)
    total = float(a.records)
    est = ApproxMirrorDescent(stepsize=2.0 / (float(loss_fn.lipschitz) * total))
    stamps: list[float] = []
    start = time.perf_counter()

    def stamp(mu: Any) -> None:
        jax.block_until_ready(mu)
        stamps.append(time.perf_counter())

    mu = est.estimate(mdom, loss_fn, known_total=total, iters=a.iters, callback_fn=stamp)
    fit_s = time.perf_counter() - start
    first = min(a.every, len(stamps)) - 1
    rates = np.diff(stamps[first:])
    return {"fit_s": fit_s, "first_call_s": stamps[first] - start if stamps else fit_s,
            "s_per_iter": float(np.median(rates)) if rates.size else None,
            "iterations": len(stamps), "mbi_own_loss": float(loss_fn(mu))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks appgm_scale``."""
    add_out_argument(parser, "appgm_scale")
    parser.add_argument("--cliques", default="250,1000,2500,10000",
                        help="comma-separated numbers m of 3-way cliques (default %(default)s)")
    parser.add_argument("--attrs", type=int, default=100, help="attributes (default 100)")
    parser.add_argument("--values", type=int, default=10, help="values per attribute (10)")
    parser.add_argument("--records", type=int, default=10_000, help="records N (10,000)")
    parser.add_argument("--sigma", type=float, default=10.0, help="Gaussian noise scale (10)")
    parser.add_argument("--iters", type=int, default=100, help="mirror-descent iterations (100)")
    parser.add_argument("--sweeps", type=int, default=1,
                        help="Convex-GBP sweeps per oracle call (default %(default)s)")
    parser.add_argument("--every", type=int, default=10,
                        help="iterations per timed block (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of cliques and counts")
    parser.add_argument("--libraries", default="numpyro_dpgm",
                        help="comma-separated: numpyro_dpgm, mbi (its ApproxMirrorDescent, the "
                             "same workload in its own process; default %(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds after which a child fit is ended (default %(default)s)")


def _print_row(r: dict[str, Any]) -> None:
    lib = r.get("library", "numpyro_dpgm")[:12]
    if "error" in r:
        print(f"{lib:>12} {r['cliques']:>6} {r['error']}")
        return
    per_iter = "–" if r["s_per_iter"] is None else f"{r['s_per_iter']:.3f}"  # one block only
    print(f"{lib:>12} {r['cliques']:>6} {r.get('regions', '–'):>7} "
          f"{r.get('region_cells', 0):>10,} {r['compile_s']:>9.1f} "
          f"{r['xla_compilations']:>4} {r['first_call_s']:>9.1f} {per_iter:>8} "
          f"{r['fit_s']:>8.1f} {r['peak_rss_mb']:>8.0f} {r['load_before'][0]:>5} "
          f"{r['load_after'][0]:>5}")


def main(args: argparse.Namespace) -> int:
    """Every ``m`` of ``--cliques`` in its own process; writes the JSON and CSV files."""
    sizes = [int(s) for s in args.cliques.split(",") if s]
    results = new_record("appgm_scale", {k: v for k, v in vars(args).items() if k != "out"},
                         rows=[])
    libraries = [s for s in args.libraries.split(",") if s]
    unknown = set(libraries) - {"numpyro_dpgm", "mbi"}
    if unknown:
        raise SystemExit(f"--libraries: unknown {sorted(unknown)}; use numpyro_dpgm, mbi")
    print(f"{'library':>12} {'m':>6} {'regions':>7} {'cells':>10} {'compile':>9} {'xla':>4} "
          f"{'1st call':>9} {'s/iter':>8} {'fit s':>8} {'RSS MB':>8} {'load':>5} {'after':>5}")
    root = str(Path(__file__).resolve().parents[1])
    for m, library in ((m, lib) for m in sizes for lib in libraries):
        cmd = [sys.executable, "-c", "import sys; from benchmarks.appgm_scale import child; "
               "import json; print(json.dumps(child(sys.argv[1:])))",
               "--m", str(m), "--attrs", str(args.attrs), "--values", str(args.values),
               "--records", str(args.records), "--iters", str(args.iters),
               "--sweeps", str(args.sweeps), "--every", str(args.every),
               "--seed", str(args.seed), "--sigma", str(args.sigma), "--library", library]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=root,
                                  timeout=args.timeout)
            if done.returncode:
                row = {"library": library, "cliques": m,
                       "error": done.stderr.strip().splitlines()[-1]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            row = {"library": library, "cliques": m,
                   "error": f"ended after {args.timeout:.0f} s", "load_after": load_average()}
        results["rows"].append(row)
        _print_row(row)
        write_results(args.out, "appgm_scale", results, results["rows"])
    results["load_average_end"] = load_average()
    paths = write_results(args.out, "appgm_scale", results, results["rows"])
    print("wrote " + ", ".join(map(str, paths)))
    return 0
