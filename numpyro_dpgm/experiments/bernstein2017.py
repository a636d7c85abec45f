"""Reproduction of seed 002's experiments (Bernstein et al. 2017, "Differentially private learning
of undirected graphical models using collective graphical models", Section 4).

**Synthetic models (§4.1).** Ten nodes, pairwise potentials, ``θ_e = log w_e`` with
``w_e ~ Dirichlet(1)`` over each edge's ``|X|²`` cells: the third-order chain (an edge when
``1 ≤ |i − j| ≤ 3``, 24 edges) and a connected Erdős–Rényi graph ``G(10, 0.3)`` (the paper does
not give ``p``; one graph from a fixed seed, 14 edges). For each (model, N, ε): five populations
``n_i ~ p(n)`` and five noise draws ``y_ij = n_i + Laplace(|𝒞|/ε)`` per population (add/remove
neighbours, seed 002 Prop. 3), 25 trials. The populations of a given ``(model, N)`` are shared by
the ε values of the grid (the noise draws are not). Methods:

* ``naive``: :func:`~numpyro_dpgm.estimation.naive.naive_mle`'s computation with its default
  ``λ = max(b/N, 10⁻⁴)``, the 25 trials of a cell as one ``jax.vmap``-ed program on an
  accelerator, a loop of the compiled single-trial program on CPU (:func:`resolve_batch`);
* ``cgm_em``: :func:`~numpyro_dpgm.estimation.cgm_em.cgm_em`'s computation at its defaults
  (naive start with ``4b/N``, 10 EM iterations of 50 natural-space NLBP steps), batched too;
* ``psgd``: :func:`~numpyro_dpgm.estimation.psgd.psgd` on the population's records, ``(ε, 1/N)``;
  ε values it cannot reach are recorded as ``unreachable``;
* ``nonprivate``: the MLE of the exact counts (``λ = 10⁻⁴``), one per population;
* ``random``: Dirichlet(1) random tables per clique, then the same MLE (seed 002's reference).

Metric: exact ``KL(p_true ‖ p_learned) = (θ − φ)·μ(θ) − A(θ) + A(φ)`` by the junction tree.

**Mobility (§4.2).** The Wi-Fi data are not public: users' days are simulated from a known
time-homogeneous chain over ``24`` hourly steps, state 0 meaning "not connected" (a missing
hour) and ``1..L`` access points, with a sticky missing state. Days with no connection at all
are not in the data (a log has no trace of them). The released statistics are the 24 tables of
the chain (the first hour and the 23 transitions); every user-day contributes ``1/K`` to each,
``K`` being its number of transitions that are not missing–missing (seed 002's normalisation),
so one user-day changes each table by at most 1 and the L1 sensitivity is 24. The fitted model
is the tied chain (one node potential on the first hour, one pairwise table shared by all
steps); naive MLE pools its projected tables, CGM-EM runs :class:`~numpyro_dpgm.infer.em.EM`
with the tied parameters, PSGD clips per user-day. Score: mean held-out log-likelihood per
user-day on 25% held-out users.

Outputs (:func:`run`): ``synthetic.csv`` (one row per fit), ``synthetic_summary.csv``,
``runtime.csv`` (each method's time per fit relative to naive MLE), ``vmap_speedup.csv``,
``mobility.csv``, ``mobility_summary.csv``, ``synthetic_<model>.png`` (Fig. 2 style) and
``mobility.png`` (Fig. 3b style), ``meta.json`` (grid, wall time, load averages).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import platform
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from ..distributions.mrf import MarkovRandomField
from ..estimation.cgm_em import MeasurementEvidence, em_theta
from ..estimation.losses import TermData
from ..estimation.naive import (
    DEFAULT_L2_FLOOR,
    default_l2,
    fit_mle,
    naive_mle,
    naive_theta,
    project_tables,
)
from ..estimation.psgd import UnreachableEpsilonError, psgd
from ..inference import junction_tree as jt
from ..inference.nlbp import nlbp_map
from ..measurements import Laplace, Measurement
from ..network import MarkovNetwork
from ..privacy.releases import simulate_release
from ..privacy.samplers import simulate_noise

__all__ = [
    "ExactSampler",
    "dirichlet_theta",
    "mobility_chain",
    "model_edges",
    "resolve_batch",
    "run",
    "summary_markdown",
    "synthetic_network",
]

Array = Any

#: Erdős–Rényi edge probability and the seed of the graph (resampled until connected).
ER_P, ER_SEED = 0.3, 10_000
#: CGM-EM's defaults (:func:`~numpyro_dpgm.estimation.cgm_em.cgm_em`).
EM_ITERS, EM_INNER, EM_INIT_L2_SCALE = 10, 50, 4.0
METHODS = ("naive", "cgm_em", "psgd", "nonprivate", "random")


# ------------------------------------------------------------------------------------------------
# synthetic models
# ------------------------------------------------------------------------------------------------
def model_edges(kind: str, num_nodes: int = 10) -> list[tuple[str, str]]:
    """Edges of seed 002's synthetic graphs: ``"chain3"`` (``1 ≤ |i−j| ≤ 3``) or ``"er"``."""
    names = [f"x{i}" for i in range(num_nodes)]
    if kind == "chain3":
        return [(names[i], names[j]) for i in range(num_nodes)
                for j in range(i + 1, num_nodes) if j - i <= 3]
    if kind == "er":
        rng = np.random.default_rng(ER_SEED)
        while True:
            g = nx.gnp_random_graph(num_nodes, ER_P, seed=int(rng.integers(2**31)))
            if nx.is_connected(g):
                return [(names[u], names[v]) for u, v in sorted(g.edges)]
    raise ValueError(f"unknown model {kind!r}; use 'chain3' or 'er'")


