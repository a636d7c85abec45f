"""The collapsed Gibbs sampler on a Laplace release at real size (226,051 records, 321 cells).

The notes' case (``/work/shared/notes/measured.md`` §5: a held-out table of 226,051 records, a
tree of three 2-way cliques, 319 cells, joint 11,979 cells, Laplace ε = 1) is not in
``/work/shared/data``; its stand-in here: ``--records`` records (default 226,051) drawn from the
junction-tree MLE of Adult's tables on the chain ``workclass – occupation – relationship –
education-num`` (three 2-way cliques, 321 cells, joint 12,960 cells;
:func:`benchmarks.workloads.adult_data`), the three tables released with Laplace noise at
``--eps`` (ε split by the sensitivity rule: b = 3 at ε = 1, the JAX sampler seeded), modelled
by :func:`~numpyro_dpgm.infer.bayes.noisy_marginals_model` with its defaults (conditional
coding, N(0, 3²) prior).

Per run of :func:`~numpyro_dpgm.infer.bayes.nuts.run_nuts` on its collapsed path (``--chains``
chains one after the other, or ``--chain-method parallel``; ``--warmup`` + ``--draws`` each): the
wall time of a run of 2 + 2 steps per chain (compilation: one after the other, every chain compiles
its own program) and of the full run, the run without compilation (their difference), the worst
rank-normalised split R-hat and smallest bulk ESS of ``μ``, ``θ`` (cells of the non-empty released
rows and all) and ``n``, leapfrog steps per draw, maximum-depth hits, divergences, the coverage of
the true counts by ``n``'s central 90 % intervals, and the load average before and after.
``--gradient`` also times one value and gradient of the collapsed log likelihood (the
junction-tree pass against the dense density). ``--laplace`` runs the fast approximate path,
:func:`~numpyro_dpgm.infer.bayes.laplace.run_laplace`, in place of NUTS (its wall time in a
fresh process and the coverage of the true counts by its intervals).

``--model`` says which model of the release ``run_nuts`` samples: ``library`` (the above),
``user`` (the same model written by hand with the public distributions,
:func:`benchmarks.workloads.user_model_of`: ``φ`` on the library's coding and prior,
``CollectiveGraphicalModel(net, θ, N)``, ``LaplaceNoise``; sampled through the ``collapse``
handler, :mod:`numpyro_dpgm.infer.bayes.collapse`) or ``readme`` (the README's model with a
prior: ``θ ∼ N(0, 3²)`` per cell of the network's own layout, no preconditioning). With
``--model user --prior dirichlet`` the user model's prior is a ``ConditionalDirichlet`` whose
concentration ``concentration_from_release`` reads from the release (the row records it, and
what the same rule reads from the true tables).

``--releases K`` runs ``K`` releases of the same structure one after another in the one process
(release ``r``: its records and noise drawn with seed ``--seed + r``), a row each with the
seconds JAX spent compiling (tracing and lowering included) and its compilations: what a
later release costs once the first has compiled.

Run ``python -m benchmarks collapsed [--records 226051] [--eps 1] [--chains 2] [--warmup STEPS]
[--draws 300] [--model library] [--prior normal] [--time-limit SECONDS] [--releases 1]``; with
``--time-limit``, ``run_nuts`` draws further batches until its convergence rule passes or the
time is up; writes ``collapsed-cpu.json`` (``--tag``) under ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import warnings
from typing import Any

import numpy as np

from .harness import (
    add_out_argument,
    interleaved,
    json_default,
    load_average,
    new_record,
    write_results,
)
from .workloads import adult_release, user_model_of

DESCRIPTION = "collapsed Gibbs (counts integrated out of θ's update) on a 321-cell Laplace release"

def gradient_ms(model: Any, repeats: int = 30) -> dict[str, Any]:
    """Milliseconds per value and gradient of the collapsed log likelihood in ``φ``
    (:func:`~benchmarks.harness.interleaved`: median and quartiles): the junction-tree pass of
    the sampler (:mod:`~numpyro_dpgm.infer.bayes.collapsed_tree`, diagonal plus low rank per
    clique), the same pass with a dense factor per clique (``tree_factors``), and the dense
    density they replaced (``P = Q L(θ)`` column by column, then ``N(y; m, PPᵀ + V)`` by one
    Cholesky factor of the answers' covariance, JAX's gradient)."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.stats import multivariate_normal

    from numpyro_dpgm.infer.bayes.collapse import collapse_plan
    from numpyro_dpgm.infer.bayes.collapsed_tree import (
        TreeReleaseNormal,
        tree_answers,
        tree_log_likelihood,
    )
    from numpyro_dpgm.infer.bayes.paths import released_log_odds

    y, v = jnp.asarray(model.y), 2.0 * jnp.asarray(model.noise_scales) ** 2
    site = collapse_plan(model.with_cgm(False), (), {"y": model.y}).sites[0]
    total, passes = site.total, site.functions

    def conditionals(phi: Any) -> Any:
        theta = model.latent_theta(model.coding.to_theta(phi))
        return passes.conditionals(theta, model.normalized)

    def release(phi: Any) -> Any:
        return TreeReleaseNormal(site.tree, conditionals(phi), total, v, functions=passes.tree)

    def tree(phi: Any) -> Any:
        return release(phi).log_prob(y)

    def tree_factors(phi: Any) -> Any:
        law = release(phi)
        return tree_log_likelihood(site.tree, law.conditionals, total, y - law.loc, v,
                                   form="dense")

    def dense(phi: Any) -> Any:
        conds = conditionals(phi)
        loc, jvp = jax.linearize(lambda z: tree_answers(site.tree, conds, total, z),
                                 jnp.zeros(site.dim))
        factor = jax.vmap(jvp, out_axes=1)(jnp.eye(site.dim))
        return multivariate_normal.logpdf(y, loc, factor @ factor.T + jnp.diag(v))

    w = released_log_odds(model)  # where the library's search for the mode starts
    fns = {name: jax.jit(jax.value_and_grad(fn))
           for name, fn in (("tree", tree), ("tree_factors", tree_factors),
                            ("dense", dense))}
    calls = {name: functools.partial(f, w) for name, f in fns.items()}
    out: dict[str, Any] = {f"value_and_grad_{name}": t
                           for name, t in interleaved(calls, repeats).items()}
    for name, call in calls.items():  # CPU time: less at the mercy of other processes
        cpu = time.process_time()
        for _ in range(repeats):
            jax.block_until_ready(call())
        out[f"value_and_grad_{name}_cpu_ms"] = 1e3 * (time.process_time() - cpu) / repeats
    return out


