"""The iterations of Prox-PGM: entropic mirror descent and its accelerated form, compiled once.

Both minimise a convex loss ``L`` of the count-scale marginals over ``N·M`` through the marginal
oracle ``u ↦ N·μ(u)`` (seed 003, Problem 1); :mod:`numpyro_dpgm.estimation.prox_pgm` sets out
the rules and builds the inputs.

* ``"md"``: Algorithm 1 of seed 003, ``θ ← θ − α∇L(μ(θ))``, with Armijo step sizes (accept
  when ``f(μ) − f(μ') ≥ c·⟨∇f(μ), μ − μ'⟩``, then ``α ← 1.1α``; else halve ``α``). Private-PGM
  grows ``α`` by 1.01, which takes 70 accepted steps to double a step once halved; with 1.1 (the
  accelerated method's growth) the mirror-descent path from the uniform distribution reaches
  the noise level in 40–60 % of the iterations (``python -m benchmarks stopping --releases
  50``, benchmarks/results/stopping-grow-cpu.json against stopping-grow-before-cpu.json, the
  same code but this constant: 2.4 → 2.3, 250 → 98, 1,810 → 1,517 and 83 → 32 iterations) and
  the fits of
  ``stop="risk"`` and ``stop="discrepancy"`` on it are as accurate or more (risk: mean L1
  0.1792 → 0.1749, 0.04605 → 0.04606, 0.00320 → 0.00318, 0.06883 → 0.06885, standard errors
  0.0005, 0.0004, 0.00003, 0.0004). With an oracle that carries a warm-started state (APPGM: a
  few Convex-GBP sweeps per call) every finite trial is taken and a failed test only halves
  ``α``, so the messages keep advancing (seed 003's APPGM takes every step, with a fixed
  ``α``); there ``α`` grows by Private-PGM's 1.01, so that the steps do not outrun the
  messages.
* ``"accelerated"``: Tseng's accelerated Bregman gradient method (the "universal" form with a
  line search, Nesterov 2015; mbi's ``UniversalAcceleratedMethod`` is the same family) with the
  mirror map of the marginal polytope, ``h(μ) = N·A*(μ/N)``: with ``a`` the momentum weight,

  .. math:: y = (1−a)x + a z,\\quad u ← u − (α/a)∇L(y),\\quad z = N·μ(u),\\quad
     \\hat x = (1−a)x + a z,

  a trial is accepted when ``L(x̂) ≤ L(y) + ⟨∇L(y), x̂ − y⟩ + (a²/α)·D_h(z, z_prev)``, the
  inequality the O(1/k²) proof needs (Hanzely, Richtárik & Xiao 2021, "triangle scaling"
  exponent 2); ``D_h(z, z') = N·KL(p_u ‖ p_u')`` is exact from the oracle's ``log Z``. ``α``
  grows by 1.1 after an acceptance and halves after a rejection, and ``a`` solves
  ``a²/α = (1 − a)a_prev²/α_prev``. ``x`` is the best of ``x̂``, ``z`` and the previous ``x``
  (monotone, as in Beck & Teboulle's MFISTA); when neither new point improves on ``x`` the
  momentum restarts (``a = 1``; O'Donoghue & Candès' function restart), which makes the method
  linearly convergent where ``L`` is strongly convex on the polytope. ``x`` is a convex
  combination of marginals, not a model's, so the fit returned is the best oracle point ``z``
  (its ``u`` is the model); the rule stops only when that point is as good as ``x`` too.

With L1 terms the objective is their Huber smoothing, by continuation (see prox_pgm). Stopping
rule: a stage ends when the monitored objective (``md``: the iterate's, or the best so far with
a warm-started oracle; ``accelerated``: ``x``'s) decreased by at most ``tol·max(1, |f|)`` over
the last ``window`` iterations.

One compiled program per structure: the oracle, the loss terms' kinds, ``window``, ``num_l1``
and the method are static; values, totals, starting points, iteration limits and tolerances
are traced, and so are the loss's stacked index arrays and the oracle's array operands
(:func:`~numpyro_dpgm.oracles.protocol.oracle_operands`: Convex-GBP's index tables), which are
thus data of the program, not constants compiled into it. The loop runs in blocks of
:data:`BLOCK` iterations (fixed trace buffers), so the iteration limit never changes a shape.
Where the oracle has no start on the host (a factored junction tree, an approximate oracle),
the loop's first iteration makes the start from the oracle at ``θ₀`` (:func:`_unstarted`), so
the oracle is compiled once, in the loop, and a fit compiles one program.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import device_array, jit_modes
from ..network import MarkovNetwork
from ..oracles.protocol import ExactOracle, MarginalOracle, apply_oracle, oracle_operands
from ..tables import CliqueTables
from .losses import grouped_loss

__all__ = ["ARMIJO_C", "BLOCK", "METHODS", "MarginalLoss", "ProxPGMState", "mirror_descent",
           "run_blocks"]

Array = Any

#: Sufficient-decrease constant of the Armijo test ``L(μ) − L(μ') ≥ c·⟨∇L(μ), μ − μ'⟩``.
ARMIJO_C = 0.5
#: Step-size growth after an accepted step (mirror descent and the accelerated method; mirror
#: descent with a warm-started oracle, Private-PGM's) and the shrink factor (module notes).
_GROW, _GROW_WARM, _SHRINK = 1.1, 1.01, 0.5
#: Iterations per compiled block (the length of its trace buffers).
BLOCK = 256
#: The iteration schemes.
METHODS = ("accelerated", "md")
#: Smoothing level of the L1 terms at the start (``δ_M = b_M``), its reduction factor per stage,
#: and the fraction of the smoothing gap below which a stage counts as solved.
_SMOOTH0, _SMOOTH_SHRINK, _STAGE_FRACTION = 1.0, 0.5, 1e-6


class ProxPGMState(NamedTuple):
    """Loop state of :func:`prox_pgm` (a pytree).

    Attributes
    ----------
    theta, mu, log_z, oracle_state :
        The fit: log-potentials, their count-scale (pseudo-)marginals ``N·μ(θ)``, log-partition
        and oracle state (``md``: the iterate; ``accelerated``: the best oracle point so far).
    objective, loss :
        The objective being minimised (L1 terms smoothed at level ``smooth``) and the exact
        loss at ``mu``.
    grad :
        ``md``: the objective's gradient at ``mu``.
    alpha, alpha_prev, initial_alpha : scalars
        Current, previous accepted and initial step size.
    smooth : scalar
        Huber smoothing level of the L1 terms (``δ_M = smooth·b_M``; 0 without L1 terms).
    stage_start : int
        Iteration at which ``smooth`` last changed.
    u, z, z_log_z, z_state :
        ``accelerated``: the current oracle point (log-potentials, marginals, log Z, state).
    x, fx :
        ``accelerated``: the averaged point and its objective (``md``: unused).
    momentum : scalar
        ``accelerated``: the previous weight ``a`` (negative: restart).
    recent : array ``(window,)``
        The monitored objective over the last ``window`` iterations (a ring).
    t, rejected, restarts : int
        Iterations (oracle calls) done, rejected trials, momentum restarts.
    converged : bool
        Whether the stopping rule has fired.
    """

    theta: Array
    mu: Array
    log_z: Array
    oracle_state: Any
    objective: Array
    loss: Array
    grad: Array
    alpha: Array
    alpha_prev: Array
    initial_alpha: Array
    smooth: Array
    stage_start: Array
    u: Array
    z: Array
    z_log_z: Array
    z_state: Any
    x: Array
    fx: Array
    momentum: Array
    recent: Array
    t: Array
    rejected: Array
    restarts: Array
    converged: Array


@dataclasses.dataclass(frozen=True)
class MarginalLoss:
    """The objective as a function of flat count-scale marginals (hashable: static under jit).

    Either the measurements' loss, from the groups of
    :func:`~numpyro_dpgm.estimation.losses.group_terms` (``kinds`` static, the groups are the
    ``data``), or ``custom`` of the network's tables (``data`` unused). The static part names
    no clique, so the loss of other measurements with groups of the same shapes compiles once.
    """

    kinds: tuple[str, ...] = ()
    network: MarkovNetwork | None = None
    custom: Callable[[CliqueTables], Array] | None = None

    def __call__(self, mu: Array, data: Any, smooth: Array) -> Array:
        if self.custom is None:
            return grouped_loss(self.kinds, mu, data, smooth)
        return jnp.asarray(self.custom(self.network.unflatten(mu)))


def _initial_step(loss_fn: MarginalLoss, mu: Array, grad: Array, data: Any,
                  total: Array) -> Array:
    """``2/(λ·N)`` with ``λ`` the largest Hessian eigenvalue of the loss at ``mu``.

    Power iteration (30 Hessian-vector products by forward-over-reverse autodiff). For a loss
    with no curvature there, ``1/(N·max|∇L|)`` (a first step that moves ``θ`` by at most 1).
    """
    zero = jnp.zeros((), dtype=mu.dtype)

    def hvp(v: Array) -> Array:
        return jax.jvp(lambda m: jax.grad(loss_fn)(m, data, zero), (mu,), (v,))[1]

    def power(_: int, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        v, _est = carry
        hv = hvp(v)
        est = jnp.linalg.norm(hv)
        return jnp.where(est > 0, hv / est, v), est

    v0 = jnp.ones_like(mu) / math.sqrt(mu.size)
    _, curv = jax.lax.fori_loop(0, 30, power, (v0, zero))
    flat = 1.0 / (total * jnp.maximum(jnp.max(jnp.abs(grad)), 1e-300))
    ok = jnp.isfinite(curv) & (curv > 0)
    return jnp.where(ok, 2.0 / (jnp.where(ok, curv, 1.0) * total), flat)


def _unstarted(oracle: MarginalOracle, theta: Array, smooth: Array, alpha: Array,
               window: int) -> ProxPGMState:
    """A state at ``theta`` whose oracle output is not known yet (``t = -1``).

    The first iteration of :func:`_block` on it calls the oracle at ``theta`` and makes the
    state there (:func:`init_at`), through the loop's own oracle call: the start compiles no
    program of its own (the oracle's program is most of a fit's compiling; a second one cost
    AIM's rounds 1.5–2 s each). The placeholders have the types :func:`init_at` gives.
    """
    dtype = np.dtype(theta.dtype)
    # from host arrays: an eager jnp operation would compile a small program per shape
    zeros = device_array(np.zeros(theta.shape, dtype))
    scalar = device_array(np.zeros((), dtype))
    count = device_array(np.zeros((), np.int32))
    ostate = oracle.init_state()
    return ProxPGMState(
        theta=theta, mu=zeros, log_z=scalar, oracle_state=ostate, objective=scalar,
        loss=scalar, grad=zeros, alpha=alpha, alpha_prev=alpha, initial_alpha=alpha,
        smooth=smooth, stage_start=count, u=theta, z=zeros, z_log_z=scalar, z_state=ostate,
        x=zeros, fx=scalar, momentum=device_array(np.full((), -1.0, dtype)),
        recent=device_array(np.zeros(window, dtype)),
        t=device_array(np.full((), -1, np.int32)), rejected=count, restarts=count,
        converged=device_array(np.zeros((), bool)))


def init_at(loss_fn: MarginalLoss, theta: Array, p: Array, log_z: Array, ostate: Any,
            data: Any, total: Array, smooth: Array, alpha: Array, *, window: int,
            auto_step: bool) -> ProxPGMState:
    """The state at ``theta`` whose oracle output ``(p, log Z, state)`` is given."""
    mu = total * p
    objective, grad = jax.value_and_grad(loss_fn)(mu, data, smooth)
    loss = loss_fn(mu, data, jnp.zeros_like(smooth))
    if auto_step:
        alpha = _initial_step(loss_fn, mu, grad, data, total)
    zero = jnp.zeros((), dtype=jnp.int32)
    return ProxPGMState(
        theta=theta, mu=mu, log_z=log_z, oracle_state=ostate, objective=objective, loss=loss,
        grad=grad, alpha=alpha, alpha_prev=alpha, initial_alpha=alpha, smooth=smooth,
        stage_start=zero, u=theta, z=mu, z_log_z=log_z, z_state=ostate, x=mu, fx=objective,
        momentum=-jnp.ones_like(alpha), recent=jnp.full(window, objective), t=zero,
        rejected=zero, restarts=zero, converged=jnp.zeros((), dtype=bool),
    )


_init_at = jit_modes(init_at, static_argnames=("loss_fn", "window", "auto_step"))


def where_tree(flag: Array, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)


def _warm_marginals(oracle: MarginalOracle) -> bool:
    """Whether the oracle's marginals depend on the state it starts from, not on ``θ`` alone
    (its ``stateful_marginals`` attribute; Convex-GBP's few warm-started sweeps)."""
    return bool(getattr(oracle, "stateful_marginals", False))


def _md_step(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any, s: ProxPGMState,
             data: Any, total: Array, start: Any) -> ProxPGMState:
    """One mirror-descent trial with the Armijo test (one oracle call; :func:`md_trial`), or,
    on an unstarted state, the state at its ``θ`` (``start``: :func:`init_at` there)."""
    fresh = s.t < 0
    theta_new = jnp.where(fresh, s.theta, s.theta - s.alpha * s.grad)
    p_new, log_z_new, ostate_new = apply_oracle(oracle, operands, theta_new, s.oracle_state)
    return jax.lax.cond(
        fresh, lambda: start(s, p_new, log_z_new, ostate_new),
        lambda: md_trial(oracle, loss_fn, s, theta_new, p_new, log_z_new, ostate_new, data,
                         total))


def md_trial(oracle: MarginalOracle, loss_fn: MarginalLoss, s: ProxPGMState, theta_new: Array,
             p_new: Array, log_z_new: Array, ostate_new: Any, data: Any,
             total: Array) -> ProxPGMState:
    """The Armijo test of the trial ``θ' = θ − α∇L`` whose oracle output is ``p_new`` etc.

    A trial that fails the test is rejected and halves ``α``. With an oracle whose marginals
    depend on its warm-started state (a few Convex-GBP sweeps per call) a finite trial is taken
    even then, with ``α`` halved: rejecting it would rerun the same sweeps from the same
    messages, so once one trial failed every later one would fail too and the fit would stall
    (as it did at 10⁴ cliques, one sweep per call, after a single step). The monitored
    objective is then the best one so far. ``rejected`` counts the failed tests.
    """
    mu_new = total * p_new
    obj_new, grad_new = jax.value_and_grad(loss_fn)(mu_new, data, s.smooth)
    predicted = jnp.vdot(s.grad, s.mu - mu_new)  # ≥ 0: ∇A is monotone
    accept = (jnp.isfinite(obj_new) & (obj_new <= s.objective)
              & (s.objective - obj_new >= ARMIJO_C * predicted))
    warm = _warm_marginals(oracle)
    move = accept | jnp.isfinite(obj_new) if warm else accept
    theta, mu, log_z, ostate, objective, grad = where_tree(
        move, (theta_new, mu_new, log_z_new, ostate_new, obj_new, grad_new),
        (s.theta, s.mu, s.log_z, s.oracle_state, s.objective, s.grad))
    return s._replace(
        theta=theta, mu=mu, log_z=log_z, oracle_state=ostate, objective=objective, grad=grad,
        alpha=jnp.where(accept, (_GROW_WARM if warm else _GROW) * s.alpha,
                        _SHRINK * s.alpha),
        rejected=s.rejected + (~accept).astype(s.rejected.dtype),
        fx=jnp.minimum(s.fx, objective) if warm else objective,
    )


def _accelerated_step(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any,
                      s: ProxPGMState, data: Any, total: Array, start: Any) -> ProxPGMState:
    """One trial of the accelerated Bregman method with its line search (one oracle call), or,
    on an unstarted state, the state at its ``θ`` (``start``: :func:`init_at` there)."""
    fresh = s.t < 0
    ratio = s.alpha_prev / (s.alpha * jnp.maximum(s.momentum, 1e-300) ** 2)
    a = jnp.where(s.momentum < 0, 1.0, 2.0 / (1.0 + jnp.sqrt(1.0 + 4.0 * ratio)))
    y = (1.0 - a) * s.x + a * s.z
    fy, g = jax.value_and_grad(loss_fn)(y, data, s.smooth)
    u_new = jnp.where(fresh, s.u, s.u - (s.alpha / a) * g)
    p_new, lz_new, zstate_new = apply_oracle(oracle, operands, u_new, s.z_state)
    return jax.lax.cond(
        fresh, lambda: start(s, p_new, lz_new, zstate_new),
        lambda: _accelerated_trial(loss_fn, s, data, total, a, y, fy, g, u_new, p_new, lz_new,
                                   zstate_new))


def _accelerated_trial(loss_fn: MarginalLoss, s: ProxPGMState, data: Any, total: Array,
                       a: Array, y: Array, fy: Array, g: Array, u_new: Array, p_new: Array,
                       lz_new: Array, zstate_new: Any) -> ProxPGMState:
    """The line-search test of the accelerated trial ``u'`` whose oracle output is given."""
    z_new = total * p_new
    x_hat = (1.0 - a) * s.x + a * z_new
    f_hat = loss_fn(x_hat, data, s.smooth)
    f_z = loss_fn(z_new, data, s.smooth)
    bregman = jnp.maximum(jnp.vdot(u_new - s.u, z_new) - total * (lz_new - s.z_log_z), 0.0)
    bound = fy + jnp.vdot(g, x_hat - y) + (a * a / s.alpha) * bregman
    slack = 1e-12 * jnp.maximum(1.0, jnp.abs(fy))
    accept = jnp.isfinite(f_hat) & jnp.isfinite(f_z) & (f_hat <= bound + slack)

    z_better = f_z <= f_hat
    x_cand = jnp.where(z_better, z_new, x_hat)
    f_cand = jnp.minimum(f_z, f_hat)
    restart = f_cand > s.fx
    x_acc = jnp.where(restart, s.x, x_cand)
    fx_acc = jnp.minimum(f_cand, s.fx)
    best = accept & (f_z < s.objective)
    theta, mu, log_z, ostate, objective = where_tree(
        best, (u_new, z_new, lz_new, zstate_new, f_z),
        (s.theta, s.mu, s.log_z, s.oracle_state, s.objective))
    u, z, z_log_z, z_state = where_tree(accept, (u_new, z_new, lz_new, zstate_new),
                                        (s.u, s.z, s.z_log_z, s.z_state))
    return s._replace(
        theta=theta, mu=mu, log_z=log_z, oracle_state=ostate, objective=objective,
        u=u, z=z, z_log_z=z_log_z, z_state=z_state,
        x=jnp.where(accept, x_acc, s.x), fx=jnp.where(accept, fx_acc, s.fx),
        momentum=jnp.where(accept, jnp.where(restart, -1.0, a), s.momentum),
        alpha_prev=jnp.where(accept, s.alpha, s.alpha_prev),
        alpha=jnp.where(accept, _GROW * s.alpha, _SHRINK * s.alpha),
        rejected=s.rejected + (~accept).astype(s.rejected.dtype),
        restarts=s.restarts + (accept & restart).astype(s.restarts.dtype),
    )


def _switch_smoothing(loss_fn: MarginalLoss, s: ProxPGMState, data: Any,
                      accelerated: bool) -> ProxPGMState:
    """Halve the L1 smoothing level: re-evaluate the objectives, halve ``α``, restart."""
    smooth = _SMOOTH_SHRINK * s.smooth
    objective, grad = jax.value_and_grad(loss_fn)(s.mu, data, smooth)
    fx = loss_fn(s.x, data, smooth) if accelerated else objective
    return s._replace(smooth=smooth, objective=objective, grad=grad, fx=fx,
                      alpha=_SMOOTH_SHRINK * s.alpha, momentum=-jnp.ones_like(s.momentum),
                      stage_start=s.t)


def _block(oracle: MarginalOracle, loss_fn: MarginalLoss, operands: Any, state: ProxPGMState,
           data: Any, total: Array, limit: Array, tol: Array, target: Array, *, num_l1: int,
           method: str, auto_step: bool) -> tuple[ProxPGMState, Array, Array]:
    """Up to :data:`BLOCK` iterations, until ``t == limit``, the stopping rule fires or the
    exact loss is at most ``target``. An unstarted state (:func:`_unstarted`) is started by the
    first iteration (``auto_step``: with the curvature step of :func:`init_at`).

    Returns the state and the exact loss and objective at the fit after each iteration of the
    block (``NaN`` past the last).
    """
    accelerated = method == "accelerated"
    window = state.recent.shape[0]
    first = state.t

    def start(s: ProxPGMState, p: Array, log_z: Array, ostate: Any) -> ProxPGMState:
        begun = init_at(loss_fn, s.theta, p, log_z, ostate, data, total, s.smooth, s.alpha,
                        window=window, auto_step=auto_step)
        return begun._replace(t=s.t)  # the loop counts this call as iteration 0
    stop = jnp.minimum(limit, first + BLOCK)
    nan = jnp.full(BLOCK, jnp.nan, dtype=state.mu.dtype)

    def cond(carry: tuple[ProxPGMState, Array, Array]) -> Array:
        s = carry[0]
        return (s.t < stop) & ~s.converged

    def body(carry: tuple[ProxPGMState, Array, Array]) -> tuple[ProxPGMState, Array, Array]:
        s, trace, obj_trace = carry
        fresh = s.t < 0
        step = _accelerated_step if accelerated else _md_step
        s = step(oracle, loss_fn, operands, s, data, total, start)
        t = s.t + 1
        if num_l1:
            loss = loss_fn(s.mu, data, jnp.zeros_like(s.smooth))
        else:
            loss = s.objective
        monitored = s.fx
        past = s.recent[t % window]
        scale_f = jnp.maximum(1.0, jnp.abs(monitored))
        if num_l1 == 0:
            final, thr = jnp.ones((), dtype=bool), tol * scale_f
        else:
            gap = 0.5 * s.smooth * num_l1
            final = gap <= tol * jnp.maximum(1.0, jnp.abs(loss))
            thr = jnp.where(final, tol * scale_f,
                            jnp.maximum(tol * jnp.maximum(1.0, jnp.abs(loss)),
                                        _STAGE_FRACTION * gap))
        stalled = (t - s.stage_start >= window) & (past - monitored <= thr)
        caught_up = s.objective - s.fx <= thr if accelerated else jnp.ones((), dtype=bool)
        s = s._replace(t=t, loss=loss,
                       converged=~fresh & ((stalled & final & caught_up) | (loss <= target)))
        if num_l1:
            s = jax.lax.cond(stalled & ~final,
                             lambda q: _switch_smoothing(loss_fn, q, data, accelerated),
                             lambda q: q, s)
        s = s._replace(recent=s.recent.at[t % window].set(s.fx))
        i = t - first - 1
        return s, trace.at[i].set(loss), obj_trace.at[i].set(s.objective)

    return jax.lax.while_loop(cond, body, (state, nan, nan))


_block = jit_modes(_block, static_argnames=("oracle", "loss_fn", "num_l1", "method",
                                            "auto_step"))


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
    method: str = "md",
    target: float = -math.inf,
    callback: Callable[[int, float], None] | None = None,
    callback_every: int = 100,
    compile_mode: str = "optimized",
) -> tuple[ProxPGMState, np.ndarray, np.ndarray]:
    """Mirror descent (or its accelerated form) from ``theta`` until ``iters`` or the rule.

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
        A stage ends when the monitored objective decreased by at most ``tol·max(1, |f|)`` over
        the last ``window`` iterations (raised while the L1 smoothing gap is still above it);
        the loop stops at the end of the last stage.
    window : int
        Number of iterations the stopping rule looks back over.
    method : {"accelerated", "md"}
        The iteration scheme (module notes).
    target : float
        Stop at the first iterate whose exact loss is at most ``target`` (the discrepancy
        principle; ``-inf``: never).
    callback : callable ``(iteration, loss) -> None``, optional
        Called at the start, every ``callback_every`` iterations and at the end.
    callback_every : int
        Iterations between two calls of ``callback``.
    compile_mode : {"optimized", "quick"}
        How XLA compiles the loop (:mod:`numpyro_dpgm._jit`).

    Returns
    -------
    state : ProxPGMState
        The state after the last iteration.
    trace, objective_trace : numpy arrays ``(t + 1,)``
        The exact loss and the objective at the fit after ``0..t`` iterations.
    """
    dtype = theta.dtype
    total_arr, tol_arr = jnp.asarray(total, dtype), jnp.asarray(float(tol), dtype)
    target_arr = jnp.asarray(float(target), dtype)
    operands = oracle_operands(oracle)
    smooth = jnp.asarray(_SMOOTH0 if num_l1 else 0.0, dtype)
    alpha_arr = jnp.asarray(0.0 if alpha is None else alpha, dtype)
    auto_step = alpha is None
    block = partial(_block, oracle, loss_fn, operands, data=data, total=total_arr, tol=tol_arr,
                    target=target_arr, num_l1=num_l1, method=method, auto_step=auto_step,
                    compile_mode=compile_mode)
    start = oracle.host_start(theta) if isinstance(oracle, ExactOracle) else None
    if start is None:  # the loop's first call starts it: the start compiles nothing more
        state = block(_unstarted(oracle, theta, smooth, alpha_arr, int(window)),
                      limit=jnp.asarray(0))[0]
    else:  # the exact oracle's start by the calibrated tree's program, shared with queries
        state = _init_at(loss_fn, theta, *start, oracle.init_state(), data, total_arr, smooth,
                         alpha_arr, window=int(window), auto_step=auto_step,
                         compile_mode=compile_mode)
    state, (trace, obj_trace) = run_blocks(
        lambda s, limit: block(s, limit=limit), state, (state.loss, state.objective),
        lambda s: s, iters=iters, callback=callback, callback_every=callback_every)
    return state, trace, obj_trace


def run_blocks(
    block: Callable[[Any, Array], tuple[Any, ...]],
    state: Any,
    first: tuple[Array, ...],
    md_of: Callable[[Any], ProxPGMState],
    *,
    iters: int,
    callback: Callable[[int, float], None] | None,
    callback_every: int,
) -> tuple[Any, tuple[np.ndarray, ...]]:
    """Call a compiled ``block(state, limit) -> (state, *traces)`` until ``iters`` iterations
    or the rule fires, reporting to ``callback`` between blocks.

    ``md_of(state)`` is the :class:`ProxPGMState` inside ``state`` (its ``t``, ``loss`` and
    ``converged``); each trace of a block holds :data:`BLOCK` values, ``NaN`` past its last
    iteration. Returns the final state and each trace over ``0..t``, starting with ``first``.
    """
    traces: list[list[np.ndarray]] = [[np.atleast_1d(np.asarray(v))] for v in first]
    if callback is not None:
        callback(0, float(md_of(state).loss))
    next_report = int(callback_every) if callback is not None else iters
    done = 0
    while done < iters and not bool(md_of(state).converged):
        state, *blocks = block(state, jnp.asarray(min(iters, next_report)))
        now = int(md_of(state).t)
        for acc, values in zip(traces, blocks, strict=True):
            acc.append(np.asarray(values)[: now - done])  # a device slice compiles per length
        done = now
        if callback is not None and (done >= next_report or done >= iters
                                     or bool(md_of(state).converged)):
            callback(done, float(md_of(state).loss))
            next_report = done + int(callback_every)
    return state, tuple(np.concatenate(acc) for acc in traces)
