"""Coverage of noise-aware synthetic-data intervals: Rubin's rules vs one naive synthetic data set.

Populations (three binary attributes ``y, x1, x2``, each an exactly known 8-cell joint):

- ``mrf``: a known Markov random field, the star ``y – x1``, ``y – x2`` with
  ``P(y = 1) ≈ 0.3`` and log odds ratios ``1.0`` (``y, x1``) and ``−0.7`` (``y, x2``);
- ``adult``: the bundled Adult data as the population: ``y`` = income > 50K, ``x1`` = sex
  (code 1), ``x2`` = education-num code ≥ 12 (a college degree); the star model is then
  misspecified by whatever dependence ``x1, x2`` keep given ``y``.

Every repetition draws ``N`` records from the population, releases the 1-way and the 2-way
tables ``(y, x1)``, ``(y, x2)`` with the Gaussian mechanism at ``(ε, δ = 1/N²)`` (add/remove
neighbours, analytic calibration, :func:`numpyro_dpgm.privacy.simulate_release`), fits the
Bayesian model of :func:`numpyro_dpgm.infer.bayes.noisy_marginals_model` on the star network
with NUTS (one chain), synthesises ``m`` data sets of ``N`` records, one per evenly spaced draw
(:func:`numpyro_dpgm.synthesis.synthesize`), analyses each and combines with
:func:`numpyro_dpgm.combining.rubin` (non-negative variant, ``n_syn / n = 1``).

Estimands, with their population values computed exactly from the joint:

- ``p_y1_x1``: the probability ``P(y = 1, x1 = 1)`` (a cell of a released table), estimated by the
  cell share with variance ``p̂ (1 − p̂) / N``;
- ``beta_x1``: the coefficient of ``x1`` in the logistic regression ``y ~ 1 + x1 + x2``
  (statsmodels GLM, Binomial; fitted on the 8 cell counts with frequency weights, which gives the
  record-level fit and standard errors).

Baselines: (i) ``naive``: one synthetic data set of ``N`` records from the NLBP-EM point estimate
(:func:`numpyro_dpgm.estimation.cgm_em.cgm_em`, defaults) with the analysis' own normal interval;
(ii) ``napsu``: twinify's NAPSU-MQ on the same noisy tables where it runs (see the docs page).

Reported per population, ε, estimand and method: the coverage of nominal 90 % intervals over the
repetitions (with its binomial standard error) and the mean interval width.

Run ``python -m benchmarks coverage [--reps R] [--N N] [--m M] [--out DIR]``; writes
``coverage.json`` and ``coverage.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__:  # python -m benchmarks coverage; run as a script, this file is the NAPSU-MQ
    # runner in twinify's environment, which needs none of the harness
    from .harness import add_out_argument, load_1min, load_average, write_results

DESCRIPTION = "coverage of 90% intervals from m posterior synthetic data sets (Rubin) vs naive"

ATTRS = ("y", "x1", "x2")
CLIQUES = [("y",), ("x1",), ("x2",), ("y", "x1"), ("y", "x2")]
NETWORK_CLIQUES = [("y", "x1"), ("y", "x2")]
LEVEL = 0.9
ESTIMANDS = ("p_y1_x1", "beta_x1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reps", type=int, default=100, help="repetitions per setting")
    parser.add_argument("--N", type=int, default=2000, help="records per population sample")
    parser.add_argument("--m", type=int, default=50, help="synthetic data sets per fit")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--populations", nargs="+", default=["mrf", "adult"],
                        choices=["mrf", "adult"])
    parser.add_argument("--warmup", type=int, default=300, help="NUTS warmup steps")
    parser.add_argument("--samples", type=int, default=500, help="NUTS draws")
    parser.add_argument("--batch", type=int, default=25,
                        help="releases whose NUTS runs are vectorised together")
    parser.add_argument("--seed", type=int, default=2023)
    parser.add_argument("--napsu", type=Path, default=None,
                        help="JSON of NAPSU-MQ intervals on the same releases (written by "
                             "benchmarks/napsu_coverage_runner.py run with twinify)")
    parser.add_argument("--releases-out", type=Path, default=None,
                        help="also write every release (noisy tables, σ) to this JSON")
    parser.add_argument("--releases-only", action="store_true",
                        help="only draw the releases (as the full run does) and write them to "
                             "--releases-out, for the NAPSU-MQ runner")
    add_out_argument(parser, "coverage")


# ------------------------------------------------------------------------------------------------
# populations and estimands
# ------------------------------------------------------------------------------------------------
def population(name: str) -> np.ndarray:
    """The population's joint ``P(y, x1, x2)``, shape (2, 2, 2), axes in :data:`ATTRS` order."""
    if name == "mrf":
        from numpyro_dpgm import MarkovNetwork, MarkovRandomField

        net = MarkovNetwork(dict.fromkeys(ATTRS, 2), NETWORK_CLIQUES)
        theta = np.concatenate([np.array([[0.0, 0.0], [-1.3, -0.3]]).ravel(),   # (y, x1)
                                np.array([[0.0, 0.4], [0.0, -0.3]]).ravel()])  # (y, x2)
        return np.asarray(MarkovRandomField(net, theta).marginal(ATTRS), dtype=np.float64)
    if name == "adult":
        from numpyro_dpgm import load_demo

        recs = load_demo().records
        y = recs["income>50K"].to_numpy()
        x1 = recs["sex"].to_numpy()
        x2 = (recs["education-num"].to_numpy() >= 12).astype(int)
        joint = np.bincount(y * 4 + x1 * 2 + x2, minlength=8).astype(np.float64)
        return (joint / joint.sum()).reshape(2, 2, 2)
    raise ValueError(f"unknown population {name!r}")