def figures(samples: dict, sites: list[str]) -> dict[str, Any]:
    """Worst R-hat (and where), smallest bulk ESS per site (``checks.convergence_figures``)."""
    from numpyro_dpgm.infer.bayes.checks import convergence_figures

    out = {}
    for site in sites:
        fig = convergence_figures(samples, [site])
        out.update({f"{site}_max_r_hat": fig.max_r_hat, f"{site}_worst": fig.worst,
                    f"{site}_min_ess_bulk": fig.min_ess_bulk})
    return out


def readme_model_of(lib: Any) -> Any:
    """The README's model of the release with a prior: ``θ ∼ N(0, 3²)`` per cell of the
    network's layout, the exact CGM site, Laplace noise on the released tables."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise

    net, total, b = lib.latent_network, int(lib.total_count), jnp.asarray(lib.noise_scales)

    def model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([net.num_params])
                               .to_event(1))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total))
        numpyro.sample("y", LaplaceNoise(lib.predict(n), b), obs=y)

    return model


def sampled(model: Any, kind: str, prior: str = "normal") -> tuple[Any, tuple]:
    """``(model, args)`` that ``run_nuts`` gets for ``--model kind`` (``--prior``: the user
    model's)."""
    if kind == "library":
        return model, ()
    written = user_model_of(model, prior) if kind == "user" else readme_model_of(model)
    return written, (np.asarray(model.y),)


def run(model: Any, truth: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """Compile-only run, full run, and the run's figures."""
    import jax

    from numpyro_dpgm.infer.bayes import run_nuts

    options = dict(num_chains=args.chains, dense_mass=args.dense_mass, check=False,
                   chain_method=args.chain_method, collapsed=True, metric=args.metric)
    limit = {} if args.time_limit is None else {"time_limit": args.time_limit}
    total = float(model.total_count)
    model, margs = sampled(model, args.model, args.prior)
    row: dict[str, Any] = {"load_before": load_average()}
    keys = ("first_call_s", "compile_s")[2 - args.compile_runs:]
    for key in keys:  # a first call also pays the process's first traces
        start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(run_nuts(model, jax.random.key(args.seed), *margs,
                                       num_warmup=2, num_samples=2, **options).get_samples())
        row[key], row[f"{key[:-2]}_cpu_s"] = (time.perf_counter() - start,
                                              time.process_time() - cpu)
        print(f"{key}: {row[key]:.1f} s, load {load_average()}", file=sys.stderr, flush=True)
    row["load_after_compile"] = load_average()
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = run_nuts(model, jax.random.key(args.seed + 1), *margs,
                        num_warmup=args.warmup, num_samples=args.draws, **options, **limit)
        row["batches"] = int(getattr(mcmc, "batches", 0))
        grouped = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(grouped)
    row["wall_s"], row["cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
    if keys:
        row["run_s"] = row["wall_s"] - row[keys[-1]]
        row["run_cpu_s"] = row["cpu_s"] - row[f"{keys[-1][:-2]}_cpu_s"]
    row["load_after"] = load_average()
    extra = mcmc.get_extra_fields(group_by_chain=True)
    steps = np.asarray(extra["num_steps"])
    depth = np.log2(np.maximum(steps, 1)).astype(int) + 1
    row.update(steps_per_draw=float(steps.mean()), max_depth_hits=int(np.sum(depth >= 10)),
               divergences=int(np.sum(np.asarray(extra["diverging"]))),
               step_size=float(np.mean(np.asarray(extra["adapt_state.step_size"]))))
    row.update(figures(grouped, [k for k in ("mu", "theta", "phi", "n") if k in grouped]))
    n = np.asarray(grouped["n"]).reshape(-1, truth.size)
    lo, hi = np.quantile(n, [0.05, 0.95], axis=0)
    row["n_coverage_90"] = float(np.mean((lo <= truth) & (truth <= hi)))
    row["n_mean_abs_error"] = float(np.mean(np.abs(n.mean(0) - truth)))
    if "mu" in grouped:
        mu = np.asarray(grouped["mu"]).reshape(-1, truth.size).mean(0)
        row["mu_mean_abs_error"] = float(np.mean(np.abs(mu - truth / total)))
    row["path_reason"] = mcmc.path_reason
    row["metric"] = mcmc.metric
    row["warmup_steps"] = list(getattr(mcmc, "warmup_steps", ()))
    row["processes"] = int(getattr(mcmc, "processes", 1))
    if hasattr(mcmc, "team_notes"):  # each process's warm-up, draws, pace and phases
        row["team_notes"] = mcmc.team_notes
    pilot = getattr(mcmc, "pilot", None)
    row.update({k: float(v) for k, v in (
        ("pilot_s", getattr(pilot, "seconds", None)), ("map_s", getattr(mcmc, "map_seconds", None)),
        ("warmup_s", getattr(mcmc, "warmup_seconds", None)),
        ("draws_s", getattr(mcmc, "draws_seconds", None)),
        ("batches_s", getattr(mcmc, "batches_seconds", None))) if v is not None})
    row["draws_per_chain"] = int(np.asarray(grouped["n"]).shape[1])
    if pilot is not None:  # the pilot run's own phases and adapted step size
        pilot_extra = pilot.get_extra_fields(group_by_chain=True)
        row.update(pilot_warmup_steps=list(getattr(pilot, "warmup_steps", ())),
                   pilot_warmup_s=getattr(pilot, "warmup_seconds", None),
                   pilot_draws_s=getattr(pilot, "draws_seconds", None),
                   pilot_draws=int(np.asarray(pilot_extra["num_steps"]).shape[1]),
                   pilot_steps_per_draw=float(np.mean(pilot_extra["num_steps"])),
                   pilot_step_size=float(np.mean(pilot_extra["adapt_state.step_size"])))
    if mcmc.laplace is not None:
        row.update(laplace_s=mcmc.laplace.seconds, laplace_iterations=mcmc.laplace.iterations,
                   laplace_converged=mcmc.laplace.converged)
    return row


def release(row: dict[str, Any], model: Any, truth: np.ndarray, args: argparse.Namespace,
            ) -> dict[str, Any]:
    """``row`` updated with :func:`run`'s figures and the seconds and compilations of JAX's
    compiling in it (:func:`numpyro_dpgm.mechanisms.refit.compile_seconds`)."""
    from numpyro_dpgm.mechanisms.refit import compile_seconds

    with compile_seconds() as seen:
        row.update(run(model, truth, args))
    row.update(compiling_s=seen["seconds"], compilations=seen["compiles"])
    return row


def laplace_run(model: Any, truth: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """``run_laplace`` (the fast approximate path) on the same release, in place of NUTS:
    its wall time (a fresh process: compilation included), the mode's search, and the coverage
    of the true counts by the central 90 % intervals of its ``n``."""
    import jax

    from numpyro_dpgm.infer.bayes import run_laplace

    model, margs = sampled(model, args.model, args.prior)
    row: dict[str, Any] = {"load_before": load_average()}
    start, cpu = time.perf_counter(), time.process_time()
    fit = run_laplace(model, jax.random.key(args.seed + 1), *margs,
                      num_samples=args.chains * args.draws)
    n = np.asarray(jax.block_until_ready(fit.samples["n"])).reshape(-1, truth.size)
    row.update(wall_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu,
               load_after=load_average(), path=fit.path, path_reason=fit.path_reason,
               laplace_s=fit.laplace.seconds, laplace_iterations=fit.laplace.iterations,
               laplace_converged=fit.laplace.converged)
    lo, hi = np.quantile(n, [0.05, 0.95], axis=0)
    row["n_coverage_90"] = float(np.mean((lo <= truth) & (truth <= hi)))
    row["n_mean_abs_error"] = float(np.mean(np.abs(n.mean(0) - truth)))
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=226_051,
                        help="records drawn from the fitted tree (0: Adult's own 48,842)")
    parser.add_argument("--edges", choices=("chain", "mid"), default="chain",
                        help="chain: the 321-cell chain above; mid: the 8 edges of Adult's "
                             "tree of benchmarks.workloads.ADULT_EDGES and their one-way "
                             "tables (842 cells)")
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up steps per chain (default run_nuts's: 150 with the "
                             "Laplace metric, 500 where the mass matrix adapts)")
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--dense-mass", action="store_true",
                        help="with --metric adapt: a dense mass matrix adapted in warm-up")
    parser.add_argument("--metric", choices=("laplace", "pilot", "adapt"), default=None,
                        help="run_nuts's metric (default its own: pilot on this path)")
    parser.add_argument("--chain-method", choices=("sequential", "parallel", "processes"),
                        default="sequential",
                        help="parallel: one device per chain (on a CPU, XLA_FLAGS="
                             "--xla_force_host_platform_device_count=CHAINS); processes: a "
                             "pinned process per core")
    parser.add_argument("--gradient", action="store_true",
                        help="also time one value and gradient (tree pass vs dense)")
    parser.add_argument("--no-run", action="store_true", help="skip the sampler run")
    parser.add_argument("--laplace", action="store_true",
                        help="run run_laplace (chains x draws draws of the Laplace "
                             "approximation) in place of NUTS")
    parser.add_argument("--compile-runs", type=int, choices=(0, 1, 2), default=2,
                        help="runs of 2 + 2 steps before the full run (1: the compilation "
                             "time then includes the process's first traces; 0: none, the "
                             "full run's wall time is what a fresh process waits)")
    parser.add_argument("--model", choices=("library", "user", "readme"), default="library",
                        help="the model run_nuts samples (see the module's docstring)")
    parser.add_argument("--prior", choices=("normal", "dirichlet"), default="normal",
                        help="with --model user: the library's N(0, 3²) on φ, or a "
                             "ConditionalDirichlet with the concentration the release gives")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=None,
                        help="run_nuts's time_limit: further batches of --draws per chain until "
                             "R-hat <= 1.01 and bulk ESS >= 400, within this many seconds")
    parser.add_argument("--releases", type=int, default=1,
                        help="releases of the same structure run one after another in this "
                             "process (release r drawn with seed --seed + r)")
    add_out_argument(parser, "collapsed-cpu")
    parser.add_argument("--tag", default="collapsed-cpu")


def main(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    model, data, truth = adult_release(args.records, args.eps, args.seed, args.edges)
    record = new_record("collapsed", vars(args) | {"out": str(args.out)}, rows=[])
    row: dict[str, Any] = {
        "records": int(data.total), "eps": args.eps, "cells": int(model.network.num_params),
        "params": int(model.coding.dim), "laplace_b": float(model.noise_scales[0]),
        "chains": args.chains, "warmup": args.warmup, "draws": args.draws,
        "dense_mass": args.dense_mass, "metric_asked": args.metric,
        "chain_method": args.chain_method, "model": args.model, "prior": args.prior,
        "jax_devices": [str(d) for d in jax.devices()], "release": 0}
    if args.prior == "dirichlet":  # what the user model's prior reads from the release
        from numpyro_dpgm.infer.bayes import concentration_from_release

        found = concentration_from_release(model.coding, np.asarray(model.y),
                                           2.0 * np.asarray(model.noise_scales) ** 2)
        truth_alpha = concentration_from_release(model.coding, truth, 0.0)
        row.update(concentration=found.concentration, concentration_bound=found.bound,
                   concentration_of_true_tables=truth_alpha.concentration)
    record["rows"].append(row)
    if args.gradient:
        row.update(gradient_ms(model), load_gradient=load_average())
        write_results(args.out, args.tag, record, record["rows"])  # kept if the run times out
    if args.laplace:
        row.update(laplace_run(model, truth, args))
    elif not args.no_run:
        base = {k: v for k, v in row.items() if not k.startswith("concentration")}
        release(row, model, truth, args)
    print(json.dumps(row, default=json_default), flush=True)
    for r in range(1, args.releases if not (args.laplace or args.no_run) else 1):
        write_results(args.out, args.tag, record, record["rows"])  # kept if a release fails
        model, _, truth = adult_release(args.records, args.eps, args.seed + r, args.edges)
        record["rows"].append(release(dict(base, release=r), model, truth, args))
        print(json.dumps(record["rows"][-1], default=json_default), flush=True)
    paths = write_results(args.out, args.tag, record, record["rows"])
    print("wrote " + ", ".join(map(str, paths)))
    return 0
