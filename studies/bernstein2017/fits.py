"""The batched estimators of a grid cell (its trials under ``jax.vmap`` or a loop of the compiled
single-trial program) and their timing."""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dpgm.estimation.losses import MeasurementEvidence, TermData
from numpyro_dpgm.estimation.naive import DEFAULT_L2_FLOOR, naive_mle, naive_theta
from numpyro_dpgm.infer.em_program import em_theta
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.network import MarkovNetwork

__all__ = ["EM_HALVINGS", "EM_INIT_L2_SCALE", "EM_INNER", "EM_ITERS", "cell_fits", "em_batch",
           "em_single", "measurement_evidence", "naive_batch", "naive_single", "resolve_batch",
           "runtime", "vmap_speedup"]

Array = Any

#: CGM-EM's settings in the recorded full run (docs/reproductions/bernstein2017.md): seed 002's
#: Algorithm 2 as :func:`~numpyro_dpgm.estimation.cgm_em.cgm_em` ran it then, with no damping
#: halvings (its default since: up to 20).
EM_ITERS, EM_INNER, EM_INIT_L2_SCALE, EM_HALVINGS = 10, 50, 4.0, 0


def measurement_evidence(net: MarkovNetwork) -> MeasurementEvidence:
    """The E-step's evidence structure of Laplace measurements of every clique of ``net`` (the
    values and the scale come with each trial)."""
    template = [Measurement(c, np.zeros(s), Laplace(1.0)) for c, s in
                zip(net.cliques, net.sizes, strict=True)]
    return MeasurementEvidence.build(net, template)[0]


def _em_one(net: MarkovNetwork, evidence: MeasurementEvidence, y: Array, total: Array,
            b: Array) -> Array:
    theta0, _ = naive_theta(net, y, total, jnp.maximum(EM_INIT_L2_SCALE * b / total,
                                                       DEFAULT_L2_FLOOR))
    data = tuple(TermData(y[net.slice_of(c)], None, 1.0 / b) for c in net.cliques)
    return em_theta(net, evidence, data, theta0, total, max_em_iters=EM_ITERS,
                    inner_iters=EM_INNER, max_halvings=EM_HALVINGS).theta


@functools.partial(jax.jit, static_argnums=0)
def naive_batch(net: MarkovNetwork, ys: Array, total: Array, l2: Array) -> Array:
    """Naive MLE's log-potentials of a batch ``ys`` of noisy tables, one ``jax.vmap``-ed
    program."""
    return jax.vmap(lambda y: naive_theta(net, y, total, l2)[0])(ys)


@functools.partial(jax.jit, static_argnums=0)
def naive_single(net: MarkovNetwork, y: Array, total: Array, l2: Array) -> Array:
    """Naive MLE's log-potentials of one trial's noisy tables ``y``."""
    return naive_theta(net, y, total, l2)[0]


@functools.partial(jax.jit, static_argnums=(0, 1))
def em_batch(net: MarkovNetwork, evidence: MeasurementEvidence, ys: Array, total: Array,
             b: Array) -> Array:
    """CGM-EM's log-potentials (its defaults, Laplace scale ``b``) of a batch ``ys`` of noisy
    tables, one ``jax.vmap``-ed program."""
    return jax.vmap(lambda y: _em_one(net, evidence, y, total, b))(ys)


@functools.partial(jax.jit, static_argnums=(0, 1))
def em_single(net: MarkovNetwork, evidence: MeasurementEvidence, y: Array, total: Array,
              b: Array) -> Array:
    """CGM-EM's log-potentials of one trial's noisy tables ``y``."""
    return _em_one(net, evidence, y, total, b)


def cell_fits(batch: str, batched: Any, single: Any, pre: tuple, ys: Array,
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


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def vmap_speedup(net, evidence, ys, total, lam, b, base, n, eps) -> dict:
    """Batched (vmap) against a Python loop over the same compiled single-trial function."""
    out = {**base, "N": n, "epsilon": eps, "trials": int(ys.shape[0]),
           "loadavg_1min": os.getloadavg()[0]}
    for name, batch, single, args in (
            ("naive", naive_batch, naive_single, (net, ys, total, lam)),
            ("cgm_em", em_batch, em_single, (net, evidence, ys, total, b))):
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


def runtime(net, evidence, y, total, lam, b, records, eps, psgd_options, base, n,
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
