"""Stopping Prox-PGM's mirror-descent path where its estimated risk is least (SURE).

Entropic mirror descent from the maximum-entropy point (seed 003, Algorithm 1 from ``θ = 0``)
traces a path of fits ``μ_t(y)`` from the uniform distribution to the optimum of Problem 1;
stopped early, a fit is entropy-regularised. Which iterate is closest to the true tables
depends on the noise and the data, so this rule estimates the risk of every iterate and keeps
the least, without the truth. For answers ``ŷ_t = Q μ_t(y)`` of ``m`` noisy measurements
``y = Qn + e`` with variances ``σ_i²``, the whitened squared error
``R_t = Σ_i (ŷ_{t,i} − (Qn)_i)²/σ_i²`` has the unbiased estimate (Stein 1981)

.. math:: \\hat R_t = 2L(μ_t) − m + 2\\,\\mathrm{df}_t,\\qquad
   \\mathrm{df}_t = \\sum_i w_i\\,\\frac{∂ŷ_{t,i}}{∂y_i},

with ``L`` the L2 loss ``½Σ r_i²/σ_i²`` and ``w_i = 1`` for Gaussian noise (Stein's lemma
``E[e_i g(y)] = σ_i² E[∂g/∂y_i]``). For Laplace noise of scale ``b`` (``σ² = 2b²``) the lemma
becomes ``E[e_i g(y)] = E[b(|e_i| + b) ∂g/∂y_i]`` (integration by parts against the Laplace
density), i.e. ``w_i = (|e_i|/b + 1)/2``; the unknown ``|e_i|`` is replaced by the residual of
the first iterate that explains the measurements as well as the truth does in expectation
(``L ≤ m/2``, the discrepancy level of
:func:`~numpyro_dpgm.estimation.losses.expected_noise_loss`), and ``R̂_t`` is compared from that
iterate on. On Adult's tree workload at ε = 0.1 (one release, compared once by hand, not by a
benchmark command) the plain Gaussian weights picked an iterate whose error was 1.35× the best
on the path, the Laplace weights one within 1.01×.

The divergence is computed by forward-mode differentiation of the path in ``y``, with the step
sizes and the accepted steps held fixed (they are piecewise constant in ``y``): each accepted
step ``θ_{t+1} = θ_t − α_t ∇L(μ(θ_t); y)`` carries the tangents
``θ̇_{t+1} = θ̇_t − α_t \\dot{∇L}_t``, where ``\\dot{∇L}_t`` and ``\\dot ŷ_t`` are the JVP of
``(θ, y) ↦ (∇L(μ(θ); y), Qμ(θ))`` along ``(θ̇_t, v)``. ``Σ_i w_i ∂ŷ_i/∂y_i`` is Hutchinson's
estimate ``mean_k Σ_i w_i v_{k,i} (J v_k)_i`` over :data:`PROBES` Rademacher probes ``v_k``
(four), the same along the whole path: the pick depends on the differences of ``R̂_t``
between iterates, which have far less noise than ``R̂_t`` itself. One probe is not enough: on
the demo's release (Adult's tree, ε = 1, ``dpgm demo --seed 0``) the probe of
``jax.random.key(0)`` gave an ``R̂_t`` that kept falling for 6,000 iterations while the error
rose (mean L1 0.0512 at the limit), while the probes of keys 1 and 2 stopped at iteration
1,201 and 1,217 (0.0411); with four probes all three keys stopped at 1,207–1,283 with 0.0411
(one run each, by hand, under the earlier patience of :data:`PATIENCE_SHARE` 1). Four probes
cost 2.3× the time of one on Appendix C.4 at ε = 1 (72.8 s against 31.6 s, ``python -m
benchmarks converge``), where the oracle's JVP dominates. The reported ``risk`` of one iterate
is noisier (standard deviation about ``√(2·df)``).

The path stops once ``R̂_t`` has not improved for a quarter as many iterations as it took from
the discrepancy iterate to the best one (:data:`PATIENCE_SHARE`; at least :data:`PATIENCE`
iterations), at the optimum (the
``tol`` rule), at the iteration limit, or, given a ``budget``, when no iterate has reached the
noise level after that many iterations (``prox_pgm(stop="auto")`` then fits the optimum
instead). It gives that budget up sooner where the loss falls too slowly to reach the level
within it: when even a geometric decrease :data:`SPEEDUP` times as fast as over the last
:data:`LOOKBACK` iterations would not bring the loss's excess over the level,
``L_t/(m/2) − 1``, down to :data:`NEAR` by the budget. The fit returned is the iterate of
least ``R̂_t``.
Each step costs one oracle JVP along the :data:`PROBES` tangents (the trial and its tangents
together).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import jit_modes
from ..oracles.protocol import ExactOracle, MarginalOracle, apply_oracle, oracle_operands
from .losses import TermGroup, group_answers
from .mirror_descent import (
    BLOCK,
    MarginalLoss,
    ProxPGMState,
    init_at,
    md_trial,
    run_blocks,
    where_tree,
)

__all__ = ["BUDGET", "LOOKBACK", "NEAR", "OPTIMUM", "PATIENCE", "PATIENCE_SHARE", "PROBES",
           "RISK", "RUNNING", "RiskState", "SPEEDUP", "risk_path"]

Array = Any

#: Rademacher probes of the divergence estimate (one was not enough; module docstring).
PROBES = 4
#: The least number of iterations without improvement before the path stops.
PATIENCE = 50
#: The path waits ``PATIENCE_SHARE·(t_best − t_pilot)`` iterations without improvement (at least
#: :data:`PATIENCE`). Measured with this constant set by hand to 1 (the earlier rule), 0.5 and
#: 0.25: ``python -m benchmarks stopping --releases 50`` picked iterates of the same mean error
#: on all four problems (within 0.02 %) while the mean path fell from 1,026 to 685 iterations on
#: ``chain``; on Adult's tree at ε = 1 (the demo's release and seeds 1–3, probe keys 0–2, by
#: hand) 0.25 picked the same iterate in all 12 paths with 28 % fewer iterations.
PATIENCE_SHARE = 0.25
#: The budget is given up early when the loss's excess over the noise level, extrapolated as a
#: geometric decrease ``SPEEDUP`` times as fast as over the last ``LOOKBACK`` iterations, would
#: not fall to ``NEAR`` within the budget. Measured on the six paths of
#: ``python -m benchmarks converge`` (seed 0, 333-iteration budgets, loss traces read by hand):
#: the four that reach the level (at 41, 43, 246 and 269 iterations) are never given up (the
#: latest predicted arrival, ``t + need/SPEEDUP``, was 254; without the speed-up it was 348,
#: past the budget); Appendix C.4's paths at ε = 10 and 100, which do not reach it, are given
#: up at 118 and 113 iterations instead of 333.
LOOKBACK, SPEEDUP, NEAR = 25, 4.0, 0.01
#: Values of :attr:`RiskState.reason`: the path ran on, stopped at its least estimated risk,
#: reached the optimum (the ``tol`` rule), or spent its ``budget`` before the noise level.
RUNNING, RISK, OPTIMUM, BUDGET = 0, 1, 2, 3


class RiskState(NamedTuple):
    """Loop state of :func:`risk_path` (a pytree).

    Attributes
    ----------
    md : ProxPGMState
        The mirror-descent iterate.
    theta_dot, grad_dot : arrays ``(K, P)``
        Tangents of ``θ_t`` and of ``∇L`` at ``μ_t`` along each probe.
    answer_dot : tuple of arrays ``(K, T, k)``
        Tangents of the answers ``ŷ_t`` per loss group.
    weights : tuple of arrays ``(T, k)``
        The divergence weights ``w_i`` (1 until the discrepancy iterate).
    pilot : int
        The discrepancy iterate (``-1`` before it).
    df, risk : scalars
        ``df_t`` and ``R̂_t`` of the current iterate (``NaN`` risk before the pilot).
    best_theta, best_mu, best_log_z, best_loss, best_df, best_risk, best_t :
        The iterate of least ``R̂_t`` so far (the current one before the pilot).
    reason : int
        Why the path stopped: :data:`RUNNING` (it has not), :data:`RISK`, :data:`OPTIMUM` or
        :data:`BUDGET`; the iteration limit leaves it at :data:`RUNNING`.
    recent_loss : array ``(LOOKBACK,)``
        The loss of the last :data:`LOOKBACK` iterates, iteration ``t`` at ``t % LOOKBACK``.
    """

    md: ProxPGMState
    theta_dot: Array
    grad_dot: Array
    answer_dot: tuple[Array, ...]
    weights: tuple[Array, ...]
    pilot: Array
    df: Array
    risk: Array
    best_theta: Array
    best_mu: Array
    best_log_z: Array
    best_loss: Array
    best_df: Array
    best_risk: Array
    best_t: Array
    reason: Array
    recent_loss: Array


def _probes(rng_key: Any, groups: tuple[TermGroup, ...]) -> tuple[Array, ...]:
    """:data:`PROBES` Rademacher vectors over the answers, shaped ``(PROBES, T, k)`` per group."""
    sizes = [g.values.size for g in groups]
    flat = jax.random.rademacher(rng_key, (PROBES, sum(sizes)), dtype=groups[0].values.dtype)
    cuts = np.cumsum(sizes)[:-1].tolist()
    return tuple(part.reshape(PROBES, *g.values.shape)
                 for part, g in zip(jnp.split(flat, cuts, axis=1), groups, strict=True))


def _trial(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any, theta: Array,
           theta_dot: Array, probes: tuple[Array, ...], groups: tuple[TermGroup, ...],
           total: Array) -> tuple[tuple[Array, Array], Array, tuple[Array, ...]]:
    """The oracle at a trial ``θ`` and the tangents there along ``(θ̇_k, v_k)``, every probe.

    Returns ``(p, log Z)`` (computed once), the tangents of ``∇L(μ(θ); y)`` and those of the
    answers ``ŷ = Qμ(θ)``: one oracle JVP gives both the trial and its tangents.
    """
    def call(t: Array) -> tuple[Array, Array]:
        p, log_z, _ = apply_oracle(oracle, operands, t, oracle.init_state())
        return p, log_z

    primal, (p_dot, _) = jax.vmap(lambda td: jax.jvp(call, (theta,), (td,)),
                                  out_axes=((None, None), (0, 0)))(theta_dot)
    mu_dot = total * p_dot
    grad_dot = _grad_tangents(loss_fn, total * primal[0], mu_dot, probes, groups)
    answer_dot = jax.vmap(lambda md: group_answers(md, groups))(mu_dot)
    return primal, grad_dot, answer_dot


def _grad_tangents(loss_fn: MarginalLoss, mu: Array, mu_dot: Array, probes: tuple[Array, ...],
                   groups: tuple[TermGroup, ...]) -> Array:
    """Tangents of ``∇L(μ; y)`` along ``(μ̇_k, v_k)`` for every probe ``k``."""
    values = tuple(g.values for g in groups)
    zero = jnp.zeros((), mu.dtype)

    def grad_at(m: Array, vals: tuple[Array, ...]) -> Array:
        data = tuple(g._replace(values=v) for g, v in zip(groups, vals, strict=True))
        return jax.grad(loss_fn)(m, data, zero)

    return jax.vmap(lambda md, v: jax.jvp(grad_at, (mu, values), (md, v))[1])(mu_dot, probes)


def _divergence(answer_dot: tuple[Array, ...], probes: tuple[Array, ...],
                weights: tuple[Array, ...]) -> Array:
    """Hutchinson's ``mean_k Σ_i w_i v_{k,i} (J v_k)_i``."""
    per_probe = sum(jnp.sum(a * v * w, axis=(1, 2))
                    for a, v, w in zip(answer_dot, probes, weights, strict=True))
    return jnp.mean(per_probe)


