"""The mobility study (§4.2): a simulated tied 24-hour chain with ``1/K``-weighted user-days,
fitted by naive MLE, CGM-EM with tied parameters and PSGD, scored on held-out users."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.estimation.losses import MeasurementEvidence
from numpyro_dpgm.estimation.naive import DEFAULT_L2_FLOOR, default_l2, fit_mle, project_tables
from numpyro_dpgm.learners.psgd import UnreachableEpsilonError, psgd
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.oracles.nlbp import nlbp_map
from numpyro_dpgm.privacy.releases import simulate_release

from .._common import label_seed
from .fits import EM_INIT_L2_SCALE, EM_INNER, EM_ITERS

__all__ = ["mobility_chain", "mobility_grid", "simulate_days", "user_weights"]

Array = Any


def mobility_chain(
    steps: int = 24, locations: int = 6, seed: int = 0
) -> tuple[MarkovNetwork, np.ndarray, np.ndarray]:
    """The tied chain and a known time-homogeneous truth.

    Returns ``(network, tie, w_true)``: the network has the clique ``("h0",)`` and the edges
    ``(h_t, h_{t+1})``; ``tie`` maps its log-potentials to ``k + k²`` free parameters (the node
    potential of the first hour, then one pairwise table shared by all steps), ``k =
    locations + 1`` with state 0 = not connected. The truth is a Markov chain: ``w`` holds
    ``log π`` and ``log P`` with ``P = 0.5·I + 0.5·Dirichlet(1)`` rows and a stickier missing
    state (``P[0, 0] ≈ 0.8``), so that ``A(w[tie]) = 0``.
    """
    k = locations + 1
    names = [f"h{t}" for t in range(steps)]
    net = MarkovNetwork(dict.fromkeys(names, k),
                        [(names[0],)] + [(names[t], names[t + 1]) for t in range(steps - 1)])
    tie = np.concatenate([np.arange(k)] + [k + np.arange(k * k)] * (steps - 1))
    rng = np.random.default_rng(seed)
    P = 0.5 * np.eye(k) + 0.5 * rng.dirichlet(np.ones(k), size=k)
    P[0] = 0.8 * np.eye(k)[0] + 0.2 * rng.dirichlet(np.ones(k))
    pi = rng.dirichlet(np.ones(k))
    pi = 0.5 * pi + 0.5 * np.eye(k)[0]
    return net, tie, np.concatenate([np.log(pi), np.log(P).ravel()])


def simulate_days(w: np.ndarray, k: int, steps: int, n: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``n`` user-days from the chain, days never connected excluded (redrawn)."""
    pi, P = np.exp(w[:k]), np.exp(w[k:]).reshape(k, k)
    cdf = np.cumsum(P, axis=1)
    out = np.zeros((0, steps), dtype=np.int64)
    while len(out) < n:
        m = 2 * (n - len(out)) + 16
        x = np.zeros((m, steps), dtype=np.int64)
        x[:, 0] = rng.choice(k, size=m, p=pi)
        for t in range(1, steps):
            x[:, t] = np.minimum(np.sum(cdf[x[:, t - 1]] < rng.random(m)[:, None], axis=1),
                                 k - 1)
        out = np.concatenate([out, x[np.any(x > 0, axis=1)]])
    return out[:n]


def user_weights(days: np.ndarray) -> np.ndarray:
    """``1/K`` per user-day, ``K`` = its transitions that are not missing–missing (§4.2)."""
    both_missing = (days[:, :-1] == 0) & (days[:, 1:] == 0)
    return 1.0 / np.sum(~both_missing, axis=1)


def _tied_em(net, tie, meas, total, w0):
    """Seed 002's Algorithm 2 for the tied chain: NLBP E-step on the chain's 24 tables at
    ``θ = w[tie]``, then the tied M-step ``argmax_w w·Jᵀn̂ − N·A(w[tie])`` by L-BFGS.

    (:func:`~numpyro_dpgm.infer.mstep.m_step` has no tying, and the NumPyro
    :class:`~numpyro_dpgm.infer.em.EM` needs an integer ``N``, which the ``1/K`` weights break.)
    """
    evidence, data = MeasurementEvidence.build(net, meas)
    free = int(tie.max()) + 1
    w = jnp.asarray(w0)
    for _ in range(EM_ITERS):
        r = nlbp_map(net, w[jnp.asarray(tie)], total, evidence, (data, 0.0),
                     max_iters=EM_INNER)
        target = jax.ops.segment_sum(r.n, jnp.asarray(tie), num_segments=free) / total
        w = fit_mle(net, target, 0.0, tie=tie, init=w).extras["free_params"]
    return w[jnp.asarray(tie)]


