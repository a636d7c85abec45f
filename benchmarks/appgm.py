"""Prox-PGM and APPGM against mbi (Private-PGM 2.x) on the same noisy Adult measurements.

Both libraries fit the same Gaussian measurements of Adult (``numpyro_dpgm.load_demo()``, 48,842
records, 14 attributes) with the same known total ``N`` and the same loss, the negative
log-likelihood of the noise ``L(μ) = Σ_C ½‖(μ_C − y_C)/σ‖²`` (seed 003, Problem 1), for the
same fixed number of iterations from the uniform start (``θ = 0``), in one process:

- **exact oracle**: numpyro_dpgm's ``prox_pgm(oracle=ExactOracle(method="min_size"))``
  (mirror descent with Armijo backtracking, one oracle call per iteration: the trial point's
  marginals are kept when it is accepted) against mbi's ``MirrorDescent()`` with its default
  settings (Armijo line search, which calls its default exact oracle twice per iteration: once
  at the current and once at the trial point; on CPU that oracle is Hugin message passing).
  Both junction trees come from the min-size greedy order and have the same cells.
- **approximate oracle** (APPGM, seed 003 §4): numpyro_dpgm's Convex-GBP on the saturated region
  graph (``ConvexGBPOracle``, counting numbers 1, damping 0.5) with one and with five
  warm-started sweeps per call and the Armijo line search, against mbi's
  ``approximate_oracles.ApproxMirrorDescent`` (the same region-graph construction, counting
  numbers and damping, one warm-started sweep per step). mbi's approximate estimator has no
  line search and requires a fixed step; its principled default is the step its exact
  estimator starts from, ``α₀ = 2/(L·N)`` (``L`` the Lipschitz constant of ``∇L``); it is run
  with ``α₀``, ``4α₀`` and ``16α₀`` and the best of the three is reported beside the others.

Reported per fit: the loss ``L(μ̂)`` and the workload error (mean total-variation distance
``½‖μ̂_C − n_C‖₁/N`` to the true marginals over the measured cliques), both computed here from
the returned marginals by the same code; the wall time per iteration after compilation (the
median over blocks of iterations, timed by a synchronising callback: blocks of 10 iterations
for numpyro_dpgm, mbi's fused blocks of 50 for its exact estimator, single steps for its
approximate one); the compile/first-call time; the load average around each fit.

Workloads (Gaussian noise with the calibration of seed 003's Appendix C.4 at ε = 1,
δ = 10⁻⁶: ``σ = σ_RDP(ε, δ)·√k`` for ``k`` tables under add/remove neighbours):

- ``c4``: Appendix C.4's 32 random 2-way marginals
  (``studies.mckenna2021.adult_cliques``); the min-size junction tree has 1.37·10⁷ cells.
- ``tree``: ``benchmarks.workloads.tree_workload``'s 14 one-way and 15 two-way marginals (the
  maximum spanning tree of the pairwise mutual information plus the 2 pairs of highest mutual
  information outside it, which close two cycles).

Targets: equal or better error (loss and workload TVD) after the same number of iterations,
and less time per iteration, for both oracle kinds.

Run ``python -m benchmarks appgm [--workloads c4,tree] [--iters-exact K] [--iters-approx K]``;
writes ``appgm.json`` and ``appgm.csv`` under ``--out`` (default ``bench-results``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from numpyro_dpgm.oracles import junction_tree as jt

from .harness import add_out_argument, load_average, new_record, write_results
from .workloads import Clique, adult_workload, mbi_problem

DESCRIPTION = "Prox-PGM/APPGM vs mbi mirror descent on noisy Adult marginals: error and s/iter"

EPSILON = 1.0
MBI_STEP_FACTORS = (1.0, 4.0, 16.0)


# ------------------------------------------------------------------------------------------------
# Measurements and error metrics
# ------------------------------------------------------------------------------------------------
def _workload(name: str, dataset: Any) -> list[Clique]:
    from studies.mckenna2021 import adult_cliques

    if name == "c4":
        return adult_cliques(dataset.domain)
    return list(adult_workload("tree", dataset).cliques)


def measure(dataset: Any, cliques: Sequence[Clique], seed: int) -> tuple[list, dict, float]:
    """Gaussian measurements of ``cliques`` at ε = 1, δ = 1e-6 (seed 003's calibration).

    Returns
    -------
    (measurements, truth, sigma)
        numpyro_dpgm ``Measurement`` list, true count tables by clique, and the noise σ.
    """
    from numpyro_dpgm.data import count
    from numpyro_dpgm.measurements import Gaussian, Measurement
    from numpyro_dpgm.privacy.samplers import simulate_noise
    from studies.mckenna2021 import SIGMA_RDP

    tables = count(dataset.records, list(cliques), dataset.domain)
    truth = {c: np.asarray(tables[c], dtype=float) for c in cliques}
    sigma = SIGMA_RDP[EPSILON] * math.sqrt(len(cliques))
    keys = jax.random.split(jax.random.key(seed), len(cliques))
    ms = [Measurement(c, truth[c].ravel()
                      + np.asarray(simulate_noise(k, Gaussian(sigma), truth[c].size)),
                      Gaussian(sigma)) for c, k in zip(cliques, keys, strict=True)]
    return ms, truth, sigma


def errors(marginals: dict[Clique, np.ndarray], ms: Sequence[Any], truth: dict,
           total: float) -> dict[str, float]:
    """The L2 loss ``Σ ½‖(μ_C − y_C)/σ‖²`` and the mean TVD to the truth of fitted tables."""
    loss = sum(0.5 * float(np.sum(((marginals[m.clique].ravel() - m.values) / m.noise.sigma)
                                  ** 2)) for m in ms)
    tvd = float(np.mean([0.5 * np.abs(marginals[c] - t).sum() / total for c, t in truth.items()]))
    return {"loss": loss, "tvd": tvd}


def _per_iteration(stamps: Sequence[tuple[int, float]]) -> dict[str, float]:
    """Median and minimum seconds per iteration over consecutive (iteration, time) stamps."""
    rates = [(t1 - t0) / (i1 - i0) for (i0, t0), (i1, t1) in zip(stamps, stamps[1:], strict=False)
             if i1 > i0]
    return {"s_per_iter": statistics.median(rates), "s_per_iter_min": min(rates),
            "blocks": len(rates)}


# ------------------------------------------------------------------------------------------------
# numpyro_dpgm
# ------------------------------------------------------------------------------------------------
def _project(network: Any, tables: Any, clique: Clique) -> np.ndarray:
    """The table of ``clique`` summed out of the first network clique that contains it."""
    from numpyro_dpgm.tables import project_table

    parent = next(c for c in network.cliques if set(clique) <= set(c))
    return np.asarray(project_table(tables[parent], parent, clique))


class _WarmedUp(Exception):
    """Ends the untimed warm-up fit once both of its compiled programs have run."""


def fit_ours(ms: list, network: Any, total: float, iters: int, factory: Callable,
             block: int) -> dict[str, Any]:
    """Prox-PGM for ``iters`` iterations, after an untimed warm-up of two blocks (compilation;
    ``compile_s`` is that warm-up's wall time)."""
    from numpyro_dpgm.estimation.prox_pgm import prox_pgm

    def stop_after_two_blocks(t: int, _loss: float) -> None:
        if t >= 2 * block:
            raise _WarmedUp

    t0 = time.perf_counter()
    try:  # same iters (same trace buffers) so that both compiled programs are reused below
        prox_pgm(ms, network, total_count=total, max_iters=iters, oracle=factory, tol=0.0,
                 stop="optimum", callback=stop_after_two_blocks, callback_every=block)
    except _WarmedUp:
        pass
    compile_s = time.perf_counter() - t0
    stamps: list[tuple[int, float]] = []
    load0 = load_average()
    fit = prox_pgm(ms, network, total_count=total, max_iters=iters, oracle=factory, tol=0.0,
                   stop="optimum",
                   callback=lambda t, _loss: stamps.append((t, time.perf_counter())),
                   callback_every=block)
    tables = fit.extras["marginals"]
    marg = {m.clique: _project(network, tables, m.clique) for m in ms}
    return {"iterations": fit.iterations, "compile_s": compile_s, **_per_iteration(stamps),
            "marginals": marg, "rejected_steps": fit.extras["rejected_steps"],
            "initial_step": fit.extras["initial_step_size"],
            "load_before": load0, "load_after": load_average()}


# ------------------------------------------------------------------------------------------------
# mbi
# ------------------------------------------------------------------------------------------------
def _mbi_tables(mu: Any, cliques: Sequence[Clique]) -> dict[Clique, np.ndarray]:
    return {c: np.asarray(mu.project(c).datavector(flatten=False)) for c in cliques}


def fit_mbi_exact(ms: list, domain: Any, total: float, iters: int) -> dict[str, Any]:
    """mbi ``MirrorDescent()`` (its defaults) for ``iters`` iterations (a multiple of 50, at
    least 100). mbi runs fused blocks of 50 iterations; the first block includes compilation,
    so the time per iteration comes from the later blocks and ``compile_s`` is the first
    block's excess over them."""
    from mbi import estimation

    mdom, loss_fn, _ = mbi_problem(ms, domain)
    est = estimation.MirrorDescent()
    block = estimation.CALLBACK_EVERY
    load0 = load_average()
    stamps = [(0, time.perf_counter())]

    def stamp(value: Any) -> None:
        jax.block_until_ready(value)
        stamps.append((stamps[-1][0] + block, time.perf_counter()))

    model = est.estimate(mdom, loss_fn, known_total=total, iters=iters, callback_fn=stamp)
    timing = _per_iteration(stamps[1:])
    first = stamps[1][1] - stamps[0][1]
    return {"iterations": stamps[-1][0], "compile_s": first - block * timing["s_per_iter"],
            **timing, "marginals": _mbi_tables(model.marginals, [m.clique for m in ms]),
            "initial_step": 2.0 / (float(loss_fn.lipschitz) * total),
            "mbi_own_loss": float(loss_fn(model.marginals)),
            "load_before": load0, "load_after": load_average()}


def fit_mbi_approx(ms: list, domain: Any, total: float, iters: int,
                   factor: float) -> dict[str, Any]:
    """mbi ``ApproxMirrorDescent`` with step ``factor·2/(L·N)`` for ``iters`` steps."""
    from mbi.approximate_oracles import ApproxMirrorDescent

    mdom, loss_fn, _ = mbi_problem(ms, domain)
    step = factor * 2.0 / (float(loss_fn.lipschitz) * total)
    est = ApproxMirrorDescent(stepsize=step)
    t0 = time.perf_counter()
    jax.block_until_ready(est.estimate(mdom, loss_fn, known_total=total, iters=2))
    compile_s = time.perf_counter() - t0
    stamps: list[tuple[int, float]] = []
    load0 = load_average()

    def stamp(mu: Any) -> None:
        jax.block_until_ready(mu)
        stamps.append((len(stamps), time.perf_counter()))

    mu = est.estimate(mdom, loss_fn, known_total=total, iters=iters, callback_fn=stamp)
    return {"iterations": iters, "compile_s": compile_s, **_per_iteration(stamps),
            "marginals": _mbi_tables(mu, [m.clique for m in ms]), "initial_step": step,
            "mbi_own_loss": float(loss_fn(mu)),
            "step_factor": factor, "load_before": load0, "load_after": load_average()}


# ------------------------------------------------------------------------------------------------
# One workload
# ------------------------------------------------------------------------------------------------
def run_workload(name: str, dataset: Any, args: argparse.Namespace,
                 sink: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """All contenders on one workload; one row per fit, each also passed to ``sink``."""
    from numpyro_dpgm.network import MarkovNetwork
    from numpyro_dpgm.oracles.protocol import ConvexGBPOracle, ExactOracle

    cliques = _workload(name, dataset)
    ms, truth, sigma = measure(dataset, cliques, args.seed)
    total = float(dataset.total)
    net = MarkovNetwork(dataset.domain, cliques)
    noisy = errors({m.clique: m.values.reshape(truth[m.clique].shape) for m in ms}, ms, truth,
                   total)
    print(f"\n== {name}: {len(cliques)} cliques, σ = {sigma:.2f}, noisy input TVD "
          f"{noisy['tvd']:.4f}, min-size junction tree "
          f"{jt.build_junction_tree(net, 'min_size').num_cells:.3g} cells", flush=True)
    jobs: list[tuple[str, str, str, Callable[[], dict]]] = []
    ke, ka = args.iters_exact, args.iters_approx
    if "approx" in args.oracles:
        for sweeps in (1, 5):
            jobs.append(("approx", "numpyro_dpgm", f"prox_pgm, Convex-GBP {sweeps} sweep(s)/call",
                         lambda s=sweeps: fit_ours(ms, net, total, ka,
                                                   lambda n: ConvexGBPOracle(n, iters=s), 10)))
        for f in MBI_STEP_FACTORS:
            jobs.append(("approx", "mbi", f"ApproxMirrorDescent step {f:g}·2/(L·N)",
                         lambda f=f: fit_mbi_approx(ms, dataset.domain, total, ka, f)))
    if "exact" in args.oracles:
        jobs += [
            ("exact", "numpyro_dpgm", "prox_pgm, junction tree (min-size)",
             lambda: fit_ours(ms, net, total, ke,
                              lambda n: ExactOracle(n, method="min_size"), 10)),
            ("exact", "mbi", "MirrorDescent() defaults",
             lambda: fit_mbi_exact(ms, dataset.domain, total, ke)),
        ]
    rows = []
    for kind, lib, setting, job in jobs:
        out = job()
        err = errors(out.pop("marginals"), ms, truth, total)
        row = {"workload": name, "oracle": kind, "library": lib, "setting": setting,
               "sigma": sigma, "noisy_tvd": noisy["tvd"], **err, **out}
        rows.append(row)
        sink(row)
        print(f"  {kind:6s} {lib:12s} {setting:40s} {row['iterations']:5d} it  loss "
              f"{err['loss']:12.1f}  TVD {err['tvd']:.4f}  {row['s_per_iter'] * 1e3:8.2f} ms/it  "
              f"(compile {row['compile_s']:.1f} s, load {row['load_before'][0]:.1f})", flush=True)
    return rows


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload and oracle kind: our best against mbi's best (by loss)."""
    out = {}
    for wl in sorted({r["workload"] for r in rows}):
        for kind in ("exact", "approx"):
            sel = [r for r in rows if r["workload"] == wl and r["oracle"] == kind]
            ours = [r for r in sel if r["library"] == "numpyro_dpgm"]
            peer = [r for r in sel if r["library"] == "mbi"]
            if not ours or not peer:
                continue
            a, b = min(ours, key=lambda r: r["loss"]), min(peer, key=lambda r: r["loss"])
            out[f"{wl}/{kind}"] = {
                "ours": a["setting"], "mbi": b["setting"],
                "loss_ratio": a["loss"] / b["loss"], "tvd_ours": a["tvd"], "tvd_mbi": b["tvd"],
                "speedup_per_iter": b["s_per_iter"] / a["s_per_iter"],
                "error_target_met": a["loss"] <= b["loss"] * (1 + 1e-6),
                "speed_target_met": a["s_per_iter"] < b["s_per_iter"],
            }
    return out


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks appgm`` (the :mod:`benchmarks` contract): the
    workloads, the oracle kinds, the iterations of each and the seed of the noise."""
    add_out_argument(parser, "appgm")
    parser.add_argument("--workloads", default="tree,c4",
                        help="comma-separated subset of c4,tree (default %(default)s)")
    parser.add_argument("--oracles", default="exact,approx",
                        help="comma-separated subset of exact,approx (default %(default)s)")
    parser.add_argument("--iters-exact", type=int, default=100,
                        help="iterations with the exact oracle, a multiple of 50 and at least 100 "
                             "(mbi runs blocks of 50; default %(default)s)")
    parser.add_argument("--iters-approx", type=int, default=500,
                        help="iterations with the approximate oracle (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Gaussian noise")


def main(args: argparse.Namespace) -> int:
    """Fit every contender on every ``--workloads`` entry, writing ``appgm.json`` and
    ``appgm.csv`` under ``--out`` after each fit, then print the verdicts; returns 0 (bad options
    end it with a one-line message)."""
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    if args.iters_exact < 100 or args.iters_exact % 50:
        raise SystemExit(f"--iters-exact must be a multiple of 50, at least 100, got "
                         f"{args.iters_exact}")
    if args.iters_approx < 20:
        raise SystemExit(f"--iters-approx must be at least 20, got {args.iters_approx}")
    workloads = [s for s in args.workloads.split(",") if s]
    args.oracles = [s for s in args.oracles.split(",") if s]
    if not workloads or set(workloads) - {"c4", "tree"}:
        raise SystemExit(f"--workloads must name some of c4,tree; got {args.workloads!r}")
    if not args.oracles or set(args.oracles) - {"exact", "approx"}:
        raise SystemExit(f"--oracles must name some of exact,approx; got {args.oracles!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mbi  # noqa: F401  (import-time notices about JAX flags, which are set above)
    from numpyro_dpgm import load_demo

    dataset = load_demo()
    start = time.perf_counter()
    results = new_record(
        "appgm",
        {"epsilon": EPSILON, "delta": 1e-6, "seed": args.seed, "iters_exact": args.iters_exact,
         "iters_approx": args.iters_approx, "mbi_step_factors": MBI_STEP_FACTORS, "x64": True,
         "compilation_cache": False, "loss": "sum 0.5*||(mu_C - y_C)/sigma||^2",
         "error": "mean TVD 0.5*||mu_C - n_C||_1/N over the measured cliques"})
    rows: list[dict[str, Any]] = []

    def write(row: dict[str, Any] | None = None) -> None:
        """Write everything measured so far (after every fit, so a stopped run keeps it)."""
        if row is not None:
            rows.append(row)
        results.update(load_average_end=load_average(), wall_s=time.perf_counter() - start,
                       verdicts=_verdicts(rows), rows=rows)
        write_results(args.out, "appgm", results, rows)

    for name in workloads:
        run_workload(name, dataset, args, write)
    write()
    print("\nverdicts (our best vs mbi's best, by loss):")
    for key, v in results["verdicts"].items():
        print(f"  {key:12s} loss ours/mbi {v['loss_ratio']:.4f}  TVD {v['tvd_ours']:.4f} vs "
              f"{v['tvd_mbi']:.4f}  speed-up per iteration {v['speedup_per_iter']:.2f}x  "
              f"(error target met: {v['error_target_met']}, speed: {v['speed_target_met']})")
    print(f"\nwrote {args.out / 'appgm.json'} and {args.out / 'appgm.csv'} "
          f"({results['wall_s']:.0f} s)")
    return 0
