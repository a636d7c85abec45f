"""Full Bayesian inference on noisy marginals: NUTS effective samples per second, SVI convergence.

Models (``numpyro_dpgm.infer.noisy_marginals_model``: reference-coded parameters ``φ`` with a
Normal prior, the relaxed CGM of the latent tables ``n`` and the noise likelihood of the
released tables ``y``):

- ``demo``: ``studies.convergence.demo_release`` / ``demo_convergence``'s model, the chain
  ``a(2) – b(3) – c(2)``, ``N = 200``, Laplace release at ε = 1, prior scale 2 (7 parameters,
  12 latent cells);
- ``adult``: the model of ``notebooks/bayesian_noisy_marginals.ipynb``, Adult's
  ``race – sex – income>50K`` chain, ``N = 48,842``, Laplace release at ε = 0.1, default prior
  (13 parameters, 14 latent cells).

**NUTS** (``--chains`` chains, run one after another on the CPU, ``--warmup`` and
``--samples`` iterations per chain, started from the NLBP-EM estimate jittered by ±0.5 in the
unconstrained space as in ``run_nuts(init=em_start(model))``): warm-up wall time (compilation
included) and sampling wall time measured separately; split R-hat and bulk ESS (ArviZ,
rank-normalised) of every scalar of ``φ``, ``n`` and ``μ``; bulk ESS per second of sampling (its
minimum and median over those scalars), also per second of warm-up plus sampling; divergent
transitions.
Repeated ``--repeats`` times with different seeds; medians reported.

**SVI** (``run_svi`` with AutoNormal, AutoMultivariateNormal and AutoDelta; Adam, step 0.02,
one particle, ``--svi-steps`` steps from the same starting point): *convergence* is the first
step ``t`` (a multiple of the window ``w``) at which the mean negative ELBO over steps
``(t − w, t]`` differs from the mean over ``(t − 2w, t − w]`` by at most
``tol·max(1, |mean|)`` (``--svi-window``, ``--svi-tol``). The time to converge is the fixed
cost of a first call (compilation and drawing from the guide: a first run of ``w`` steps less
``w`` steps) plus ``t`` times the time per step (the difference between a run of
``--svi-steps`` steps and a second run of ``w`` steps, over their difference in steps).
Reported beside it: the final negative ELBO (mean over the last window) and the
agreement of the guide's posterior means with NUTS's, as the largest
``|mean_SVI − mean_NUTS| / sd_NUTS`` over the scalars of ``φ`` and of ``n`` (AutoDelta's point
is compared the same way).

No peer library computes this posterior (of the model parameters *and* the latent count
tables given noisy marginals), so nothing else runs in the same process for comparison:
NAPSU-MQ samples the parameters of a maximum-entropy model given Gaussian-noised
marginal queries, without latent tables, and does not handle Laplace noise. The comparison
made here is internal: the two variational families and the MAP against NUTS, and NUTS's
posterior mean against the NLBP-EM point estimate (``em_phi_max_z``).

Run ``python -m benchmarks bayes [--models demo,adult] [--repeats K]``; writes ``bayes.json``
and ``bayes.csv`` under ``--out`` (default ``bench-results``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, load_average, new_record, write_results

DESCRIPTION = "NUTS bulk ESS/s, R-hat and SVI time to converge on the noisy-marginals models"

GUIDES = ("normal", "mvn", "delta")


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------
def build_model(name: str, seed: int) -> Any:
    """The ``demo`` or ``adult`` model (see the module notes) for release seed ``seed``."""
    from numpyro_dpgm import Dataset, MarkovNetwork, load_demo
    from numpyro_dpgm.infer import noisy_marginals_model
    from numpyro_dpgm.privacy import simulate_release
    from studies.convergence import demo_release

    if name == "demo":
        rel = demo_release(seed)
        return noisy_marginals_model(rel.network, rel.measurements, rel.total_count,
                                     prior_scale=2.0, coding="reference")
    adult = load_demo()
    attrs = ["race", "sex", "income>50K"]
    data = Dataset(adult.records[attrs], adult.domain.project(attrs))
    net = MarkovNetwork(data.domain, [("race", "sex"), ("sex", "income>50K")])
    ms = simulate_release(data, net, 0.1, jax.random.key(2024 + seed))
    return noisy_marginals_model(net, ms, data.total, coding="reference")


def _scalars(samples: dict[str, Any], site: str) -> np.ndarray:
    """Draws of a site as ``(draws, scalars)``."""
    x = np.asarray(samples[site])
    return x.reshape(x.shape[0], -1)


# ------------------------------------------------------------------------------------------------
# NUTS
# ------------------------------------------------------------------------------------------------
def nuts(model: Any, start: dict, seed: int,
         args: argparse.Namespace) -> tuple[dict[str, Any], dict]:
    """Warm-up and sampling timed apart, from ``start`` (jittered per chain); returns the
    figures and the flat posterior draws."""
    from numpyro.infer import MCMC, NUTS

    from numpyro_dpgm.infer.bayes import init_to_interior
    from numpyro_dpgm.infer.bayes.nuts import NUTS_FIELDS
    from numpyro_dpgm.infer.diagnostics import convergence_report, to_inference_data

    kernel = NUTS(model, init_strategy=init_to_interior(values=start, radius=0.5))
    mcmc = MCMC(kernel, num_warmup=args.warmup, num_samples=args.samples,
                num_chains=args.chains, chain_method="sequential", progress_bar=False)
    load0 = load_average()
    t0 = time.perf_counter()
    mcmc.warmup(jax.random.key(seed), extra_fields=NUTS_FIELDS, collect_warmup=False)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=NUTS_FIELDS)
    jax.block_until_ready(mcmc.get_samples())
    sampling_s = time.perf_counter() - t0
    report = convergence_report(to_inference_data(mcmc, model, rng_key=jax.random.key(seed + 1)))
    ess = report.table["ess_bulk"].to_numpy()
    rhat = report.table["r_hat"].to_numpy()
    out = {
        "chains": args.chains, "warmup": args.warmup, "samples": args.samples,
        "warmup_s": warmup_s, "sampling_s": sampling_s, "scalars": int(ess.size),
        "max_r_hat": float(np.nanmax(rhat)), "median_r_hat": float(np.nanmedian(rhat)),
        "min_ess_bulk": float(np.nanmin(ess)), "median_ess_bulk": float(np.nanmedian(ess)),
        "min_ess_tail": report.min_ess_tail, "divergences": report.divergences,
        "min_ess_per_s": float(np.nanmin(ess)) / sampling_s,
        "median_ess_per_s": float(np.nanmedian(ess)) / sampling_s,
        "min_ess_per_s_total": float(np.nanmin(ess)) / (warmup_s + sampling_s),
        "load_before": load0, "load_after": load_average(),
    }
    return out, mcmc.get_samples()


# ------------------------------------------------------------------------------------------------
# SVI
# ------------------------------------------------------------------------------------------------
def convergence_step(losses: np.ndarray, window: int, tol: float) -> int | None:
    """First ``t`` (a multiple of ``window``) whose window mean of ``losses`` changed by at most
    ``tol·max(1, |mean|)`` from the previous window's; ``None`` if it never does."""
    means = [float(np.mean(losses[i:i + window]))
             for i in range(0, len(losses) - window + 1, window)]
    for k in range(1, len(means)):
        if abs(means[k] - means[k - 1]) <= tol * max(1.0, abs(means[k])):
            return (k + 1) * window
    return None