def _laplace_weights(mu: Array, groups: tuple[TermGroup, ...]) -> tuple[Array, ...]:
    """``w_i = (|r_i|/b + 1)/2`` for Laplace answers (``r`` the residual at ``mu``), else 1."""
    out = []
    for g, pred in zip(groups, group_answers(mu, groups), strict=True):
        b = g.laplace_scale.astype(mu.dtype)
        lap = b > 0
        w = 0.5 * (jnp.abs(pred - g.values) / jnp.where(lap, b, 1.0) + 1.0)
        out.append(jnp.where(lap, w, 1.0))
    return tuple(out)


def _uniform(oracle: MarginalOracle, dtype: Any) -> tuple[Array, Array]:
    """The oracle's ``(p, log Z)`` at ``θ = 0`` in closed form: every clique table uniform,
    ``Z`` the number of cells of the domain (no junction tree to compile)."""
    net = oracle.network
    p = jnp.concatenate([jnp.full(size, 1.0 / size, dtype) for size in net.sizes])
    return p, jnp.asarray(sum(math.log(k) for k in net.domain.shape), dtype)


def _risk_init(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any, theta: Array,
               probes: tuple[Array, ...] | None, groups: tuple[TermGroup, ...], total: Array,
               alpha: Array, rng_key: Any, *, window: int,
               uniform: bool) -> tuple[RiskState, tuple[Array, ...]]:
    """The state at ``theta``: ``θ̇ = 0``, so ``ŷ̇ = 0`` and ``∇L̇ = ∂∇L/∂y·v`` (no oracle JVP),
    and the probes (drawn here from ``rng_key`` when ``probes`` is ``None``, in the same
    program). ``uniform``: ``theta`` is zero, whose marginals need no oracle call."""
    if probes is None:
        if not jax.dtypes.issubdtype(jnp.result_type(rng_key), jax.dtypes.prng_key):
            rng_key = jax.random.key(rng_key)
        probes = _probes(rng_key, groups)
    if uniform:
        p, log_z = _uniform(oracle, theta.dtype)
        ostate = oracle.init_state()
    else:
        p, log_z, ostate = apply_oracle(oracle, operands, theta, oracle.init_state())
    md = init_at(loss_fn, theta, p, log_z, ostate, groups, total, jnp.zeros((), theta.dtype),
                 alpha, window=window, auto_step=False)
    zero = jnp.zeros((), theta.dtype)
    still = jnp.zeros((probes[0].shape[0], *md.mu.shape), md.mu.dtype)  # θ̇ = 0: μ̇ = 0
    grad_dot = _grad_tangents(loss_fn, md.mu, still, probes, groups)
    answer_dot = tuple(jnp.zeros_like(v) for v in probes)
    weights = tuple(jnp.ones_like(g.values) for g in groups)
    nan = jnp.full((), jnp.nan, theta.dtype)
    state = RiskState(
        md=md, theta_dot=jnp.zeros((probes[0].shape[0], theta.shape[0]), theta.dtype),
        grad_dot=grad_dot,
        answer_dot=answer_dot, weights=weights, pilot=-jnp.ones((), jnp.int32), df=zero,
        risk=nan, best_theta=md.theta, best_mu=md.mu, best_log_z=md.log_z, best_loss=md.loss,
        best_df=zero, best_risk=nan, best_t=md.t, reason=jnp.full((), RUNNING, jnp.int32),
        recent_loss=jnp.full((LOOKBACK,), md.loss))
    return state, probes


