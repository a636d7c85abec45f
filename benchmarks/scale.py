"""Scale: time per oracle call and peak memory against the number of attributes and cliques.

The two marginal oracles of Prox-PGM are timed as ``prox_pgm`` calls them,
``oracle(theta, state) -> (mu, log_z, state)``:

- **exact**: :class:`numpyro_dpgm.oracles.protocol.ExactOracle` (log-space sum-product on
  the min-fill junction tree). Junction trees with a clique above the memory cap
  (``--max-clique-bytes``, default the library's 1 GiB) are refused by the oracle with
  :class:`~numpyro_dpgm.oracles.memory.CliqueTooLargeError`; the refusal and its
  message are recorded.
- **convex_gbp**: :class:`numpyro_dpgm.oracles.protocol.ConvexGBPOracle` (saturated
  region graph, counting numbers 1, one warm-started sweep per call: APPGM's oracle, seed 003
  §4), called from the state of the previous call.

Workloads: ``n`` attributes of ``--values`` values each and ``m`` pairwise cliques: the edges of
a uniformly random spanning tree (a random Prüfer sequence) plus ``m − (n − 1)`` further
distinct edges drawn uniformly (``--seed``); ``m`` is ``n − 1`` (a tree) or ``ratio · n`` for
each ``--ratios`` entry. Log-potentials are i.i.d. N(0, 1) per cell.

Per oracle and workload: compile time (tracing + XLA, ``jit(...).lower(...).compile()``), the
median and quartiles of ``--repeats`` calls of the compiled program (each ended by
``block_until_ready``), and the peak memory of the compiled program from XLA's buffer
assignment (``compiled.memory_analysis()``: arguments + outputs + temporaries, the bytes
the program holds at once). The junction tree's largest clique and total cells and the region
graph's cells are recorded beside them.

Batching (``--mcmc-chains``, :func:`run_chains`): multi-chain NUTS with
``run_nuts(..., chain_method="sequential")`` against ``chain_method="vectorized"`` (the chains
``vmap``-ed into one program), wall time and speed-up.

Run ``python -m benchmarks scale [--out DIR] [--attrs 8,16,32,64] [--ratios 1.5,2,3]``; writes
``scale.json`` and ``scale.csv`` under ``DIR`` (default ``bench-results``) and prints a table.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .harness import (
    add_out_argument,
    load_average,
    new_record,
    summary_ms,
    timed,
    write_results,
)

DESCRIPTION = ("exact vs convex_gbp oracle: time per call and peak memory vs attributes and "
               "cliques; multi-chain NUTS sequential vs vectorized")


def random_edges(n: int, m: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """A uniformly random spanning tree of ``n`` nodes plus random extra edges, ``m`` in all.

    Parameters
    ----------
    n : int
        Number of nodes (at least 2).
    m : int
        Number of edges, ``n − 1 ≤ m ≤ n(n − 1)/2``.
    rng : numpy Generator

    Returns
    -------
    list of (int, int)
        Edges ``(i, j)`` with ``i < j``, the tree's first.
    """
    import networkx as nx

    if not n - 1 <= m <= n * (n - 1) // 2:
        raise ValueError(f"{m} edges cannot connect {n} nodes into a simple graph")
    tree = nx.from_prufer_sequence(rng.integers(0, n, n - 2).tolist()) if n > 2 else \
        nx.path_graph(n)
    edges = {tuple(sorted(e)) for e in tree.edges}
    out = sorted(edges)
    while len(out) < m:
        i, j = sorted(rng.choice(n, 2, replace=False).tolist())
        if (i, j) not in edges:
            edges.add((i, j))
            out.append((i, j))
    return out


def _timed_calls(fn: Any, args: tuple, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        t, out = timed(lambda args=args: fn(*args))
        seconds.append(t)
        if len(out) == 3:  # warm start: the next call starts from this call's state
            args = (args[0], out[2])
    return seconds


def run_oracle(name: str, oracle: Any, theta: Any, repeats: int) -> dict[str, Any]:
    """Compile, time and measure one oracle on one network."""
    from numpyro_dpgm.oracles.memory import CliqueTooLargeError

    state = oracle.init_state()
    try:
        t0 = time.perf_counter()
        compiled = jax.jit(lambda th, st: oracle(th, st)).lower(theta, state).compile()
        compile_s = time.perf_counter() - t0
    except CliqueTooLargeError as err:
        return {"oracle": name, "refused": True, "error": str(err)}
    mem = compiled.memory_analysis()
    peak = None if mem is None else int(mem.argument_size_in_bytes + mem.output_size_in_bytes
                                         + mem.temp_size_in_bytes)
    jax.block_until_ready(compiled(theta, state))
    calls = summary_ms(_timed_calls(compiled, (theta, state), repeats))
    return {"oracle": name, "refused": False, "compile_s": compile_s,
            "call_ms_median": calls["median_ms"], "call_ms_q1": calls["q1_ms"],
            "call_ms_q3": calls["q3_ms"], "peak_bytes": peak}


def run_workload(n: int, m: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both oracles on a random network of ``n`` attributes and ``m`` pairwise cliques."""
    from numpyro_dpgm import Domain, MarkovNetwork
    from numpyro_dpgm.oracles import junction_tree as jt
    from numpyro_dpgm.oracles.protocol import ConvexGBPOracle, ExactOracle

    rng = np.random.default_rng([args.seed, n, m])
    domain = Domain({f"x{i}": args.values for i in range(n)})
    net = MarkovNetwork(domain, [(f"x{i}", f"x{j}") for i, j in random_edges(n, m, rng)])
    theta = jnp.asarray(rng.standard_normal(net.num_params))
    tree = jt.build_junction_tree(net)
    approx = ConvexGBPOracle(net)
    row: dict[str, Any] = {
        "attributes": n, "cliques": m, "values": args.values, "num_params": net.num_params,
        "jt_cliques": len(tree.cliques),
        "jt_max_clique_cells": max(domain.size(c) for c in tree.cliques),
        "jt_total_cells": tree.num_cells, "rg_regions": len(approx.region_graph.regions),
        "rg_cells": approx.region_graph.num_cells, "load_average": load_average(),
    }
    row["exact"] = run_oracle("exact", ExactOracle(net), theta, args.repeats)
    row["convex_gbp"] = run_oracle("convex_gbp", approx, theta, args.repeats)
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks scale`` (the :mod:`benchmarks` contract): the grid
    of attributes and clique ratios, values per attribute, timed repeats, seed, the NUTS
    batching comparison and the exact oracle's memory cap."""
    add_out_argument(parser, "scale")
    parser.add_argument("--attrs", default="8,16,32,64",
                        help="comma-separated numbers of attributes (default %(default)s)")
    parser.add_argument("--ratios", default="1.5,2,3",
                        help="cliques per attribute beside the tree (default %(default)s)")
    parser.add_argument("--values", type=int, default=4,
                        help="values per attribute (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed calls per oracle after compilation (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of graphs and potentials")
    parser.add_argument("--mcmc-chains", type=int, default=4,
                        help="NUTS chains for the batching comparison, 0 to skip (default "
                             "%(default)s)")
    parser.add_argument("--mcmc-steps", type=int, default=300,
                        help="NUTS warm-up and sampling steps per chain (default %(default)s)")
    parser.add_argument("--max-clique-bytes", type=int, default=None,
                        help="the exact oracle's memory cap per clique table (default: the "
                             "library's, 1 GiB)")


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for w in results["workloads"]:
        for name in ("exact", "convex_gbp"):
            r = w[name]
            rows.append({
                "attributes": w["attributes"], "cliques": w["cliques"], "oracle": name,
                "jt_max_clique_cells": w["jt_max_clique_cells"],
                "jt_total_cells": w["jt_total_cells"], "rg_cells": w["rg_cells"],
                "refused": r["refused"], "compile_s": r.get("compile_s"),
                "call_ms_median": r.get("call_ms_median"), "call_ms_q1": r.get("call_ms_q1"),
                "call_ms_q3": r.get("call_ms_q3"), "peak_mib": None if r.get("peak_bytes") is None
                else r["peak_bytes"] / 2**20,
                "load_1min": (w["load_average"] or [None])[0],
            })
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'n':>4} {'m':>4} {'oracle':<11} {'max clique':>11} {'compile s':>10} "
          f"{'call ms':>10} {'peak MiB':>10} {'load':>5}")
    for r in rows:
        if r["refused"]:
            tail = f"{'refused: clique above the memory cap':>32}"
        else:
            tail = (f"{r['compile_s']:>10.2f} {r['call_ms_median']:>10.2f} "
                    f"{(r['peak_mib'] or float('nan')):>10.3f}")
        print(f"{r['attributes']:>4} {r['cliques']:>4} {r['oracle']:<11} "
              f"{r['jt_max_clique_cells']:>11,} {tail} {r['load_1min']:>5}")