def _glm(counts: np.ndarray) -> tuple[float, float]:
    """``β_x1`` and its variance of ``y ~ 1 + x1 + x2`` fitted to cell counts (2, 2, 2)."""
    import statsmodels.api as sm

    y, x1, x2 = (a.ravel() for a in np.indices((2, 2, 2)))
    design = np.column_stack([np.ones(8), x1, x2])
    w = np.asarray(counts, float).ravel()
    keep = w > 0
    fit = sm.GLM(y[keep], design[keep], family=sm.families.Binomial(),
                 freq_weights=w[keep]).fit()
    return float(fit.params[1]), float(fit.bse[1] ** 2)


def truths(joint: np.ndarray) -> dict[str, float]:
    """Population values of the estimands (the GLM on the joint itself)."""
    return {"p_y1_x1": float(joint[1, 1].sum()), "beta_x1": _glm(joint * 1e6)[0]}


def cell_counts(frame: Any) -> np.ndarray:
    codes = [frame[a].to_numpy().astype(int) for a in ATTRS]
    return np.bincount(codes[0] * 4 + codes[1] * 2 + codes[2], minlength=8).reshape(2, 2, 2)


def analysis(frame: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both estimands of one data set: estimates and variances (the analyst's formulas)."""
    counts = cell_counts(frame)
    n = counts.sum()
    p = counts[1, 1].sum() / n
    beta, var_beta = _glm(counts)
    return np.array([p, beta]), np.array([p * (1 - p) / n, var_beta])


# ------------------------------------------------------------------------------------------------
# one setting
# ------------------------------------------------------------------------------------------------
def _release(joint: np.ndarray, n: int, eps: float, key: Any, domain: Any) -> tuple[Any, Any]:
    import pandas as pd

    from numpyro_dpgm.privacy import ApproxDP, simulate_release

    rng = np.random.default_rng(np.asarray(key_data(key)).ravel().tolist())
    counts = rng.multinomial(n, joint.ravel())
    cells = np.repeat(np.arange(8), counts)
    recs = pd.DataFrame({"y": cells // 4, "x1": (cells // 2) % 2, "x2": cells % 2})
    ms = simulate_release(recs, CLIQUES, ApproxDP(eps, 1.0 / n**2), key, domain=domain,
                          mechanism="gaussian")
    return recs, ms


def setting_keys(pop: str, eps: float, args: argparse.Namespace) -> list[Any]:
    """Per repetition: keys of the release, NUTS, the synthetic data and the naive data set."""
    import jax

    base = jax.random.fold_in(jax.random.key(args.seed), int(eps * 1000) + (pop == "adult"))
    return [jax.random.split(jax.random.fold_in(base, rep), 4) for rep in range(args.reps)]


def release_record(pop: str, eps: float, rep: int, n: int, ms: list, truth: dict
                   ) -> dict[str, Any]:
    """A release as plain JSON (for the NAPSU-MQ runner)."""
    return {"population": pop, "epsilon": eps, "rep": rep, "N": n,
            "cliques": [list(m.clique) for m in ms], "values": [m.values.tolist() for m in ms],
            "sigma": float(ms[0].noise.sigma), "truth": truth}


def key_data(key: Any) -> Any:
    import jax

    return jax.random.key_data(key)


def nuts_batch(model: Any, ys: np.ndarray, key: Any, warmup: int, samples: int
               ) -> tuple[Any, Any]:
    """NUTS on ``model`` for a batch of releases ``ys`` (R, answers), vectorised and jit-compiled.

    NumPyro's functional NUTS (``numpyro.infer.hmc.hmc``) with the model's ``y`` as a dynamic
    argument, ``vmap``-ped over releases: one compilation serves every repetition of a setting
    (``MCMC.run`` recompiles its sampling loop on every call). Each chain starts from uniform
    tables and ``φ = 0`` jittered by ``U(−0.5, 0.5)`` in the unconstrained space (as
    :func:`~numpyro_dpgm.infer.bayes.run_nuts` does); dense mass matrix adapted over ``warmup``
    steps. Returns the draws of ``θ`` (R, samples, num_params) and divergences per release.
    """
    import jax
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.hmc import hmc
    from numpyro.infer.util import initialize_model

    from numpyro_dpgm.infer.bayes import init_to_interior

    info = initialize_model(
        jax.random.key(0), model, dynamic_args=True, model_kwargs={"y": ys[0]},
        init_strategy=init_to_interior(values=model.starting_point("uniform"), radius=0.0))
    flat0, unravel = ravel_pytree(info.param_info.z)
    init_kernel, sample_kernel = hmc(potential_fn_gen=info.potential_fn, algo="NUTS")

    def one(k: Any, y: Any) -> tuple[Any, Any]:
        k_init, k_run = jax.random.split(k)
        z = unravel(flat0 + jax.random.uniform(k_init, flat0.shape, minval=-0.5, maxval=0.5))
        kw = {"y": y}
        state = init_kernel(z, warmup, dense_mass=True, model_kwargs=kw, rng_key=k_run)

        def step(s: Any, _: Any) -> tuple[Any, Any]:
            s = sample_kernel(s, model_kwargs=kw)
            return s, (s.z, s.diverging)

        state, _ = jax.lax.scan(step, state, None, length=warmup)
        _, (zs, div) = jax.lax.scan(step, state, None, length=samples)
        theta = jax.vmap(lambda z: info.postprocess_fn(y=y)(z)["theta"])(zs)
        return theta, div.sum()

    keys = jax.random.split(key, len(ys))
    return jax.jit(jax.vmap(one))(keys, jax.numpy.asarray(ys))


def run_setting(pop: str, eps: float, args: argparse.Namespace,
                releases: list | None = None) -> list[dict[str, Any]]:

    from numpyro_dpgm import MarkovNetwork, MarkovRandomField
    from numpyro_dpgm.combining import normal_interval, rubin
    from numpyro_dpgm.estimation.cgm_em import cgm_em
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.synthesis import synthesize

    joint = population(pop)
    truth = truths(joint)
    net = MarkovNetwork(dict.fromkeys(ATTRS, 2), NETWORK_CLIQUES)
    net_em = net.with_cliques(CLIQUES)  # naive_mle needs every measured clique in the network
    n = args.N
    all_keys = setting_keys(pop, eps, args)
    rows = []
    model = None
    for start in range(0, args.reps, args.batch):
        reps = range(start, min(start + args.batch, args.reps))
        keys = all_keys[start:reps[-1] + 1]
        t0 = time.perf_counter()
        released = [_release(joint, n, eps, k[0], net.domain)[1] for k in keys]
        ys = np.stack([np.concatenate([m.values for m in ms]) for ms in released])
        if model is None:  # the model fixes N, the cliques and σ; each release enters as y
            # the reference coding: a prior that does not depend on the first release's values
            model = noisy_marginals_model(net, released[0], n, record_marginals=False,
                                          coding="reference")
        thetas, divs = nuts_batch(model, ys, keys[0][1], args.warmup, args.samples)
        thetas, divs = np.asarray(thetas), np.asarray(divs)
        t_nuts = (time.perf_counter() - t0) / len(keys)
        for j, (rep, k, ms) in enumerate(zip(reps, keys, released, strict=True)):
            t1 = time.perf_counter()
            if releases is not None:
                releases.append(release_record(pop, eps, rep, n, ms, truth))
            frames = synthesize(MarkovRandomField(net, thetas[j]), n, args.m, rng_key=k[2])
            results = [analysis(f) for f in frames]
            combined = rubin(np.array([r[0] for r in results]), np.array([r[1] for r in results]))
            lo, hi = combined.conf_int(LEVEL)
            point = cgm_em(ms, net_em, total_count=n).model
            est, var = analysis(synthesize(point, n, rng_key=k[3]))
            nlo, nhi = normal_interval(est, var, LEVEL)
            elapsed = t_nuts + time.perf_counter() - t1
            for i, name in enumerate(ESTIMANDS):
                t = truth[name]
                common = {"population": pop, "epsilon": eps, "rep": rep, "estimand": name,
                          "truth": t, "divergences": int(divs[j]), "seconds": elapsed}
                rows.append({**common, "method": "rubin",
                             "estimate": float(combined.estimate[i]),
                             "lower": float(lo[i]), "upper": float(hi[i]),
                             "covered": bool(lo[i] <= t <= hi[i]),
                             "df": float(combined.df[i]),
                             "adjusted": bool(combined.adjusted[i])})
                rows.append({**common, "method": "naive", "estimate": float(est[i]),
                             "lower": float(nlo[i]), "upper": float(nhi[i]),
                             "covered": bool(nlo[i] <= t <= nhi[i]), "df": float("inf"),
                             "adjusted": False})
        done = [r for r in rows if r["method"] == "rubin"]
        print(f"{pop} eps={eps} reps<{reps[-1] + 1}: NUTS {t_nuts:.1f}s/rep, "
              f"batch {time.perf_counter() - t0:.0f}s, rubin coverage so far "
              f"{np.mean([r['covered'] for r in done]):.2f}, load {load_1min():.1f}",
              flush=True)
    return rows


def draw_releases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every release of the study (the same draws as :func:`run_setting`), as JSON records."""
    from numpyro_dpgm import Domain

    domain = Domain(dict.fromkeys(ATTRS, 2))
    out = []
    for pop in args.populations:
        joint = population(pop)
        truth = truths(joint)
        for eps in args.epsilons:
            for rep, k in enumerate(setting_keys(pop, eps, args)):
                ms = _release(joint, args.N, eps, k[0], domain)[1]
                out.append(release_record(pop, eps, rep, args.N, ms, truth))
    return out


# ------------------------------------------------------------------------------------------------
# NAPSU-MQ (twinify) on the same releases: run with a Python that has twinify installed
# ------------------------------------------------------------------------------------------------
def napsu_rows(release: dict[str, Any], m: int, seed: int, chains: int, warmup: int,
               samples: int) -> list[dict[str, Any]]:
    """NAPSU-MQ (Räisä et al. 2023, twinify 2.0.0) on one release of :func:`draw_releases`.

    Its canonical queries for the cliques ``(y, x1)``, ``(y, x2)`` are cells of the released
    2-way tables; their noisy values (Gaussian, the release's σ) are NAPSU-MQ's noisy sufficient
    statistics. Inference as ``NapsuMQModel.fit`` does it (Laplace approximation, then NUTS on the
    normalised parameters, prior σ 10), ``m`` posterior draws, one data set of ``N`` records each,
    the same analysis, and twinify's own non-negative Rubin interval.
    """
    import jax
    from twinify.napsu_mq import maximum_entropy_inference as mei
    from twinify.napsu_mq import rubins_rules
    from twinify.napsu_mq.marginal_query import FullMarginalQuerySet
    from twinify.napsu_mq.markov_network import MarkovNetwork as NapsuNetwork

    values_by = {a: [0, 1] for a in ATTRS}
    queries = FullMarginalQuerySet(NETWORK_CLIQUES, values_by).get_canonical_queries()
    tables = {tuple(c): np.asarray(v) for c, v in zip(release["cliques"], release["values"],
                                                       strict=True)}
    stat = []
    for q in queries.flatten().queries:
        feats = tuple(q.features)
        stat.append(tables[feats][int(np.ravel_multi_index(tuple(q.value), (2,) * len(feats)))])
    stat = np.asarray(stat, dtype=np.float32)
    n, sigma = int(release["N"]), float(release["sigma"])
    net = NapsuNetwork(values_by, queries)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), release["rep"])
    k_lap, k_mcmc, k_pick, k_syn = jax.random.split(key, 4)
    t0 = time.perf_counter()
    laplace, _ = mei.run_numpyro_laplace_approximation(k_lap, stat, n, sigma, net)
    mcmc, back = mei.run_numpyro_mcmc_normalised(k_mcmc, stat, n, sigma, net, laplace,
                                                 num_samples=samples, num_warmup=warmup,
                                                 num_chains=chains, disable_progressbar=True)
    lambdas = np.asarray(back(np.asarray(mcmc.get_samples()["norm_lambdas"])))
    pick = np.asarray(jax.random.choice(k_pick, lambdas.shape[0], (m,)))
    q, u = [], []
    for j, key_j in zip(pick, jax.random.split(k_syn, m), strict=True):
        frame = net.sample(key_j, lambdas[j], n)
        est, var = analysis(frame)
        q.append(est)
        u.append(var)
    q, u = np.asarray(q), np.asarray(u)
    elapsed = time.perf_counter() - t0
    rows = []
    for i, name in enumerate(ESTIMANDS):
        lo, hi = rubins_rules.non_negative_conf_int(q[:, i], u[:, i], LEVEL, n, n)
        t = release["truth"][name]
        rows.append({"population": release["population"], "epsilon": release["epsilon"],
                     "rep": release["rep"], "estimand": name, "truth": t, "method": "napsu",
                     "estimate": float(q[:, i].mean()), "lower": float(lo), "upper": float(hi),
                     "covered": bool(lo <= t <= hi), "df": float("nan"), "adjusted": False,
                     "divergences": -1, "seconds": elapsed})
    return rows


def _napsu_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="NAPSU-MQ on the coverage study's releases")
    parser.add_argument("releases", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--m", type=int, default=40)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--max-reps", type=int, default=None,
                        help="only the first K repetitions of every setting")
    parser.add_argument("--seed", type=int, default=2023)
    args = parser.parse_args(argv)
    releases = json.loads(args.releases.read_text())
    if args.max_reps is not None:
        releases = [r for r in releases if r["rep"] < args.max_reps]
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for r in releases:
        rows.extend(napsu_rows(r, args.m, args.seed, args.chains, args.warmup, args.samples))
        args.out.write_text(json.dumps({"meta": {
            "command": "python benchmarks/coverage.py " + " ".join(argv),
            "wall_seconds": time.perf_counter() - start, "loadavg": os.getloadavg(),
            "settings": vars(args) | {"releases": str(args.releases), "out": str(args.out)}},
            "rows": rows}))
        print(f"napsu {r['population']} eps={r['epsilon']} rep={r['rep']}: "
              f"{rows[-1]['seconds']:.1f}s covered={[x['covered'] for x in rows[-2:]]} "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Coverage (± binomial s.e.) and mean width per population, ε, estimand and method."""
    keys = sorted({(r["population"], r["epsilon"], r["estimand"], r["method"]) for r in rows})
    table = []
    for pop, eps, est, method in keys:
        sel = [r for r in rows if (r["population"], r["epsilon"], r["estimand"], r["method"])
               == (pop, eps, est, method)]
        cov = float(np.mean([r["covered"] for r in sel]))
        widths = np.array([r["upper"] - r["lower"] for r in sel])
        table.append({"population": pop, "epsilon": eps, "estimand": est, "method": method,
                      "reps": len(sel), "coverage": cov,
                      "coverage_se": float(np.sqrt(cov * (1 - cov) / len(sel))),
                      "mean_width": float(np.mean(widths)),
                      "median_width": float(np.median(widths)),
                      "bias": float(np.mean([r["estimate"] - r["truth"] for r in sel])),
                      "truth": sel[0]["truth"]})
    return table


def main(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()
    load_start = load_average()
    if args.releases_only:
        if args.releases_out is None:
            raise SystemExit("--releases-only needs --releases-out FILE")
        args.releases_out.write_text(json.dumps(draw_releases(args)))
        return 0
    rows: list[dict[str, Any]] = []
    releases: list[dict[str, Any]] | None = [] if args.releases_out else None
    for pop in args.populations:
        for eps in args.epsilons:
            rows.extend(run_setting(pop, eps, args, releases))
    if args.napsu is not None:
        rows.extend(json.loads(args.napsu.read_text())["rows"])
    table = summarise(rows)
    meta = {"command": "python -m benchmarks coverage " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                if k not in ("out",) and v is not None and not isinstance(v, list)),
            "level": LEVEL, "reps": args.reps, "N": args.N, "m": args.m,
            "epsilons": args.epsilons, "populations": args.populations,
            "nuts": {"warmup": args.warmup, "samples": args.samples, "chains": 1},
            "wall_seconds": time.perf_counter() - start,
            "loadavg_start": load_start, "loadavg_end": load_average(),
            "machine": platform.platform(), "cpus": os.cpu_count(),
            "jax": jax.__version__}
    write_results(args.out, "coverage", {"meta": meta, "table": table, "rows": rows}, table)
    if releases is not None:
        args.releases_out.write_text(json.dumps(releases))
    print(f"{'population':10} {'eps':>5} {'estimand':9} {'method':6} {'coverage':>9} "
          f"{'width':>9} {'bias':>9}")
    for r in table:
        print(f"{r['population']:10} {r['epsilon']:5.1f} {r['estimand']:9} {r['method']:6} "
              f"{r['coverage']:6.2f}±{r['coverage_se']:.2f} {r['mean_width']:9.4f} "
              f"{r['bias']:9.4f}")
    print(f"wall {meta['wall_seconds']:.0f}s, load {load_start} -> {meta['loadavg_end']}")
    return 0


if __name__ == "__main__":  # the NAPSU-MQ runner, for an environment with twinify
    import sys

    sys.exit(_napsu_cli(sys.argv[1:]))