_risk_init = jit_modes(_risk_init, static_argnames=("oracle", "loss_fn", "window", "uniform"))


def _out_of_reach(loss: Array, then: Array, level: Array, left: Array) -> Array:
    """Whether the excess ``L/level − 1`` stays above :data:`NEAR` for ``left`` more iterations
    even if it shrank geometrically :data:`SPEEDUP` times as fast as over the last
    :data:`LOOKBACK` (from ``then`` to ``loss``); a loss that did not fall is out of reach."""
    excess, before = loss / level - 1.0, then / level - 1.0
    shrink = jnp.log(jnp.maximum(excess, NEAR) / jnp.maximum(before, NEAR))  # < 0 when falling
    need = LOOKBACK * jnp.log(NEAR / jnp.maximum(excess, NEAR)) / jnp.minimum(shrink, -1e-300)
    return (excess > NEAR) & ((shrink >= 0) | (need / SPEEDUP > left))


def _risk_block(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any, state: RiskState,
                probes: tuple[Array, ...], groups: tuple[TermGroup, ...], total: Array,
                limit: Array, tol: Array, level: Array, num_answers: Array,
                budget: Array) -> tuple[RiskState, Array, Array]:
    """Up to :data:`BLOCK` iterations of the path with its risk estimate (see module notes).

    Returns the state, and the loss and ``R̂`` after each iteration (``NaN`` past the last).
    """
    window = state.md.recent.shape[0]
    first = state.md.t
    stop = jnp.minimum(limit, first + BLOCK)
    nan = jnp.full(BLOCK, jnp.nan, dtype=state.md.mu.dtype)

    def cond(carry: tuple[RiskState, Array, Array]) -> Array:
        return (carry[0].md.t < stop) & ~carry[0].md.converged

    def body(carry: tuple[RiskState, Array, Array]) -> tuple[RiskState, Array, Array]:
        r, trace, risk_trace = carry
        theta_new = r.md.theta - r.md.alpha * r.md.grad
        theta_dot_new = r.theta_dot - r.md.alpha * r.grad_dot
        (p_new, log_z_new), grad_dot_new, answer_dot_new = _trial(
            oracle, loss_fn, operands, theta_new, theta_dot_new, probes, groups, total)
        s = md_trial(oracle, loss_fn, r.md, theta_new, p_new, log_z_new, r.md.oracle_state,
                     groups, total)
        accepted = s.rejected == r.md.rejected
        theta_dot, grad_dot, answer_dot = where_tree(
            accepted, (theta_dot_new, grad_dot_new, answer_dot_new),
            (r.theta_dot, r.grad_dot, r.answer_dot))
        t = s.t + 1
        becomes_pilot = (r.pilot < 0) & (s.objective <= level)
        weights = jax.lax.cond(becomes_pilot, lambda: _laplace_weights(s.mu, groups),
                               lambda: r.weights)
        pilot = jnp.where(becomes_pilot, t, r.pilot)
        df = _divergence(answer_dot, probes, weights)
        risk = jnp.where(pilot >= 0, 2.0 * s.objective - num_answers + 2.0 * df, jnp.nan)
        better = (pilot < 0) | ~(risk >= r.best_risk)  # the best risk is NaN at the pilot
        best = where_tree(better, (s.theta, s.mu, s.log_z, s.objective, df, risk, t),
                          (r.best_theta, r.best_mu, r.best_log_z, r.best_loss, r.best_df,
                      r.best_risk, r.best_t))
        past = s.recent[t % window]
        optimum = (t >= window) & (past - s.objective <= tol * jnp.maximum(1.0, s.objective))
        patience = jnp.maximum(PATIENCE, PATIENCE_SHARE * (best[6] - pilot))
        waited = (pilot >= 0) & (t - best[6] >= patience)
        then = r.recent_loss[t % LOOKBACK]  # the loss LOOKBACK iterations ago
        spent = (pilot < 0) & (budget >= 0) & (
            (t >= budget) | ((t >= LOOKBACK) & _out_of_reach(s.objective, then, level, budget - t)))
        reason = jnp.select([waited, optimum, spent], [RISK, OPTIMUM, BUDGET],
                            RUNNING).astype(jnp.int32)
        # ``converged`` stays a strong bool, so the next block's call has this one's signature
        s = s._replace(t=t, loss=s.objective, converged=waited | optimum | spent,
                       recent=s.recent.at[t % window].set(s.objective))
        r = RiskState(s, theta_dot, grad_dot, answer_dot, weights, pilot, df, risk, *best,
                      reason, r.recent_loss.at[t % LOOKBACK].set(s.objective))
        i = t - first - 1
        return r, trace.at[i].set(s.objective), risk_trace.at[i].set(risk)

    return jax.lax.while_loop(cond, body, (state, nan, nan))


