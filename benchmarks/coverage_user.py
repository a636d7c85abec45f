"""Coverage of 90 % intervals over many simulated releases: a user's model, exact and SVI paths.

A chain network (``--levels`` values per attribute, ``--attrs`` attributes, every edge a
clique), true log-potentials drawn once (junction-tree conditionals from a Dirichlet(1)), then
``--releases`` independent populations of ``--records`` records, each releasing every clique
table with Laplace noise at ``--eps`` (add/remove, sensitivity = number of tables). The model is
written by hand, as a user would, over a plate of releases: the library's public conditional
coding ``φ ∼ N(0, 3²)`` (``--prior dirichlet``, on the collapsed and Laplace paths: a
``ConditionalDirichlet`` whose concentration ``concentration_from_release`` reads from each
release), ``θ = coding.to_theta(φ)``, an exact ``CollectiveGraphicalModel(net, θ, N)`` and
``LaplaceNoise``. Paths:

- ``exact``: ``run_nuts(model, key, y)`` (record moves within Gibbs; the releases share no
  answer, so their tables move in parallel);
- ``svi``, ``svi-mvn``: ``run_svi`` with the mean-field or full-covariance Gaussian guide on the
  relaxed density (the ``relax`` handler); the full-covariance guide spans every release's
  parameters, so it is slow with many releases (not run by default);
- ``collapsed``, ``laplace``: release by release, the same model for one release (no plate):
  ``run_nuts`` with its defaults (the collapsed path at real sizes: 4 chains, 500 draws each,
  the pilot map; ``--metric`` picks another metric), and ``run_laplace`` (1,000 draws of the
  Laplace approximation of the collapsed posterior). Each release's figures are appended to
  ``{tag}.partial.jsonl`` in the output folder as they come, and a run with the same settings
  resumes from it.

At real size (``--paths laplace,collapsed --records 100000 --levels 10 --concentration 0.3``:
200 cells, 28 of them expecting fewer than 5 records) a release takes about 25 s on the
collapsed path and 8 s on the Laplace one, on two CPU cores.

Figures per path: wall time, worst split R-hat and smallest bulk ESS (exact), and the share of
``(release, cell)`` pairs whose true cell probability ``μ`` lies in the central 90 % interval of
the posterior draws of ``μ``, over all cells and over cells expecting fewer than 5 records per
table; the same for the conditionals ``p(x_{j+1} | x_j)`` of every clique. Writes
``coverage_user.json``/``.csv`` with the load average around every run. Run
``python -m benchmarks coverage_user [--records 10000] [--releases 100]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, json_default, load_average, new_record, write_results

DESCRIPTION = ("coverage of 90% intervals over simulated releases: a user's model, exact, SVI, "
               "collapsed, Laplace")

#: The paths run release by release (one model per release, no plate).
PER_RELEASE = ("collapsed", "laplace")


def _truth(net: Any, rng: np.random.Generator, concentration: float = 1.0) -> np.ndarray:
    """Log-potentials of a chain: the first clique's joint and the next ones' conditionals,
    each from a symmetric Dirichlet (``concentration`` below 1: many rare cells)."""
    tables = {}
    for j, clique in enumerate(net.cliques):
        shape = net.shapes[j]
        if j == 0:
            alpha = np.full(int(np.prod(shape)), concentration)
            tables[clique] = np.log(rng.dirichlet(alpha)).reshape(shape)
        else:
            alpha = np.full(shape[-1], concentration)
            tables[clique] = np.log(rng.dirichlet(alpha, size=shape[0]))
    return np.asarray(net.flatten(tables))


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from numpyro_dpgm import MarkovNetwork
    from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
    from numpyro_dpgm.infer.bayes import ConditionalDirichlet, conditional_coding
    from numpyro_dpgm.oracles import junction_tree as jt

    attrs = [f"x{i}" for i in range(args.attrs)]
    edges = list(zip(attrs[:-1], attrs[1:], strict=True))
    net = MarkovNetwork({a: args.levels for a in attrs}, edges)
    theta = _truth(net, np.random.default_rng(args.seed), args.concentration)
    mu = np.asarray(net.flatten(jt.marginals(net, jnp.asarray(theta))))
    keys = jax.random.split(jax.random.key(args.seed), args.releases)
    n = np.stack([np.asarray(net.features(jt.sample(net, jnp.asarray(theta), k, args.records)))
                  for k in keys])
    b = len(net.cliques) / args.eps
    y = n + np.random.default_rng(args.seed + 1).laplace(0.0, b, n.shape)
    coding = conditional_coding(net)

    def one(y, alpha=None):  # one release; alpha: the Dirichlet prior's concentration
        prior = (dist.Normal(0.0, 3.0).expand([coding.dim]).to_event(1) if alpha is None
                 else ConditionalDirichlet(coding, alpha))
        phi = numpyro.sample("phi", prior)
        theta = numpyro.deterministic("theta", coding.to_theta(phi))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, args.records,
                                                         normalized=True))
        numpyro.sample("y", LaplaceNoise(n, b), obs=y)

    def model(y):  # every release, over a plate
        with numpyro.plate("release", y.shape[0]):
            one(y)

    def marginals(thetas: np.ndarray) -> np.ndarray:
        fn = jax.jit(jax.vmap(lambda t: net.flatten(jt.marginals(net, t))))
        flat = thetas.reshape(-1, thetas.shape[-1])
        return np.asarray(fn(jnp.asarray(flat))).reshape(thetas.shape)

    sizes = [int(np.prod(shape)) for shape in net.shapes]

    def conditionals(flat: np.ndarray) -> np.ndarray:
        """Per clique ``(x_j, x_{j+1})``, ``p(x_{j+1} | x_j)`` from its cells, concatenated."""
        out = []
        for block, shape in zip(np.split(flat, np.cumsum(sizes)[:-1], axis=-1), net.shapes,
                                strict=True):
            table = block.reshape(block.shape[:-1] + tuple(shape))
            out.append((table / table.sum(-1, keepdims=True)).reshape(block.shape))
        return np.concatenate(out, axis=-1)

    return {"net": net, "mu": mu, "y": y, "model": model, "one": one, "marginals": marginals,
            "conditionals": conditionals, "b": b, "coding": coding}


def _coverage(mu_draws: np.ndarray, mu: np.ndarray, sparse: np.ndarray) -> dict[str, float]:
    lo, hi = np.quantile(mu_draws, [0.05, 0.95], axis=0)
    inside = (lo <= mu) & (mu <= hi)
    return {"coverage": float(inside.mean()),
            "coverage_sparse": float(inside[:, sparse].mean()) if sparse.any() else None,
            "sparse_cells": int(sparse.sum()),
            "mean_width": float((hi - lo).mean())}


def _run(path: str, s: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from numpyro_dpgm.infer.bayes import run_nuts, run_svi

    load0, t0 = load_average(), time.perf_counter()
    out: dict[str, Any] = {"path": path}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if path == "exact":
            mcmc = run_nuts(s["model"], jax.random.key(args.seed), s["y"],
                            num_warmup=args.draws, num_samples=args.draws,
                            num_chains=args.chains)
            theta = np.asarray(mcmc.get_samples()["theta"])
            fig = mcmc.convergence
            out.update(max_r_hat=fig.max_r_hat, min_ess_bulk=fig.min_ess_bulk,
                       worst=fig.worst, path_reason=mcmc.path_reason)
        else:
            fit = run_svi(s["model"], jax.random.key(args.seed), s["y"],
                          guide="mvn" if path == "svi-mvn" else "normal",
                          num_steps=args.svi_steps, num_samples=args.chains * args.draws)
            theta = np.asarray(fit.samples["theta"])
            out.update(path_reason=fit.path_reason)
    out["wall_s"] = time.perf_counter() - t0
    sparse = s["mu"] * args.records < 5.0
    out.update(_coverage(s["marginals"](theta), s["mu"], sparse))
    out.update(warnings=sorted({w.category.__name__ for w in caught}), load_before=load0,
               load_after=load_average())
    return out


def _inside(draws: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Whether each truth lies in the central 90 % interval of its draws (draws on axis 0)."""
    lo, hi = np.quantile(draws, [0.05, 0.95], axis=0)
    return (lo <= truth) & (truth <= hi)