def main(args: argparse.Namespace) -> int:
    """Both oracles on every network of the ``--attrs`` × ``--ratios`` grid, then the
    multi-chain NUTS comparison (unless ``--mcmc-chains 0``); writes ``scale.json`` and
    ``scale.csv`` under ``--out`` and returns 0 (bad options end it with a one-line message)."""
    import contextlib

    from numpyro_dpgm.oracles import memory

    jax.config.update("jax_enable_x64", True)
    attrs = [int(s) for s in args.attrs.split(",") if s]
    ratios = [float(s) for s in args.ratios.split(",") if s]
    if any(n < 2 for n in attrs):
        raise SystemExit("--attrs: every network needs at least 2 attributes")
    cap = (contextlib.nullcontext() if args.max_clique_bytes is None
           else memory.clique_memory_cap(args.max_clique_bytes))
    jax.block_until_ready(jnp.zeros(1) + 1)
    results = new_record(
        "scale",
        {"attrs": attrs, "ratios": ratios, "values": args.values, "repeats": args.repeats,
         "seed": args.seed, "x64": True,
         "max_clique_bytes": args.max_clique_bytes or memory.max_clique_bytes(),
         "log_potentials": "iid N(0, 1) per cell",
         "convex_gbp": "saturated region graph, counting numbers 1, 1 sweep/call"},
        workloads=[])
    with cap:
        for n in attrs:
            sizes = sorted({n - 1} | {min(int(round(r * n)), n * (n - 1) // 2) for r in ratios})
            for m in sizes:
                results["workloads"].append(run_workload(n, m, args))
                _print_table(_rows({"workloads": results["workloads"][-1:]}))
    if args.mcmc_chains > 0:
        results["mcmc_batching"] = chains = run_chains(args)
        print(f"\nNUTS, {chains['chains']} chains x {chains['warmup']}+{chains['samples']} steps: "
              f"sequential {chains['sequential_s']:.1f} s, vectorized {chains['vectorized_s']:.1f}"
              f" s, speed-up {chains['speedup']:.2f} (load {chains['load_average']})")
    results["load_average_end"] = load_average()
    rows = _rows(results)
    write_results(args.out, "scale", results, rows)
    if rows:
        print()
        _print_table(rows)
    print(f"\nwrote {args.out / 'scale.json'}" + (f" and {args.out / 'scale.csv'}" if rows else ""))
    return 0


# ------------------------------------------------------------------------------------------------
# Batching: multi-chain NUTS, chains one after another vs vectorised
# ------------------------------------------------------------------------------------------------
def run_chains(args: argparse.Namespace) -> dict[str, Any]:
    """NUTS on the Bayesian model of a Laplace release, ``chain_method`` sequential vs vectorized.

    The model (:func:`numpyro_dpgm.infer.bayes.noisy_marginals_model`, θ inferred) is that of a
    release at ε = 1 (add/remove, simulated) of the two-way tables of a 3-attribute chain
    (3 values each) counted from 1,000 records drawn from a random MRF. Both runs use
    :func:`numpyro_dpgm.infer.bayes.run_nuts` with the same key and ``--mcmc-chains`` chains of
    ``--mcmc-steps`` warm-up and as many sampling steps; wall time includes compilation
    (NumPyro compiles one chain program for either method).
    """
    from numpyro_dpgm import Domain, MarkovNetwork, MarkovRandomField
    from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
    from numpyro_dpgm.privacy import simulate_release

    net = MarkovNetwork(Domain({"a": 3, "b": 3, "c": 3}), [("a", "b"), ("b", "c")])
    k_theta, k_x, k_y, k_run = jax.random.split(jax.random.key(args.seed), 4)
    records = MarkovRandomField(net, jax.random.normal(k_theta, (net.num_params,))).sample(
        k_x, (1000,))
    measurements = simulate_release(np.asarray(records), net, 1.0, k_y)
    model = noisy_marginals_model(net, measurements, 1000)
    out: dict[str, Any] = {"chains": args.mcmc_chains, "warmup": args.mcmc_steps,
                           "samples": args.mcmc_steps, "load_average": load_average()}
    draws = {}
    for method in ("sequential", "vectorized"):
        t0 = time.perf_counter()
        mcmc = run_nuts(model, k_run, num_warmup=args.mcmc_steps, num_samples=args.mcmc_steps,
                        num_chains=args.mcmc_chains, chain_method=method)
        jax.block_until_ready(mcmc.get_samples())
        out[f"{method}_s"] = time.perf_counter() - t0
        draws[method] = np.asarray(mcmc.get_samples()["n"])
    out["speedup"] = out["sequential_s"] / out["vectorized_s"]
    # same model, same key: both methods target the same posterior (means agree within MC error)
    out["posterior_mean_max_abs_diff"] = float(
        np.max(np.abs(draws["sequential"].mean(0) - draws["vectorized"].mean(0))))
    out["load_average_end"] = load_average()
    return out