def synthetic_network(kind: str, k: int = 10, num_nodes: int = 10) -> MarkovNetwork:
    """The pairwise network of :func:`model_edges` with ``k`` values per node."""
    return MarkovNetwork({f"x{i}": k for i in range(num_nodes)}, model_edges(kind, num_nodes))


def dirichlet_theta(network: MarkovNetwork, rng: np.random.Generator) -> np.ndarray:
    """``θ_C = log w_C``, ``w_C ~ Dirichlet(1)`` over each clique's cells (seed 002, §4.1)."""
    return np.concatenate([np.log(rng.dirichlet(np.ones(s))) for s in network.sizes])


class ExactSampler:
    """Exact i.i.d. records by sequential conditionals ``p(x_i | x_{B_i})``.

    For the order of the domain, ``B_i`` is the set of earlier attributes adjacent to the
    connected component of ``x_i`` among ``x_i, …, x_d`` (they separate ``x_i`` from the other
    earlier attributes), so ``p(x_i | x_{<i}) = p(x_i | x_{B_i})``; each conditional comes from
    one junction-tree marginal of ``{x_i} ∪ B_i``. Sampling ``n`` records is then ``O(n·d)``.
    """

    def __init__(self, model: MarkovRandomField):
        net = model.network
        attrs = net.domain.attrs
        g = net.graph
        self.parents: list[list[int]] = []
        self.cdfs: list[np.ndarray] = []
        for i, a in enumerate(attrs):
            later = g.subgraph(attrs[i:])
            comp = nx.node_connected_component(later, a)
            bound = sorted({attrs.index(b) for c in comp for b in g[c]
                            if attrs.index(b) < i})
            table = np.asarray(jt.marginal(net, model.theta,
                                           tuple(attrs[j] for j in bound) + (a,)))
            table = np.maximum(table, 0.0)
            cond = table / table.sum(axis=-1, keepdims=True)
            cdf = np.cumsum(cond, axis=-1)
            cdf[..., -1] = 1.0
            self.parents.append(bound)
            self.cdfs.append(cdf)

    def __call__(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = np.zeros((n, len(self.parents)), dtype=np.int64)
        for i, (par, cdf) in enumerate(zip(self.parents, self.cdfs, strict=True)):
            rows = cdf[tuple(x[:, j] for j in par)] if par else np.broadcast_to(cdf, (n,) +
                                                                                 cdf.shape)
            u = rng.random(n)[:, None]
            x[:, i] = np.minimum(np.sum(rows < u, axis=1), cdf.shape[-1] - 1)
        return x


# ------------------------------------------------------------------------------------------------
# batched estimators (the trials of a grid cell under jax.vmap)
# ------------------------------------------------------------------------------------------------
def _evidence(net: MarkovNetwork) -> MeasurementEvidence:
    template = [Measurement(c, np.zeros(s), Laplace(1.0)) for c, s in
                zip(net.cliques, net.sizes, strict=True)]
    return MeasurementEvidence.build(net, template)[0]


def _em_one(net: MarkovNetwork, evidence: MeasurementEvidence, y: Array, total: Array,
            b: Array) -> Array:
    theta0, _ = naive_theta(net, y, total, jnp.maximum(EM_INIT_L2_SCALE * b / total,
                                                       DEFAULT_L2_FLOOR))
    data = tuple(TermData(y[net.slice_of(c)], None, 1.0 / b) for c in net.cliques)
    return em_theta(net, evidence, data, theta0, total, max_em_iters=EM_ITERS,
                    inner_iters=EM_INNER).theta


@functools.partial(jax.jit, static_argnums=0)
def _naive_batch(net: MarkovNetwork, ys: Array, total: Array, l2: Array) -> Array:
    return jax.vmap(lambda y: naive_theta(net, y, total, l2)[0])(ys)


@functools.partial(jax.jit, static_argnums=0)
def _naive_single(net: MarkovNetwork, y: Array, total: Array, l2: Array) -> Array:
    return naive_theta(net, y, total, l2)[0]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _em_batch(net: MarkovNetwork, evidence: MeasurementEvidence, ys: Array, total: Array,
              b: Array) -> Array:
    return jax.vmap(lambda y: _em_one(net, evidence, y, total, b))(ys)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _em_single(net: MarkovNetwork, evidence: MeasurementEvidence, y: Array, total: Array,
               b: Array) -> Array:
    return _em_one(net, evidence, y, total, b)


def _fits(batch: str, batched: Any, single: Any, pre: tuple, ys: Array,
          rest: tuple) -> tuple[Array, float]:
    """The fits of one grid cell and their wall time: one ``jax.vmap``-ed program over the
    trials (``batch="vmap"``) or a Python loop of the compiled single-trial program
    (``"loop"``)."""
    if batch == "vmap":
        return _timed(batched, *pre, ys, *rest)
    return _timed(lambda: jnp.stack([jax.block_until_ready(single(*pre, y, *rest))
                                     for y in ys]))


def resolve_batch(batch: str) -> str:
    """``"auto"`` → ``"vmap"`` on an accelerator, ``"loop"`` on CPU, where the vmapped cell was
    measured 4–15× slower (``vmap_speedup.csv``, docs/reproductions/bernstein2017.md);
    ``"vmap"`` and ``"loop"`` pass through."""
    if batch == "auto":
        return "loop" if jax.default_backend() == "cpu" else "vmap"
    if batch not in ("vmap", "loop"):
        raise ValueError(f"batch must be 'auto', 'vmap' or 'loop', got {batch!r}")
    return batch


@functools.partial(jax.jit, static_argnums=0)
def _log_partitions(net: MarkovNetwork, thetas: Array) -> Array:
    return jax.vmap(lambda t: jt.log_partition(net, t))(thetas)


class _Truth:
    """The true model with ``μ(θ)`` and ``A(θ)`` cached for batched exact KL."""

    def __init__(self, net: MarkovNetwork, theta: np.ndarray):
        self.net = net
        self.theta = jnp.asarray(theta)
        self.model = MarkovRandomField(net, self.theta)
        self.mu = net.flatten(jt.marginals(net, self.theta))
        self.log_z = jt.log_partition(net, self.theta)

    def kl(self, phis: Array) -> np.ndarray:
        """``KL(p_θ ‖ p_φ)`` for a batch ``(B, num_params)`` of fitted log-potentials."""
        phis = jnp.atleast_2d(phis)
        val = ((self.theta[None] - phis) @ self.mu - self.log_z
               + _log_partitions(self.net, phis))
        return np.asarray(val)


def _seed(*parts: Any) -> int:
    """A reproducible 31-bit seed from labels (``hash`` of strings varies between runs)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# synthetic grid
# ------------------------------------------------------------------------------------------------
def _synthetic(kind: str, k: int, sizes: Sequence[int], epsilons: Sequence[float],
               populations: int, replicates: int, psgd_replicates: int,
               timing_cell: tuple[int, int, float] | None, psgd_options: dict,
               log: Any, flush: Any = None,
               batch: str = "vmap") -> tuple[list[dict], list[dict], list[dict]]:
    net = synthetic_network(kind, k)
    truth = _Truth(net, dirichlet_theta(net, np.random.default_rng([2017, k, len(net.cliques)])))
    sampler = ExactSampler(truth.model)
    evidence = _evidence(net)
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
            key = jax.random.key(_seed(kind, k, n, eps))
            noise = simulate_noise(key, Laplace(b), (populations, replicates, net.num_params))
            ys = jnp.reshape(counts[:, None, :] + noise, (-1, net.num_params))
            total, bj = jnp.asarray(float(n)), jnp.asarray(b)
            lam = jnp.asarray(default_l2(b, n))
            th_naive, t_naive = _fits(batch, _naive_batch, _naive_single, (net,), ys,
                                      (total, lam))
            th_em, t_em = _fits(batch, _em_batch, _em_single, (net, evidence), ys, (total, bj))
            cell = {**base, "N": n, "epsilon": eps}
            trials = [(i, j) for i in range(populations) for j in range(replicates)]
            for name, th, t in (("naive", th_naive, t_naive), ("cgm_em", th_em, t_em)):
                for (i, j), kl in zip(trials, truth.kl(th), strict=True):
                    rows.append({**cell, "method": name, "population": i, "replicate": j,
                                 "kl": float(kl), "seconds": t / len(trials), "status": "ok"})
            psgd_times = []
            for i, j in [(i, j) for i, j in trials if j < psgd_replicates]:
                pkey = jax.random.key(_seed(kind, k, n, eps, i, j, "psgd"))
                try:
                    res = psgd(pops[i], net, eps, key=pkey, **psgd_options)
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
                speed.append(_vmap_speedup(net, evidence, ys, total, lam, bj, base, n, eps))
                timing.append(_runtime(net, evidence, ys[0], total, lam, bj, pops[0], eps,
                                       psgd_options, base, n, psgd_times, speed[-1]))
            if flush is not None:  # a long run leaves every finished cell behind
                flush(rows, timing, speed)
    return rows, timing, speed


def _vmap_speedup(net, evidence, ys, total, lam, b, base, n, eps) -> dict:
    """Batched (vmap) against a Python loop over the same compiled single-trial function."""
    out = {**base, "N": n, "epsilon": eps, "trials": int(ys.shape[0]),
           "loadavg_1min": os.getloadavg()[0]}
    for name, batch, single, args in (
            ("naive", _naive_batch, _naive_single, (net, ys, total, lam)),
            ("cgm_em", _em_batch, _em_single, (net, evidence, ys, total, b))):
        jax.block_until_ready(batch(*args))  # compile (or warm)
        _, t_batch = _timed(batch, *args)
        pre, data = args[:-3], args[-3:]
        jax.block_until_ready(single(*pre, data[0][0], *data[1:]))  # compile
        t0 = time.perf_counter()
        for y in data[0]:
            jax.block_until_ready(single(*pre, y, *data[1:]))
        t_loop = time.perf_counter() - t0
        out[f"{name}_vmap_s"], out[f"{name}_loop_s"] = t_batch, t_loop
        out[f"{name}_speedup"] = t_loop / t_batch
    return out


def _runtime(net, evidence, y, total, lam, b, records, eps, psgd_options, base, n,
             psgd_times, speed) -> dict:
    """Seconds per fit of each method (compiled, one trial at a time) and ratios to naive."""
    trials = speed["trials"]
    t_naive = speed["naive_loop_s"] / trials
    t_em = speed["cgm_em_loop_s"] / trials
    # the public estimators end to end (validation, compiled programs, host transfers)
    meas = [Measurement(c, np.asarray(y[net.slice_of(c)]), Laplace(float(b)))
            for c in net.cliques]
    naive_mle(meas, net, total_count=float(total))
    _, t_naive_api = _timed(lambda: naive_mle(meas, net, total_count=float(total)).theta)
    t_psgd = float(np.median(psgd_times)) if psgd_times else math.nan
    return {**base, "N": n, "epsilon": eps, "naive_s": t_naive, "cgm_em_s": t_em,
            "psgd_s": t_psgd, "naive_api_s": t_naive_api,
            "cgm_em_ratio": t_em / t_naive, "psgd_ratio": t_psgd / t_naive,
            "loadavg_1min": os.getloadavg()[0]}


# ------------------------------------------------------------------------------------------------
# mobility study
# ------------------------------------------------------------------------------------------------
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


def _simulate_days(w: np.ndarray, k: int, steps: int, n: int,
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


def _mobility(sizes: Sequence[int], epsilons: Sequence[float], populations: int,
              replicates: int, psgd_options: dict, log: Any) -> list[dict]:
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
            days = _simulate_days(w_true, k, steps, n + n // 3, rng)
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
                    key = jax.random.key(_seed("mobility", n, i, eps, j))
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
                        res = psgd(train, net, eps, key=jax.random.fold_in(key, 1), tie=tie,
                                   **psgd_options)
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


# ------------------------------------------------------------------------------------------------
# summaries and figures
# ------------------------------------------------------------------------------------------------
def _write_csv(path: Path, rows: list[dict]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _summarise(rows: list[dict], keys: Sequence[str], value: str) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for g, rs in groups.items():
        vals = np.array([r[value] for r in rs], dtype=float)
        ok = vals[np.isfinite(vals)]
        out.append({**dict(zip(keys, g, strict=True)), "trials": len(rs),
                    "reached": len(ok), f"{value}_mean": ok.mean() if len(ok) else math.nan,
                    f"{value}_sd": ok.std(ddof=1) if len(ok) > 1 else math.nan,
                    f"{value}_median": np.median(ok) if len(ok) else math.nan})
    return out


_STYLE = {"naive": ("tab:red", "o", "-"), "cgm_em": ("tab:blue", "s", "-"),
          "psgd": ("tab:green", "^", "--"), "nonprivate": ("black", "", ":"),
          "random": ("gray", "", "-."), "truth": ("gray", "", "-.")}
_LABEL = {"naive": "Naive MLE", "cgm_em": "CGM-EM", "psgd": "PSGD (δ = 1/N)",
          "nonprivate": "non-private MLE", "random": "random", "truth": "true model"}


def _plot_synthetic(summary: list[dict], path: Path, kind: str, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = [r for r in summary if r["model"] == kind and r["k"] == k]
    epsilons = sorted({r["epsilon"] for r in sel if r["epsilon"] != ""})
    fig, axes = plt.subplots(1, len(epsilons), figsize=(3.6 * len(epsilons), 3.4),
                             sharey=True, squeeze=False)
    for ax, eps in zip(axes[0], epsilons, strict=True):
        for m in ("naive", "cgm_em", "psgd", "nonprivate"):
            pts = sorted((r["N"], r["kl_mean"], r["kl_sd"]) for r in sel if r["method"] == m
                         and (r["epsilon"] == eps or m == "nonprivate")
                         and np.isfinite(r["kl_mean"]))
            if not pts:
                continue
            c, mk, ls = _STYLE[m]
            x, y, e = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
            ax.errorbar(x, y, yerr=np.nan_to_num(e), color=c, marker=mk, ls=ls, capsize=3,
                        label=_LABEL[m])
        rand = [r["kl_mean"] for r in sel if r["method"] == "random"]
        if rand:
            ax.axhline(rand[0], color="gray", ls="-.", label=_LABEL["random"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"ε = {eps:g}")
        ax.set_xlabel("population size N")
    axes[0][0].set_ylabel("KL(p_true ‖ p_learned)")
    axes[0][-1].legend(fontsize=7)
    name = {"chain3": "third-order chain", "er": "Erdős–Rényi"}[kind]
    fig.suptitle(f"{name}, 10 nodes, |X| = {k}: mean ± sd over trials")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_mobility(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["N"] for r in summary})
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.8 * len(sizes), 3.4), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        sel = [r for r in summary if r["N"] == n]
        for m in ("naive", "cgm_em", "psgd"):
            pts = sorted((r["epsilon"], r["heldout_ll_mean"], r["heldout_ll_sd"]) for r in sel
                         if r["method"] == m and np.isfinite(r["heldout_ll_mean"]))
            if pts:
                c, mk, ls = _STYLE[m]
                x, y, e = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
                ax.errorbar(x, y, yerr=np.nan_to_num(e), color=c, marker=mk, ls=ls, capsize=3,
                            label=_LABEL[m])
        for m in ("nonprivate", "truth"):
            v = [r["heldout_ll_mean"] for r in sel if r["method"] == m]
            if v:
                ax.axhline(v[0], color=_STYLE[m][0], ls=_STYLE[m][2], label=_LABEL[m])
        ax.set_xscale("log")
        ax.set_title(f"N = {n} user-days")
        ax.set_xlabel("ε")
    axes[0][0].set_ylabel("held-out log-likelihood per user-day")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("simulated mobility: tied 24-hour chain, 1/K normalisation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pm(r: dict | None, value: str, digits: int = 3) -> str:
    """``mean ± sd`` of a summary row (with ``reached/trials`` when some did not run)."""
    if r is None or not r[f"{value}_mean"] or not np.isfinite(float(r[f"{value}_mean"])):
        return "–" if r is None else f"unreachable ({r['trials']})"
    sd = r[f"{value}_sd"]
    txt = f"{float(r[f'{value}_mean']):.{digits}f}"
    if sd and np.isfinite(float(sd)):
        txt += f" ± {float(sd):.{digits}f}"
    if r["reached"] != r["trials"]:
        txt += f" ({r['reached']}/{r['trials']})"
    return txt


def summary_markdown(out: Path | str) -> str:
    """Markdown tables of a finished (or cut-off) run in ``out``, from its CSV files and
    ``meta.json``; :func:`run` writes them to ``summary.md``."""
    out = Path(out)
    lines: list[str] = []
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    if meta:
        lines += [f"Wall time {meta['wall_s']:.0f} s ({meta['wall_s'] / 60:.1f} min); trials of "
                  f"a cell as `{meta.get('batch', 'vmap')}` on {meta.get('backend', 'cpu')}; "
                  f"{meta['cpus']} CPUs; load average {meta['loadavg_start'][0]:.1f} at the "
                  f"start, {meta['loadavg_end'][0]:.1f} at the end.", ""]
    summ = _read_csv(out / "synthetic_summary.csv")
    idx = {(r["model"], r["k"], r["N"], r["epsilon"], r["method"]): r for r in summ}
    cells = sorted({(r["model"], r["k"], int(r["N"]), float(r["epsilon"])) for r in summ
                    if r["epsilon"]}, key=lambda c: (c[0], int(c[1]), c[2], c[3]))
    if cells:
        wins = 0
        lines += ["KL(p_true ‖ p_learned), mean ± sd over the trials (bold: the better of naive "
                  "MLE and CGM-EM):", "",
                  "| model | k | N | ε | naive MLE | CGM-EM | PSGD | non-private | random |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for model, k, n, eps in cells:
            key = (model, k, str(n), repr(eps))
            nv, em = idx.get((*key, "naive")), idx.get((*key, "cgm_em"))
            cols = [_pm(nv, "kl"), _pm(em, "kl")]
            if nv and em:
                better = int(float(em["kl_mean"]) < float(nv["kl_mean"]))
                wins += better
                cols[better] = f"**{cols[better]}**"
            lines.append(f"| {model} | {k} | {n} | {eps:g} | {cols[0]} | {cols[1]} | "
                         f"{_pm(idx.get((*key, 'psgd')), 'kl')} | "
                         f"{_pm(idx.get((model, k, str(n), '', 'nonprivate')), 'kl')} | "
                         f"{_pm(idx.get((model, k, '', '', 'random')), 'kl', 1)} |")
        lines += ["", f"CGM-EM below naive MLE in {wins} of {len(cells)} cells.", ""]
    runtime = _read_csv(out / "runtime.csv")
    if runtime:
        lines += ["Seconds per fit (compiled, one trial at a time) and ratio to naive MLE:", "",
                  "| model | k | N | ε | naive MLE | CGM-EM | PSGD | load |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['k']} | {r['N']} | {float(r['epsilon']):g} | "
                  f"{float(r['naive_s']):.3f} s | {float(r['cgm_em_ratio']):.2f}× | "
                  f"{float(r['psgd_ratio']):.1f}× | {float(r['loadavg_1min']):.1f} |"
                  for r in runtime]
        lines.append("")
    speed = _read_csv(out / "vmap_speedup.csv")
    if speed:
        lines += ["One `jax.vmap`-ed program over the trials of a cell against a loop of the "
                  "compiled single-trial program (both warm):", "",
                  "| model | k | N | ε | trials | naive: vmap / loop | CGM-EM: vmap / loop "
                  "| load |", "|---|---|---|---|---|---|---|---|"]
        for r in speed:
            lines.append(
                f"| {r['model']} | {r['k']} | {r['N']} | {float(r['epsilon']):g} | {r['trials']} "
                f"| {float(r['naive_vmap_s']):.1f} s / {float(r['naive_loop_s']):.1f} s "
                f"(**{float(r['naive_speedup']):.2f}×**) | {float(r['cgm_em_vmap_s']):.1f} s / "
                f"{float(r['cgm_em_loop_s']):.1f} s (**{float(r['cgm_em_speedup']):.2f}×**) | "
                f"{float(r['loadavg_1min']):.1f} |")
        lines.append("")
    mob = _read_csv(out / "mobility_summary.csv")
    if mob:
        midx = {(r["N"], r["epsilon"], r["method"]): r for r in mob}
        lines += ["Mobility: held-out log-likelihood per user-day, mean ± sd:", "",
                  "| N | ε | naive MLE | CGM-EM | PSGD | non-private | true model |",
                  "|---|---|---|---|---|---|---|"]
        for n, eps in sorted({(int(r["N"]), float(r["epsilon"])) for r in mob if r["epsilon"]}):
            g = [midx.get((str(n), repr(eps), m)) for m in ("naive", "cgm_em", "psgd")]
            ref = [midx.get((str(n), "", m)) for m in ("nonprivate", "truth")]
            lines.append(f"| {n} | {eps:g} | " + " | ".join(_pm(r, "heldout_ll") for r in g + ref)
                         + " |")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------
def _write_synthetic(out: Path, rows: list[dict], timing: list[dict], speed: list[dict],
                     kind: str, k: int) -> None:
    """Tables and the figure of the cells finished so far."""
    _write_csv(out / "synthetic.csv", rows)
    summary = _summarise(rows, ("model", "k", "N", "epsilon", "method"), "kl")
    _write_csv(out / "synthetic_summary.csv", summary)
    if timing:
        _write_csv(out / "runtime.csv", timing)
        _write_csv(out / "vmap_speedup.csv", speed)
    _plot_synthetic(summary, out / f"synthetic_{kind}_k{k}.png", kind, k)


#: The grids. Quick: the middle of the paper's grid (N = 10⁴, ε ∈ {0.1, 1}) on both models with
#: 3 × 3 nested trials instead of 5 × 5, and one small mobility cell.
#: PSGD (the slowest method) gets ``psgd_replicates`` noise draws per population.
FULL = {"k": (10, 20), "models": ("chain3", "er"), "sizes": (1_000, 10_000, 100_000),
        "epsilons": (0.1, 1.0, 10.0), "populations": 5, "replicates": 5, "psgd_replicates": 5,
        "timing_cell": (10, 10_000, 1.0), "batch": "auto",
        "mobility": {"sizes": (1_000, 10_000), "epsilons": (0.1, 1.0, 10.0),
                     "populations": 2, "replicates": 1}}
QUICK = {"k": (10,), "models": ("chain3", "er"), "sizes": (10_000,), "epsilons": (0.1, 1.0),
         "populations": 3, "replicates": 3, "psgd_replicates": 1, "timing_cell": None,
         "batch": "auto",
         "mobility": {"sizes": (2_000,), "epsilons": (1.0,), "populations": 1,
                      "replicates": 1}}
#: PSGD's settings (psgd's defaults: 5 epochs, lot √N, clip √|𝒞|, learning rate 0.5).
PSGD_OPTIONS: dict = {}


def run(out: Path | str, quick: bool = False, grid: dict | None = None,
        log: Any = print) -> Path:
    """Run the study and write its tables and figures to ``out``; returns ``out``.

    ``grid`` overrides :data:`FULL` / :data:`QUICK` (same keys). Needs float64 (the CLI enables
    it).
    """
    if not jax.config.jax_enable_x64:
        raise RuntimeError("bernstein2017 needs float64: call numpyro.enable_x64() first")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = dict(QUICK if quick else FULL, **(grid or {}))
    start = time.perf_counter()
    load0 = os.getloadavg()
    rows, timing, speed = [], [], []
    cell = tuple(g["timing_cell"]) if g.get("timing_cell") else None
    batch = resolve_batch(g.get("batch", "auto"))
    log(f"bernstein2017: trials of a cell run as {batch!r} on {jax.default_backend()}")
    mob = g.get("mobility")
    for pos, k in enumerate(g["k"]):
        for kind in g["models"]:
            def flush(r: list, t: list, s: list, kind: str = kind, k: int = k,
                      done: tuple = (rows, timing, speed)) -> None:
                _write_synthetic(out, done[0] + r, done[1] + t, done[2] + s, kind, k)

            r, t, s = _synthetic(kind, k, g["sizes"], g["epsilons"], g["populations"],
                                 g["replicates"], g["psgd_replicates"], cell, PSGD_OPTIONS, log,
                                 flush, batch)
            rows += r
            timing += t
            speed += s
        if mob and pos == 0:  # after the first |X|, so that a cut-off run has every part
            mrows = _mobility(mob["sizes"], mob["epsilons"], mob["populations"],
                              mob["replicates"], PSGD_OPTIONS, log)
            _write_csv(out / "mobility.csv", mrows)
            msum = _summarise(mrows, ("N", "epsilon", "method"), "heldout_ll")
            _write_csv(out / "mobility_summary.csv", msum)
            _plot_mobility(msum, out / "mobility.png")
    meta = {"quick": quick, "grid": g, "batch": batch, "backend": jax.default_backend(),
            "wall_s": time.perf_counter() - start,
            "loadavg_start": load0, "loadavg_end": os.getloadavg(),
            "machine": platform.platform(), "jax": jax.__version__,
            "cpus": os.cpu_count()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    (out / "summary.md").write_text(summary_markdown(out))
    log(f"bernstein2017: {meta['wall_s']:.0f} s wall, load {load0} -> {meta['loadavg_end']}")
    return out