def _one_release(path: str, s: dict[str, Any], args: argparse.Namespace, r: int,
                 ) -> dict[str, Any]:
    """Release ``r`` by ``run_nuts`` (defaults) or ``run_laplace``: which true cell
    probabilities and conditionals its 90 % intervals hold."""
    from numpyro_dpgm.infer.bayes import concentration_from_release, run_laplace, run_nuts

    load0, t0 = load_average(), time.perf_counter()
    key = jax.random.fold_in(jax.random.key(args.seed), r)
    out: dict[str, Any] = {"path": path, "release": r, "setting": _setting(args)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        margs = (s["y"][r],)
        if args.prior == "dirichlet":  # its concentration read from this release
            found = concentration_from_release(s["coding"], s["y"][r], 2.0 * s["b"] ** 2)
            out.update(concentration=found.concentration, concentration_bound=found.bound)
            margs += (found.concentration,)
        if path == "collapsed":
            mcmc = run_nuts(s["one"], key, *margs, metric=args.metric)
            theta = np.asarray(mcmc.get_samples()["theta"])
            fig = mcmc.convergence
            out.update(sampler=mcmc.path, max_r_hat=fig.max_r_hat,
                       min_ess_bulk=fig.min_ess_bulk, worst=fig.worst)
        else:
            fit = run_laplace(s["one"], key, *margs)
            theta = np.asarray(fit.samples["theta"])
            out.update(sampler=fit.path, converged=fit.converged)
    out["wall_s"] = time.perf_counter() - t0
    # every release compiles its own programs (its answers are constants in them): without
    # this a run of 100 releases ran out of memory (24 GiB) after 115 fits
    jax.clear_caches()
    mu_draws = s["marginals"](theta)
    out.update(inside=_inside(mu_draws, s["mu"]).tolist(),
               inside_conditional=_inside(s["conditionals"](mu_draws),
                                          s["conditionals"](s["mu"])).tolist(),
               warnings=sorted({w.category.__name__ for w in caught}), load_before=load0,
               load_after=load_average())
    return out


def _setting(args: argparse.Namespace) -> str:
    """What a release's row depends on: a resumed run reuses only rows of the same."""
    prior = "" if args.prior == "normal" else f" prior={args.prior}"
    metric = "" if args.metric is None else f" metric={args.metric}"
    return (f"{args.attrs}x{args.levels} N={args.records} eps={args.eps} "
            f"alpha={args.concentration} seed={args.seed}{prior}{metric}")


#: Bins of a cell's expected records ``N μ`` for the coverage by bin.
EXPECTED_BINS = (0.0, 1.0, 5.0, 50.0, float("inf"))


def _by_expected(inside: np.ndarray, expected: np.ndarray) -> dict[str, dict[str, float]]:
    """Coverage over the (release, cell) pairs of the cells in each bin of expected records."""
    out = {}
    for lo, hi in zip(EXPECTED_BINS[:-1], EXPECTED_BINS[1:], strict=True):
        cells = (expected >= lo) & (expected < hi)
        if cells.any():
            out[f"[{lo:g}, {hi:g})"] = {"cells": int(cells.sum()),
                                        "coverage": float(inside[:, cells].mean())}
    return out


def _load_range(rows: list[dict[str, Any]]) -> list[float] | None:
    loads = [x for row in rows for x in (row["load_before"] or []) + (row["load_after"] or [])]
    return [min(loads), max(loads)] if loads else None


def _per_release(path: str, s: dict[str, Any], args: argparse.Namespace,
                 partial: Path) -> dict[str, Any]:
    """Every release of ``path`` (those in ``partial`` already are read, not run again), then
    the coverage over all ``(release, cell)`` pairs and its spread over releases."""
    done = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            row = json.loads(line)
            if row["path"] == path and row.get("setting") == _setting(args):
                done[row["release"]] = row
    partial.parent.mkdir(parents=True, exist_ok=True)
    for r in range(args.releases):
        if r not in done:
            done[r] = _one_release(path, s, args, r)
            with partial.open("a") as f:
                f.write(json.dumps(done[r], default=json_default) + "\n")
            print(f"{path} release {r}: {np.mean(done[r]['inside']):.3f} covered, "
                  f"{done[r]['wall_s']:.0f} s", file=sys.stderr)
    rows = [done[r] for r in range(args.releases)]
    inside = np.array([row["inside"] for row in rows])
    cond = np.array([row["inside_conditional"] for row in rows])
    sparse = s["mu"] * args.records < 5.0
    per_release = inside.mean(axis=1)
    walls = [row["wall_s"] for row in rows]
    out = {"path": path, "coverage": float(inside.mean()),
           "coverage_se_over_releases": float(per_release.std(ddof=1) / np.sqrt(len(rows))),
           "coverage_sparse": float(inside[:, sparse].mean()) if sparse.any() else None,
           "sparse_cells": int(sparse.sum()),
           "coverage_by_expected_records": _by_expected(inside, s["mu"] * args.records),
           "coverage_conditionals": float(cond.mean()),
           "wall_s": float(sum(walls)), "first_release_s": walls[0],
           "median_release_s": float(np.median(walls)),
           "releases_warned": sum(bool(row["warnings"]) for row in rows),
           "load_range": _load_range(rows)}
    if "concentration" in rows[0]:  # the Dirichlet prior's, release by release
        alphas = [row["concentration"] for row in rows]
        out.update(concentration_median=float(np.median(alphas)),
                   concentration_range=[float(min(alphas)), float(max(alphas))],
                   concentration_at_bound=sum(row["concentration_bound"] is not None
                                              for row in rows))
    if path == "collapsed":
        r_hat = np.array([row["max_r_hat"] for row in rows])
        ess = np.array([row["min_ess_bulk"] for row in rows])
        out.update(max_r_hat_median=float(np.median(r_hat)), max_r_hat_worst=float(r_hat.max()),
                   min_ess_bulk_median=float(np.median(ess)), min_ess_bulk_worst=float(ess.min()))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attrs", type=int, default=3)
    parser.add_argument("--levels", type=int, default=4)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--releases", type=int, default=100)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--concentration", type=float, default=1.0,
                        help="of the Dirichlet the true tables are drawn from (below 1: sparse)")
    parser.add_argument("--prior", choices=("normal", "dirichlet"), default="normal",
                        help="on the conditional log odds: N(0, 3²), or (collapsed and laplace "
                             "paths) ConditionalDirichlet with the concentration each release "
                             "gives (concentration_from_release)")
    parser.add_argument("--paths", default="exact,svi",
                        help="comma-separated: exact, svi, svi-mvn (a full-covariance guide "
                             "over every release's parameters: slow for many releases), "
                             "collapsed, laplace (release by release, resumable)")
    parser.add_argument("--metric", choices=("laplace", "pilot", "adapt"), default=None,
                        help="run_nuts's metric on the collapsed path (default: its default)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=500, help="warm-up and draws per chain")
    parser.add_argument("--svi-steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser, "coverage_user-cpu")
    parser.add_argument("--tag", default="coverage_user-cpu", help="the results' file stem")


def main(args: argparse.Namespace) -> int:
    jax.config.update("jax_enable_x64", True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    record = new_record("coverage_user", settings)
    s = _setup(args)
    base = {"cells": s["net"].num_params, "records": args.records, "releases": args.releases,
            "eps": args.eps, "noise_scale": s["b"]}
    rows = []
    for path in [p for p in args.paths.split(",") if p]:
        if path in PER_RELEASE:
            rows.append({**base, **_per_release(path, s, args,
                                                Path(args.out) / f"{args.tag}.partial.jsonl")})
        else:
            rows.append({**base, **_run(path, s, args)})
        print(json.dumps(rows[-1], default=json_default), file=sys.stderr)
    record.update(rows=rows, load_average_end=load_average())
    for p in write_results(Path(args.out), args.tag, record, rows):
        print(p, file=sys.stderr)
    return 0