def _agreement(draws: dict, reference: dict, site: str) -> float:
    """``max |mean − mean_ref| / sd_ref`` over a site's scalars (sd 0 scalars left out)."""
    a, b = _scalars(draws, site), _scalars(reference, site)
    sd = b.std(0)
    keep = sd > 0
    return float(np.max(np.abs(a.mean(0) - b.mean(0))[keep] / sd[keep]))


def svi(model: Any, guide: str, seed: int, start: dict, reference: dict,
        args: argparse.Namespace) -> dict[str, Any]:
    """Runs of ``w`` steps (twice: the first call compiles) and of ``--svi-steps`` steps; the
    time per step is the difference of the last two over their difference in steps, the fixed
    cost the first call's excess over its ``w`` steps."""
    from numpyro_dpgm.infer import run_svi

    w = args.svi_window
    load0 = load_average()
    first = run_svi(model, jax.random.key(seed), guide=guide, num_steps=w, init=start)
    short = run_svi(model, jax.random.key(seed), guide=guide, num_steps=w, init=start)
    fit = run_svi(model, jax.random.key(seed), guide=guide, num_steps=args.svi_steps,
                  init=start)
    losses = np.asarray(fit.losses)
    per_step = max(fit.elapsed - short.elapsed, 0.0) / (args.svi_steps - w)
    fixed = max(first.elapsed - w * per_step, 0.0)  # compilation and drawing, first call
    t = convergence_step(losses, w, args.svi_tol)
    return {
        "guide": guide, "steps": args.svi_steps, "converged_at": t,
        "time_to_converge_s": None if t is None else fixed + t * per_step,
        "fixed_s": fixed, "ms_per_step": 1e3 * per_step, "run_s": fit.elapsed,
        "first_call_s": first.elapsed, "repeat_call_s": short.elapsed,
        "final_neg_elbo": float(np.mean(losses[-w:])),
        "phi_max_z_vs_nuts": _agreement(fit.samples, reference, "phi"),
        "n_max_z_vs_nuts": _agreement(fit.samples, reference, "n"),
        "load_before": load0, "load_after": load_average(),
    }


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks bayes`` (the :mod:`benchmarks` contract): the
    models, the NUTS repeats, chains and iterations, and SVI's steps, window and tolerance."""
    add_out_argument(parser, "bayes")
    parser.add_argument("--models", default="demo,adult",
                        help="comma-separated subset of demo,adult (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="NUTS runs per model, seeds 0..K-1 (default %(default)s)")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--svi-steps", type=int, default=5000)
    parser.add_argument("--svi-window", type=int, default=250)
    parser.add_argument("--svi-tol", type=float, default=1e-3)


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _summarise(results: dict, name: str, nuts_rows: list[dict], svi_rows: list[dict]) -> None:
    keys = ("warmup_s", "sampling_s", "max_r_hat", "min_ess_bulk", "median_ess_bulk",
            "min_ess_per_s", "median_ess_per_s", "min_ess_per_s_total", "divergences",
            "em_phi_max_z")
    results["models"][name] = {
        "nuts_repeats": len(nuts_rows),
        "nuts_median_over_repeats": {k: _median(nuts_rows, k) for k in keys},
        "nuts_worst_max_r_hat": max(r["max_r_hat"] for r in nuts_rows),
        "nuts_total_divergences": sum(r["divergences"] for r in nuts_rows),
        "svi": svi_rows,
    }