def mobility_grid(sizes: Sequence[int], epsilons: Sequence[float], populations: int,
                  replicates: int, psgd_options: dict, log: Any) -> list[dict]:
    """The rows of ``mobility.csv``: per ``N``, population, ε and noise draw, every method's
    held-out log-likelihood per user-day (the truth and the non-private MLE once per
    population)."""
    net, tie, w_true = mobility_chain()
    k = net.domain.shape[0]
    steps = len(net.domain)
    free = int(tie.max()) + 1
    tie_j = jnp.asarray(tie)
    rows: list[dict] = []

    def pooled(flat: Array) -> Array:
        return jax.ops.segment_sum(jnp.asarray(flat), tie_j, num_segments=free)

    for n in sizes:
        for i in range(populations):
            rng = np.random.default_rng([24, n, i])
            days = simulate_days(w_true, k, steps, n + n // 3, rng)
            train, test = days[:n], days[n:]
            wts = user_weights(train)
            total = float(np.sum(wts))

            def held_out(theta: Array, test: np.ndarray = test) -> float:
                return float(jnp.mean(MarkovRandomField(net, theta).log_prob(test)))

            base = {"N": n, "population": i, "weighted_total": total}
            rows.append({**base, "epsilon": "", "method": "truth", "replicate": 0,
                         "heldout_ll": held_out(jnp.asarray(w_true)[tie_j]), "seconds": 0.0,
                         "status": "ok"})
            fit = fit_mle(net, pooled(net.features(train)) / n, DEFAULT_L2_FLOOR, tie=tie)
            rows.append({**base, "epsilon": "", "method": "nonprivate", "replicate": 0,
                         "heldout_ll": held_out(fit.theta), "seconds": fit.elapsed,
                         "status": "ok"})
            for eps in epsilons:
                for j in range(replicates):
                    key = jax.random.key(label_seed("mobility", n, i, eps, j))
                    meas = simulate_release(train, net, eps, key, domain=net.domain,
                                            weights=wts)
                    b = meas[0].noise.scale
                    cell = {**base, "epsilon": eps, "replicate": j}
                    t0 = time.perf_counter()
                    y = net.flatten({m.clique: np.reshape(m.values,
                                                          net.domain.shape_of(m.clique))
                                     for m in meas})
                    lam = default_l2(b, total)
                    w_naive = fit_mle(net, pooled(_project(net, y, total)), lam, tie=tie)
                    t_naive = time.perf_counter() - t0
                    rows.append({**cell, "method": "naive", "heldout_ll":
                                 held_out(w_naive.theta), "seconds": t_naive, "status": "ok"})
                    t0 = time.perf_counter()
                    w0 = fit_mle(net, pooled(_project(net, y, total)),
                                 max(EM_INIT_L2_SCALE * b / total, DEFAULT_L2_FLOOR),
                                 tie=tie).extras["free_params"]
                    th_em = _tied_em(net, tie, meas, total, w0)
                    rows.append({**cell, "method": "cgm_em", "heldout_ll": held_out(th_em),
                                 "seconds": time.perf_counter() - t0, "status": "ok"})
                    try:
                        res = psgd(train, net, budget=eps, rng_key=jax.random.fold_in(key, 1),
                                   tie=tie, **psgd_options)
                        rows.append({**cell, "method": "psgd",
                                     "heldout_ll": held_out(res.theta), "seconds": res.elapsed,
                                     "status": f"sigma={res.extras['noise_multiplier']:.4g}"})
                    except UnreachableEpsilonError as err:
                        rows.append({**cell, "method": "psgd", "heldout_ll": math.nan,
                                     "seconds": math.nan, "status": f"unreachable: {err}"})
                    log(f"mobility N={n} pop={i} ε={eps:g} rep={j}: " + "  ".join(
                        f"{r['method']} {r['heldout_ll']:.3f}" for r in rows[-3:]))
    return rows


@functools.partial(jax.jit, static_argnums=0)
def _project(net: MarkovNetwork, y: Array, total: Array) -> Array:
    return project_tables(net, y, total)
