"""The synthetic grid (§4.1): per model, ``|X|``, ``N`` and ε, every method's fits of the
populations' noisy tables and their exact KL to the true model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dpgm.estimation.naive import DEFAULT_L2_FLOOR, default_l2, fit_mle
from numpyro_dpgm.learners.psgd import UnreachableEpsilonError, psgd
from numpyro_dpgm.measurements import Laplace
from numpyro_dpgm.privacy.samplers import simulate_noise

from .._common import label_seed
from .fits import (
    cell_fits,
    em_batch,
    em_single,
    measurement_evidence,
    naive_batch,
    naive_single,
    runtime,
    vmap_speedup,
)
from .models import ExactSampler, Truth, dirichlet_theta, synthetic_network

__all__ = ["synthetic_grid"]


def synthetic_grid(kind: str, k: int, sizes: Sequence[int], epsilons: Sequence[float],
                   populations: int, replicates: int, psgd_replicates: int,
                   timing_cell: tuple[int, int, float] | None, psgd_options: dict,
                   log: Any, flush: Any = None,
                   batch: str = "vmap") -> tuple[list[dict], list[dict], list[dict]]:
    """One model's grid: ``(rows, timing, speed)``, the rows of ``synthetic.csv``,
    ``runtime.csv`` and ``vmap_speedup.csv`` (the last two for ``timing_cell`` only).

    ``flush(rows, timing, speed)``, when given, is called after every finished cell;
    ``batch`` is ``"vmap"`` or ``"loop"`` (:func:`~.fits.resolve_batch`).
    """
    net = synthetic_network(kind, k)
    truth = Truth(net, dirichlet_theta(net, np.random.default_rng([2017, k, len(net.cliques)])))
    sampler = ExactSampler(truth.model)
    evidence = measurement_evidence(net)
    base = {"model": kind, "k": k, "edges": len(net.cliques)}
    rows: list[dict] = []
    timing: list[dict] = []
    speed: list[dict] = []

    # the random reference: Dirichlet(1) tables per clique, then the MLE (independent of N, ε)
    rng = np.random.default_rng([7, k, len(net.cliques)])
    for i in range(populations):
        mu_rand = np.concatenate([rng.dirichlet(np.ones(s)) for s in net.sizes])
        fit = fit_mle(net, mu_rand, DEFAULT_L2_FLOOR)
        rows.append({**base, "N": "", "epsilon": "", "method": "random", "population": i,
                     "replicate": 0, "kl": float(truth.kl(fit.theta)[0]),
                     "seconds": fit.elapsed, "status": "ok"})

    for n in sizes:
        pops = [sampler(n, np.random.default_rng([kind == "er", k, n, i]))
                for i in range(populations)]
        counts = jnp.stack([net.features(x) for x in pops])  # (P, num_params)
        for i in range(populations):
            fit = fit_mle(net, counts[i] / n, DEFAULT_L2_FLOOR)
            rows.append({**base, "N": n, "epsilon": "", "method": "nonprivate", "population": i,
                         "replicate": 0, "kl": float(truth.kl(fit.theta)[0]),
                         "seconds": fit.elapsed, "status": "ok"})
        for eps in epsilons:
            b = len(net.cliques) / eps
            key = jax.random.key(label_seed(kind, k, n, eps))
            noise = simulate_noise(key, Laplace(b), (populations, replicates, net.num_params))
            ys = jnp.reshape(counts[:, None, :] + noise, (-1, net.num_params))
            total, bj = jnp.asarray(float(n)), jnp.asarray(b)
            lam = jnp.asarray(default_l2(b, n))
            th_naive, t_naive = cell_fits(batch, naive_batch, naive_single, (net,), ys,
                                      (total, lam))
            th_em, t_em = cell_fits(batch, em_batch, em_single, (net, evidence), ys, (total, bj))
            cell = {**base, "N": n, "epsilon": eps}
            trials = [(i, j) for i in range(populations) for j in range(replicates)]
            for name, th, t in (("naive", th_naive, t_naive), ("cgm_em", th_em, t_em)):
                for (i, j), kl in zip(trials, truth.kl(th), strict=True):
                    rows.append({**cell, "method": name, "population": i, "replicate": j,
                                 "kl": float(kl), "seconds": t / len(trials), "status": "ok"})
            psgd_times = []
            for i, j in [(i, j) for i, j in trials if j < psgd_replicates]:
                pkey = jax.random.key(label_seed(kind, k, n, eps, i, j, "psgd"))
                try:
                    res = psgd(pops[i], net, budget=eps, rng_key=pkey, **psgd_options)
                except UnreachableEpsilonError as err:
                    rows.append({**cell, "method": "psgd", "population": i, "replicate": j,
                                 "kl": math.nan, "seconds": math.nan,
                                 "status": f"unreachable: {err}"})
                    continue
                psgd_times.append(res.elapsed)
                rows.append({**cell, "method": "psgd", "population": i, "replicate": j,
                             "kl": float(truth.kl(res.theta)[0]), "seconds": res.elapsed,
                             "status": f"sigma={res.extras['noise_multiplier']:.4g}"})
            means = {m: np.nanmean([r["kl"] for r in rows if r.get("N") == n and
                                    r.get("epsilon") == eps and r["method"] == m
                                    and r["model"] == kind and r["k"] == k])
                     for m in ("naive", "cgm_em", "psgd")}
            log(f"{kind} |X|={k} N={n} ε={eps:g}: KL naive {means['naive']:.4f}  cgm_em "
                f"{means['cgm_em']:.4f}  psgd {means['psgd']:.4f}  ({batch}: naive "
                f"{t_naive:.1f}s, EM {t_em:.1f}s for {len(trials)} trials)")
            if timing_cell == (k, n, eps):
                speed.append(vmap_speedup(net, evidence, ys, total, lam, bj, base, n, eps))
                timing.append(runtime(net, evidence, ys[0], total, lam, bj, pops[0], eps,
                                       psgd_options, base, n, psgd_times, speed[-1]))
            if flush is not None:  # a long run leaves every finished cell behind
                flush(rows, timing, speed)
    return rows, timing, speed
