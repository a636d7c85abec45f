"""The mirror-descent loop of Prox-PGM: its state, its objective and its compiled iterations.

Entropic mirror descent in natural-parameter space, ``θ ← θ − α∇L(μ(θ))`` (seed 003,
Algorithm 1), with Private-PGM's Armijo step sizes and, for L1 terms, Huber smoothing by
continuation; :mod:`numpyro_dpgm.estimation.prox_pgm` sets out the rules and builds the inputs.
The marginal oracle (:class:`~numpyro_dpgm.inference.oracles.MarginalOracle`) and the objective
(:class:`MarginalLoss`) are static data of one compiled program; :func:`mirror_descent` runs it,
in blocks between progress callbacks, and returns the final :class:`ProxPGMState`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..inference.oracles import MarginalOracle
from ..network import MarkovNetwork
from ..tables import CliqueTables
from .losses import LossTerm, terms_loss

__all__ = ["ARMIJO_C", "MarginalLoss", "ProxPGMState", "mirror_descent"]

Array = Any

#: Sufficient-decrease constant of the Armijo test ``L(μ) − L(μ') ≥ c·⟨∇L(μ), μ − μ'⟩``.
ARMIJO_C = 0.5
#: Step-size growth after an accepted step and shrink factor after a rejected one.
_GROW, _SHRINK = 1.01, 0.5


class ProxPGMState(NamedTuple):
    """Loop state of :func:`prox_pgm` (a pytree).

    Attributes
    ----------
    theta : array ``(num_params,)``
        Current log-potentials.
    mu : array ``(num_params,)``
        Count-scale (pseudo-)marginals ``N·μ(θ)`` of the network's cliques.
    log_z : scalar
        Log-partition function at ``theta`` (as given by the oracle).
    objective, grad :
        The loss being minimised (L1 terms smoothed at level ``smooth``) and its gradient.
    loss : scalar
        The exact loss ``L(mu)``.
    alpha, initial_alpha : scalars
        Current and initial step size.
    smooth : scalar
        Huber smoothing level of the L1 terms (``δ_M = smooth·b_M``; 0 without L1 terms).
    stage_start : int
        Iteration at which ``smooth`` last changed.
    oracle_state : pytree
        The oracle's warm-start state matching ``theta``.
    t : int
        Iterations done.
    rejected : int
        Rejected trial steps so far.
    trace, objective_trace : arrays ``(iters + 1,)``
        ``loss`` and ``objective`` after ``0..t`` iterations (NaN beyond ``t``).
    converged : bool
        Whether the stopping rule has fired.
    """

    theta: Array
    mu: Array
    log_z: Array
    objective: Array
    grad: Array
    loss: Array
    alpha: Array
    initial_alpha: Array
    smooth: Array
    stage_start: Array
    oracle_state: Any
    t: Array
    rejected: Array
    trace: Array
    objective_trace: Array
    converged: Array


@dataclasses.dataclass(frozen=True)
class MarginalLoss:
    """The objective as a function of flat count-scale marginals (hashable: static under jit)."""

    network: MarkovNetwork
    terms: tuple[LossTerm, ...]
    custom: Callable[[CliqueTables], Array] | None = None

    def __call__(self, mu: Array, data: Any, smooth: Array) -> Array:
        if self.custom is None:
            return terms_loss(self.network, self.terms, mu, data, smooth)
        return jnp.asarray(self.custom(self.network.unflatten(mu)))


#: Smoothing level of the L1 terms at the start (``δ_M = b_M``), its reduction factor per stage,
#: and the fraction of the smoothing gap below which a stage counts as solved.
_SMOOTH0, _SMOOTH_SHRINK, _STAGE_FRACTION = 1.0, 0.5, 1e-6


def _init_state(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    theta: Array,
    oracle_state: Any,
    data: Any,
    total: Array,
    smooth: Array,
    trace: Array,
) -> ProxPGMState:
    """The state at ``theta`` (one oracle call); ``alpha`` is set by the caller."""
    p, log_z, oracle_state = oracle(theta, oracle_state)
    mu = total * p
    objective, grad = jax.value_and_grad(loss_fn)(mu, data, smooth)
    loss = loss_fn(mu, data, jnp.zeros_like(smooth))
    zero = jnp.zeros((), dtype=jnp.int32)
    return ProxPGMState(
        theta=theta, mu=mu, log_z=log_z, objective=objective, grad=grad, loss=loss,
        alpha=jnp.ones_like(smooth), initial_alpha=jnp.ones_like(smooth), smooth=smooth,
        stage_start=zero, oracle_state=oracle_state,
        t=zero, rejected=zero, trace=trace.at[0].set(loss),
        objective_trace=trace.at[0].set(objective), converged=jnp.zeros((), dtype=bool),
    )


def _loop(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    state: ProxPGMState,
    data: Any,
    total: Array,
    limit: Array,
    tol: Array,
    window: int,
    num_l1: int,
) -> ProxPGMState:
    """Mirror-descent iterations with Armijo backtracking until ``t == limit`` or convergence.

    One iteration: trial ``θ' = θ − α∇``, one oracle call, accept if
    ``f(μ) − f(μ') ≥ c·⟨∇f(μ), μ − μ'⟩`` (then ``α ← 1.01α``), else keep ``θ`` and halve ``α``.
    A stage (fixed smoothing level) ends when ``f`` decreased by at most ``thr`` over ``window``
    iterations; ``thr = tol·max(1, |f|)``, raised to a fraction of the smoothing gap
    ``smooth·num_l1/2`` while that gap is not yet below ``tol·max(1, |L|)``; then the level is
    halved (so is ``α``, the curvature doubling), or, at the last level, the loop stops.
    """

    def cond(s: ProxPGMState) -> Array:
        return (s.t < limit) & ~s.converged

    def body(s: ProxPGMState) -> ProxPGMState:
        theta_new = s.theta - s.alpha * s.grad
        p_new, log_z_new, ostate_new = oracle(theta_new, s.oracle_state)
        mu_new = total * p_new
        obj_new, grad_new = jax.value_and_grad(loss_fn)(mu_new, data, s.smooth)
        predicted = jnp.vdot(s.grad, s.mu - mu_new)  # ≥ 0: ∇A is monotone
        accept = (
            jnp.isfinite(obj_new)
            & (obj_new <= s.objective)
            & (s.objective - obj_new >= ARMIJO_C * predicted)
        )

        def pick(new: Any, old: Any) -> Any:
            return jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)

        theta, mu, log_z, ostate = pick(
            (theta_new, mu_new, log_z_new, ostate_new), (s.theta, s.mu, s.log_z, s.oracle_state)
        )
        objective = jnp.where(accept, obj_new, s.objective)
        grad = pick(grad_new, s.grad)
        alpha = jnp.where(accept, _GROW * s.alpha, _SHRINK * s.alpha)
        t = s.t + 1
        obj_trace = s.objective_trace.at[t].set(objective)
        past = obj_trace[jnp.maximum(t - window, s.stage_start)]
        if num_l1 == 0:  # smooth objective: it is the loss, no continuation
            loss = objective
            stalled = (t - s.stage_start >= window) & (
                past - objective <= tol * jnp.maximum(1.0, jnp.abs(objective)))
            final, switch, smooth = jnp.ones((), dtype=bool), jnp.zeros((), dtype=bool), s.smooth
        else:
            loss = jnp.where(accept, loss_fn(mu_new, data, jnp.zeros_like(s.smooth)), s.loss)
            scale = jnp.maximum(1.0, jnp.abs(loss))
            gap = 0.5 * s.smooth * num_l1
            final = gap <= tol * scale
            thr = jnp.where(final, tol * jnp.maximum(1.0, jnp.abs(objective)),
                            jnp.maximum(tol * scale, _STAGE_FRACTION * gap))
            stalled = (t - s.stage_start >= window) & (past - objective <= thr)
            switch = stalled & ~final
            smooth = jnp.where(switch, _SMOOTH_SHRINK * s.smooth, s.smooth)
            obj_sw, grad_sw = jax.value_and_grad(loss_fn)(mu, data, smooth)
            objective = jnp.where(switch, obj_sw, objective)
            grad = jnp.where(switch, grad_sw, grad)
            alpha = jnp.where(switch, _SMOOTH_SHRINK * alpha, alpha)
        return ProxPGMState(
            theta=theta,
            mu=mu,
            log_z=log_z,
            objective=objective,
            grad=grad,
            loss=loss,
            alpha=alpha,
            initial_alpha=s.initial_alpha,
            smooth=smooth,
            stage_start=jnp.where(switch, t, s.stage_start),
            oracle_state=ostate,
            t=t,
            rejected=s.rejected + (~accept).astype(s.rejected.dtype),
            trace=s.trace.at[t].set(loss),
            objective_trace=obj_trace.at[t].set(objective),
            converged=stalled & final,
        )

    return jax.lax.while_loop(cond, body, state)


def _buffer_length(iters: int) -> int:
    """Length of the trace buffers: ``iters + 1`` rounded up to a power of two (at least 64),
    so that calls with nearby iteration limits share one compiled program."""
    return max(64, 1 << int(iters).bit_length())


def _initial_step(loss_fn: MarginalLoss, state: ProxPGMState, data: Any, total: Array) -> Array:
    """``2/(λ·N)`` with ``λ`` the largest Hessian eigenvalue of the loss at the start.

    Power iteration (30 Hessian-vector products by forward-over-reverse autodiff). For a loss
    with no curvature there, ``1/(N·max|∇L|)`` (a first step that moves ``θ`` by at most 1).
    """
    zero = jnp.zeros((), dtype=state.mu.dtype)

    def hvp(v: Array) -> Array:
        return jax.jvp(lambda m: jax.grad(loss_fn)(m, data, zero), (state.mu,), (v,))[1]

    def power(_: int, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        v, _est = carry
        hv = hvp(v)
        est = jnp.linalg.norm(hv)
        return jnp.where(est > 0, hv / est, v), est

    v0 = jnp.ones_like(state.mu) / math.sqrt(state.mu.size)
    _, curv = jax.lax.fori_loop(0, 30, power, (v0, zero))
    flat = 1.0 / (total * jnp.maximum(jnp.max(jnp.abs(state.grad)), 1e-300))
    ok = jnp.isfinite(curv) & (curv > 0)
    return jnp.where(ok, 2.0 / (jnp.where(ok, curv, 1.0) * total), flat)


@partial(jax.jit, static_argnames=("oracle", "loss_fn", "window", "num_l1", "auto_step"))
def _start(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    theta: Array,
    oracle_state: Any,
    data: Any,
    total: Array,
    smooth: Array,
    alpha: Array,
    trace: Array,
    limit: Array,
    tol: Array,
    window: int,
    num_l1: int,
    auto_step: bool,
) -> ProxPGMState:
    """Initial state at ``theta`` and the first ``limit`` iterations (one compiled program)."""
    state = _init_state(oracle, loss_fn, theta, oracle_state, data, total, smooth, trace)
    if auto_step:
        alpha = _initial_step(loss_fn, state, data, total)
    state = state._replace(alpha=alpha, initial_alpha=alpha)
    return _loop(oracle, loss_fn, state, data, total, limit, tol, window, num_l1)


@partial(jax.jit, static_argnames=("oracle", "loss_fn", "window", "num_l1"))
def _resume(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    state: ProxPGMState,
    data: Any,
    total: Array,
    limit: Array,
    tol: Array,
    window: int,
    num_l1: int,
) -> ProxPGMState:
    """Continue the iterations of ``state`` until ``t == limit`` or convergence."""
    return _loop(oracle, loss_fn, state, data, total, limit, tol, window, num_l1)


def mirror_descent(
    oracle: MarginalOracle,
    loss_fn: MarginalLoss,
    theta: Array,
    data: Any,
    total: float,
    *,
    iters: int,
    alpha: float | None,
    num_l1: int,
    tol: float,
    window: int,
    callback: Callable[[int, float], None] | None = None,
    callback_every: int = 100,
) -> ProxPGMState:
    """Mirror descent from ``theta`` until ``iters`` iterations or the stopping rule.

    Parameters
    ----------
    oracle : MarginalOracle
        The marginal oracle, bound to ``loss_fn.network``; started from its ``init_state()``.
    loss_fn : MarginalLoss
        The objective of the count-scale marginals.
    theta : array ``(num_params,)``
        Start point (log-potentials); its dtype is the dtype of the whole loop.
    data : pytree
        The measurements' data of ``loss_fn`` (``()`` for a custom loss).
    total : float
        The record count ``N`` (the marginals are ``N·μ(θ)``).
    iters : int
        Maximum number of iterations (each one oracle call).
    alpha : float or None
        Initial step size; ``None`` takes ``2/(λ·N)`` with ``λ`` the largest Hessian eigenvalue
        of the loss at the start.
    num_l1 : int
        Number of L1 answers (0: no smoothing, a single stage).
    tol : float
        A stage ends when the objective decreased by at most ``tol·max(1, |f|)`` over the last
        ``window`` iterations (raised while the L1 smoothing gap is still above it); the loop
        stops at the end of the last stage.
    window : int
        Number of iterations the stopping rule looks back over.
    callback : callable ``(iteration, loss) -> None``, optional
        Called at the start, every ``callback_every`` iterations and at the end.
    callback_every : int
        Iterations between two calls of ``callback`` (the compiled loop runs in such blocks).

    Returns
    -------
    ProxPGMState
        The state after the last iteration.
    """
    dtype = theta.dtype
    block = iters if callback is None else int(callback_every)
    static = {"oracle": oracle, "loss_fn": loss_fn, "window": int(window), "num_l1": num_l1}
    total_arr, tol_arr = jnp.asarray(total, dtype), jnp.asarray(float(tol), dtype)
    state = _start(
        theta=theta, oracle_state=oracle.init_state(), data=data, total=total_arr,
        smooth=jnp.asarray(_SMOOTH0 if num_l1 else 0.0, dtype),
        alpha=jnp.asarray(0.0 if alpha is None else alpha, dtype),
        trace=jnp.full(_buffer_length(iters), jnp.nan, dtype),
        limit=jnp.asarray(min(iters, block)), tol=tol_arr, auto_step=alpha is None, **static,
    )
    while True:
        done = int(state.t)
        if callback is not None:
            callback(done, float(state.loss))
        if done >= iters or bool(state.converged):
            return state
        state = _resume(state=state, data=data, total=total_arr,
                        limit=jnp.asarray(min(iters, done + block)), tol=tol_arr, **static)