def main(args: argparse.Namespace) -> int:
    """NUTS (``--repeats`` seeds) and, on the first seed, SVI with every guide on every
    ``--models`` entry, writing ``bayes.json`` and ``bayes.csv`` under ``--out`` after each run;
    returns 0 (bad options end it with a one-line message)."""
    import numpyro

    from numpyro_dpgm.estimation.cgm_em import em_start

    numpyro.enable_x64()
    numpyro.set_host_device_count(1)
    models = [s for s in args.models.split(",") if s]
    if not models or set(models) - {"demo", "adult"}:
        raise SystemExit(f"--models must name some of demo,adult; got {args.models!r}")
    if args.repeats < 1 or args.chains < 2:
        raise SystemExit("--repeats must be >= 1 and --chains >= 2 (R-hat needs chains)")
    if args.svi_steps < 3 * args.svi_window:
        raise SystemExit("--svi-steps must be at least three windows")
    start = time.perf_counter()
    results = new_record("bayes", {k: v for k, v in vars(args).items() if k != "out"},
                         models={})
    rows: list[dict[str, Any]] = []

    def write() -> None:
        """Write everything measured so far (after every run, so a stopped run keeps it)."""
        results.update(load_average_end=load_average(), wall_s=time.perf_counter() - start,
                       rows=rows)
        write_results(args.out, "bayes", results, rows)

    per_model: dict[str, tuple[list[dict], list[dict]]] = {m: ([], []) for m in models}
    for seed in range(args.repeats):  # every model's first repeat (with SVI) before the next
        for name in models:
            nuts_rows, svi_rows = per_model[name]
            model = build_model(name, seed)
            t0 = time.perf_counter()
            start_values = em_start(model)
            em_s = time.perf_counter() - t0
            fig, draws = nuts(model, start_values, seed, args)
            fig["em_init_s"] = em_s
            em_phi = np.asarray(start_values["phi"]).ravel()
            phi = _scalars(draws, "phi")
            fig["em_phi_max_z"] = float(np.max(np.abs(em_phi - phi.mean(0)) / phi.std(0)))
            nuts_rows.append(fig)
            rows.append({"model": name, "seed": seed, "method": "nuts", **fig})
            _summarise(results, name, nuts_rows, svi_rows)
            write()
            print(f"{name} seed {seed} NUTS: warm-up {fig['warmup_s']:.1f}s sampling "
                  f"{fig['sampling_s']:.1f}s, max R-hat {fig['max_r_hat']:.4f}, bulk ESS min "
                  f"{fig['min_ess_bulk']:.0f} median {fig['median_ess_bulk']:.0f}, ESS/s min "
                  f"{fig['min_ess_per_s']:.1f} median {fig['median_ess_per_s']:.1f}, "
                  f"{fig['divergences']} divergences (load {fig['load_before'][0]:.1f})",
                  flush=True)
            if seed == 0:  # SVI against the first NUTS posterior
                for guide in GUIDES:
                    s = svi(model, guide, seed, start_values, draws, args)
                    svi_rows.append(s)
                    rows.append({"model": name, "seed": seed, "method": f"svi_{guide}", **s})
                    _summarise(results, name, nuts_rows, svi_rows)
                    write()
                    conv = ("not converged" if s["converged_at"] is None else
                            f"converged at step {s['converged_at']} in "
                            f"{s['time_to_converge_s']:.1f}s")
                    print(f"{name} SVI {guide:6s}: {conv}, {s['ms_per_step']:.2f} ms/step, "
                          f"final -ELBO {s['final_neg_elbo']:.2f}, |Δmean|/sd vs NUTS: phi "
                          f"{s['phi_max_z_vs_nuts']:.2f} n {s['n_max_z_vs_nuts']:.2f} "
                          f"(load {s['load_before'][0]:.1f})", flush=True)
    print("\nNUTS, medians over repeats:")
    for name, r in results["models"].items():
        m = r["nuts_median_over_repeats"]
        print(f"  {name:6s} bulk ESS/s min {m['min_ess_per_s']:.1f} median "
              f"{m['median_ess_per_s']:.1f} (with warm-up: min {m['min_ess_per_s_total']:.1f}); "
              f"warm-up {m['warmup_s']:.1f}s sampling {m['sampling_s']:.1f}s; worst R-hat "
              f"{r['nuts_worst_max_r_hat']:.4f}; {r['nuts_total_divergences']} divergences")
    print(f"\nwrote {args.out / 'bayes.json'} and {args.out / 'bayes.csv'} "
          f"({results['wall_s']:.0f} s)")
    return 0