_risk_block = jit_modes(_risk_block, static_argnames=("oracle", "loss_fn"))


def risk_path(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    theta: Array,
    groups: tuple[TermGroup, ...],
    total: float,
    *,
    iters: int,
    alpha: float,
    tol: float,
    window: int,
    level: float,
    budget: int | None = None,
    rng_key: Any = None,
    probes: tuple[Array, ...] | None = None,
    callback: Any = None,
    callback_every: int = 100,
    compile_mode: str = "optimized",
) -> tuple[RiskState, np.ndarray, np.ndarray]:
    """Mirror descent from ``theta`` with the risk estimate of every iterate (module notes).

    Parameters
    ----------
    oracle : MarginalOracle
        An oracle whose marginals depend on ``θ`` alone (the exact junction tree).
    loss_fn : MarginalLoss
        The L2 loss of the measurement groups ``groups``.
    theta : array ``(num_params,)``
        Start point (``0``: the maximum-entropy point).
    groups : tuple of TermGroup
        The measurements (:func:`~numpyro_dpgm.estimation.losses.group_terms`, L2 terms).
    total : float
        The record count ``N``.
    iters : int
        Maximum number of iterations.
    alpha : float
        Initial step size (Armijo steps follow, as in ``method="md"``).
    tol, window : float, int
        The ``tol`` rule: stop at the optimum.
    level : float
        The discrepancy level ``m/2`` (the pilot iterate is the first with ``L ≤ level``).
    budget : int, optional
        Stop (``reason`` :data:`BUDGET`) when no iterate has reached ``level`` after this many
        iterations, or sooner where the loss falls too slowly to reach it by then (module
        notes); ``None``: no such limit.
    rng_key : JAX PRNG key or int, optional
        Draws the Rademacher probes (an int is a seed); default ``jax.random.key(0)``.
    probes : tuple of arrays ``(K, T, k)``, optional
        ``K`` probe vectors ``v_k`` per group instead of :data:`PROBES` Rademacher draws (any
        ``v`` with ``E[v vᵀ] = I`` gives an unbiased divergence; ``√m`` times the ``m`` unit
        vectors of the ``m`` answers give it exactly).
    callback, callback_every, compile_mode :
        As for :func:`~numpyro_dpgm.estimation.mirror_descent.mirror_descent`.

    Returns
    -------
    state : RiskState
        The final state; ``best_*`` is the fit.
    trace, risk_trace : numpy arrays ``(t + 1,)``
        The loss and ``R̂_t`` after ``0..t`` iterations (``NaN`` before the pilot).
    """
    dtype = theta.dtype
    total_arr = jnp.asarray(total, dtype)
    operands = oracle_operands(oracle)
    if probes is not None:
        rng_key = None
    elif rng_key is None or isinstance(rng_key, int | np.integer):
        rng_key = 0 if rng_key is None else int(rng_key)  # the key is made in _risk_init
    state, probes = _risk_init(
        oracle, loss_fn, operands, theta, probes, groups, total_arr, jnp.asarray(alpha, dtype),
        rng_key, window=int(window),
        uniform=isinstance(oracle, ExactOracle) and not np.any(np.asarray(theta)),
        compile_mode=compile_mode)
    num_answers = jnp.asarray(float(sum(g.values.size for g in groups)), dtype)
    block = partial(_risk_block, oracle, loss_fn, operands, probes=probes, groups=groups,
                    total=total_arr, tol=jnp.asarray(float(tol), dtype),
                    level=jnp.asarray(float(level), dtype), num_answers=num_answers,
                    budget=jnp.asarray(-1 if budget is None else int(budget)),
                    compile_mode=compile_mode)
    state, (trace, risk_trace) = run_blocks(
        lambda s, limit: block(s, limit=limit), state, (state.md.loss, jnp.nan),
        lambda s: s.md, iters=iters, callback=callback, callback_every=callback_every)
    return state, trace, risk_trace
