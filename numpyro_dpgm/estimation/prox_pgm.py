"""Prox-PGM: estimate a graphical model from noisy linear measurements of its marginals.

Seed 003 (McKenna et al. 2021), Problem 1: given noisy answers ``y_M`` to linear queries ``Q_M``
of clique count tables, find

.. math:: \\hat μ ∈ \\arg\\min_{μ ∈ N·\\mathcal M(\\mathcal C)} L(μ),
   \\qquad L(μ) = \\sum_M ℓ_M(Q_M μ_{C_M} − y_M),

over the (count-scaled) marginal polytope of the model's cliques, and the log-potentials ``θ̂``
whose model ``p_θ̂`` has marginals ``μ̂``. Prox-PGM (Algorithm 1) is entropic mirror descent
carried out in natural-parameter space: with the marginal oracle ``μ(θ) = N·∇A(θ)``,

.. math:: θ_{t+1} = θ_t − α_t ∇L(μ(θ_t)),

which is the mirror-descent update in the proof of Theorem 2 (§4) with the negative entropy as
the mirror map (there with Convex-GBP, here with any oracle); the fitted model has maximum
entropy among the distributions whose marginals minimise ``L`` (§3, "Graphical models").

Losses (the negative log-likelihood of the noise, up to constants; §3 below Problem 1):

* ``"l2"``: ``ℓ_M(r) = ½‖r‖² / σ_M²`` with ``σ_M²`` the noise variance;
* ``"l1"``: ``ℓ_M(r) = ‖r‖₁ / b_M`` with ``b_M`` the Laplace scale (``σ`` for Gaussian noise);
* ``"auto"``: ``"l1"`` for (discrete) Laplace noise and ``"l2"`` for (discrete) Gaussian noise,
  measurement by measurement;
* a callable ``loss(marginals) -> scalar`` of the count-scale clique tables (any convex ``L``).

Step sizes follow Private-PGM's Armijo rule: start from ``α₀ = 2/(L_∇·N)`` with ``L_∇`` the
Lipschitz constant of ``∇L``, accept a trial step when it gives sufficient decrease
``f(μ) − f(μ') ≥ ½⟨∇f(μ), μ − μ'⟩`` (then ``α ← 1.01α``), otherwise reject it and halve ``α``.
The objective is therefore non-increasing.

The L1 loss is not differentiable where a residual vanishes, which is where its minimisers
sit, and a subgradient step with this line search stalls there (on a 3-attribute chain the loss
stopped at twice the optimum found by linear programming). Its terms are therefore minimised
through the Huber function ``h_δ(r)`` (``r²/(2δ)`` for ``|r| ≤ δ``, ``|r| − δ/2`` beyond), a
smooth approximation with ``|r| − δ/2 ≤ h_δ(r) ≤ |r|`` (Nesterov 2005), by continuation:
``δ_M = s·b_M`` starts at ``s = 1`` and ``s`` is halved whenever the smoothed problem has
stopped improving, until the smoothing gap ``s·m/2`` (``m`` L1 answers) is below the tolerance.
``loss_trace`` reports the exact L1 loss; the smoothed objective is non-increasing within each
level.

The marginal oracle is pluggable (:class:`MarginalOracle`): the exact junction tree
(:class:`ExactOracle`) or an approximate oracle carrying a warm-startable state, such as
Convex-GBP on a region graph (Algorithm 2), which turns Prox-PGM into APPGM (Theorem 2).

Out-of-model queries (Problem 4) are answered from the fitted model itself: with an exact
oracle the fitted ``p_θ̂`` is a proper distribution, and the marginal of any attribute set is
computed exactly on the junction tree of the model augmented with a zero potential on that set
(Appendix B, "exact out-of-model inference"); see :func:`answer_queries`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..distributions.mrf import MarkovRandomField
from ..domain import Clique, Domain
from ..inference import calibration
from ..inference import junction_tree as jt
from ..inference.gbp import ConvexGBPOracle
from ..measurements import Measurement, estimate_total
from ..network import MarkovNetwork
from ..tables import CliqueTables, project_table
from .contract import (
    check_attributes,
    check_max_iters,
    estimator,
    network_from_measurements,
    resolve_init,
    resolve_total,
    total_extras,
)
from .losses import (
    LossTerm,
    build_terms,
    check_measurements,
    lipschitz_bound,
    measurement_loss,
    terms_loss,
)
from .naive import fit_mle
from .result import Result

__all__ = [
    "ARMIJO_C",
    "ORACLES",
    "ExactOracle",
    "MarginalOracle",
    "ProxPGMState",
    "answer_queries",
    "estimate_total",
    "measurement_loss",
    "prox_pgm",
]

Array = Any

#: Sufficient-decrease constant of the Armijo test ``L(μ) − L(μ') ≥ c·⟨∇L(μ), μ − μ'⟩``.
ARMIJO_C = 0.5
#: Step-size growth after an accepted step and shrink factor after a rejected one.
_GROW, _SHRINK = 1.01, 0.5


# ------------------------------------------------------------------------------------------------
# Marginal oracles
# ------------------------------------------------------------------------------------------------
@runtime_checkable
class MarginalOracle(Protocol):
    """What Prox-PGM needs from a marginal oracle (seed 003, Algorithm 1 "Marginal-Oracle").

    An oracle is bound to a network and is hashable (it is static data of the jitted loop).

    Attributes
    ----------
    network : MarkovNetwork
        The cliques and parameter layout of ``theta`` and of the returned marginals.

    Methods
    -------
    init_state() -> pytree
        The oracle's initial state (``()`` for a stateless oracle; messages for Convex-GBP).
    __call__(theta, state) -> (mu, log_z, state)
        ``theta``: flat log-potentials in the network's layout. ``mu``: the (pseudo-)marginals
        of every network clique, flat in the same layout, each table summing to 1. ``log_z``:
        the log-partition function (or its approximation). ``state``: the state to warm-start
        the next call from. Pure and traceable under ``jit``.
    """

    network: MarkovNetwork

    def init_state(self) -> Any: ...

    def __call__(self, theta: Array, state: Any) -> tuple[Array, Array, Any]: ...


@dataclasses.dataclass(frozen=True)
class ExactOracle:
    """Exact marginals by log-space sum-product on the junction tree (stateless).

    Parameters
    ----------
    network : MarkovNetwork
    method : {"min_fill", "min_size"}
        Triangulation heuristic of the junction tree.
    """

    network: MarkovNetwork
    method: str = "min_fill"

    def __post_init__(self) -> None:
        if not isinstance(self.network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(self.network).__name__}")
        if self.method not in ("min_fill", "min_size"):
            raise ValueError(
                f"unknown triangulation method {self.method!r}; use 'min_fill' or 'min_size'"
            )

    def init_state(self) -> tuple[()]:
        return ()

    def __call__(self, theta: Array, state: Any) -> tuple[Array, Array, Any]:
        net = self.network
        tree = jt.build_junction_tree(net, self.method)
        cal = calibration.calibrate(tree, calibration.clique_log_potentials(tree, net, theta))
        parts = []
        for c in net.cliques:
            i = tree.containing(c)
            logp = cal.log_beliefs[i] - cal.log_z
            table = jnp.exp(project_table(logp, tree.cliques[i], c, log=True))
            parts.append(jnp.ravel(table))
        mu = jnp.concatenate(parts) if parts else jnp.zeros(0, dtype=jnp.result_type(theta))
        return mu, cal.log_z, state


#: Oracles selectable by name: ``name -> factory(network) -> MarginalOracle``.
#: Oracles by name: ``"exact"`` (junction tree) and ``"convex_gbp"`` (Convex-GBP on the saturated
#: region graph with counting numbers 1, one warm-started sweep per step: APPGM, seed 003 §4).
ORACLES: dict[str, Callable[[MarkovNetwork], MarginalOracle]] = {
    "exact": ExactOracle,
    "convex_gbp": ConvexGBPOracle,
}


def _resolve_oracle(
    oracle: str | MarginalOracle | Callable[[MarkovNetwork], MarginalOracle],
    network: MarkovNetwork,
) -> MarginalOracle:
    if isinstance(oracle, str):
        if oracle not in ORACLES:
            raise ValueError(f"unknown oracle {oracle!r}; available: {sorted(ORACLES)}")
        built = ORACLES[oracle](network)
    elif isinstance(oracle, MarginalOracle):
        built = oracle
    elif callable(oracle):
        built = oracle(network)
    else:
        raise TypeError(
            "oracle must be a name, a MarginalOracle or a factory network -> MarginalOracle; "
            f"got {type(oracle).__name__}"
        )
    if not isinstance(built, MarginalOracle):
        raise TypeError(f"the oracle factory returned {type(built).__name__}, not a MarginalOracle")
    if built.network != network:
        raise ValueError(
            f"the oracle is bound to {built.network!r}, but the model's network is {network!r}"
        )
    try:
        hash(built)
    except TypeError:
        raise TypeError(
            "the oracle must be hashable (it is static data of a jitted loop)"
        ) from None
    return built


def _max_entropy_model(
    network: MarkovNetwork, pseudo: Array, theta: Array, max_cells: float = 5e7
) -> tuple[Array, str]:
    """The maximum-entropy model whose marginals are closest to approximate pseudo-marginals.

    With an approximate oracle the iterate's ``θ`` parameterises the region-graph beliefs, not
    a distribution with those marginals. When the network's junction tree is small enough
    (``max_cells``), the returned model is instead the moment-matching fit of the
    pseudo-marginals (the maximum-entropy distribution of Problem 4, seed 003, with a tiny L2
    term since locally consistent pseudo-marginals may lie outside ``M``). Otherwise ``θ`` is
    returned unchanged and marked ``"oracle"``.
    """
    if jt.build_junction_tree(network).num_cells > max_cells:
        return theta, "oracle"
    fit = fit_mle(network, pseudo, 1e-6, init=theta)
    return fit.model.theta, "max_entropy"


# ------------------------------------------------------------------------------------------------
# The mirror-descent loop
# ------------------------------------------------------------------------------------------------
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
class _Loss:
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
    loss_fn: _Loss,
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
    loss_fn: _Loss,
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


def _initial_step(loss_fn: _Loss, state: ProxPGMState, data: Any, total: Array) -> Array:
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
    loss_fn: _Loss,
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
    loss_fn: _Loss,
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


# ------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------
@estimator("prox-pgm", legacy_positional=("total_count", "iters", "oracle", "loss"))
def prox_pgm(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Domain | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: MarkovRandomField | Array | None = None,
    max_iters: int = 1000,
    callback: Callable[[int, float], None] | None = None,
    oracle: str | MarginalOracle | Callable[[MarkovNetwork], MarginalOracle] = "exact",
    loss: str | Callable[[CliqueTables], Array] = "auto",
    step_size: float | None = None,
    tol: float = 1e-12,
    window: int = 10,
    callback_every: int = 100,
) -> Result:
    """Fit a graphical model to noisy linear measurements of its marginals (Prox-PGM).

    Solves Problem 1 of seed 003, ``min_{μ ∈ N·M(C)} L(μ)``, by Algorithm 1 (mirror descent in
    natural-parameter space, ``θ ← θ − α∇L(μ(θ))``) with Armijo backtracking, from ``θ = 0``
    (the uniform distribution) or ``init``.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers ``y = Q·vec(n_C) + noise`` on the count scale (``Q`` the identity when
        ``query`` is ``None``). Attributes of a measurement's clique may come in any order;
        ``values`` (or the query's columns) follow that order, raveled in C order.
    network_or_domain : MarkovNetwork, Domain or mapping attribute -> size
        The model's cliques. Given a domain, the model's cliques are the measured cliques that
        are maximal (attributes in domain order). Given a network, each measurement must lie
        inside one of its cliques; unmeasured cliques keep zero potentials (maximum entropy).
    total_count : float, optional
        The number of records ``N`` (> 0). ``None`` estimates it from the measurements by
        inverse-variance weighting (:func:`estimate_total`), clipped below at 1.
    rng_key : JAX PRNG key, optional
        Accepted for the estimators' common contract and ignored (Prox-PGM is deterministic).
    init : MarkovRandomField or array, optional
        Warm start: log-potentials in the network's layout (or a model over the same network),
        e.g. a previous fit's ``model``. ``None``: ``θ = 0``, the uniform distribution.
    max_iters : int
        Maximum number of mirror-descent iterations (each costs one oracle call).
    callback : callable ``(iteration, loss) -> None``, optional
        Called with ``(0, L(θ₀))`` before the first iteration, then every ``callback_every``
        iterations and once at the end, with the number of iterations done and the loss
        (progress reporting; the compiled loop runs in blocks of ``callback_every``).
    oracle : "exact", MarginalOracle, or callable network -> MarginalOracle
        The marginal oracle. ``"exact"`` is the junction tree (:class:`ExactOracle`). An
        approximate oracle with a warm-startable state (e.g. Convex-GBP) makes this APPGM.
    loss : "auto", "l2", "l1" or callable
        ``"l2"``: ``Σ_M ½‖(Q_Mμ_{C_M} − y_M)/σ_M‖²`` with ``σ_M²`` the noise variance;
        ``"l1"``: ``Σ_M ‖Q_Mμ_{C_M} − y_M‖₁/b_M`` with ``b_M`` the Laplace scale (``σ_M`` for
        Gaussian noise); ``"auto"``: L1 for Laplace-family and L2 for Gaussian-family noise,
        per measurement (the noise's negative log-likelihood). A callable receives the
        count-scale marginals of the network's cliques (:class:`CliqueTables`) and returns a
        scalar convex loss; it must be traceable by JAX.
    step_size : float, optional
        Initial step ``α₀``. Default ``2/(L_∇·N)`` with ``L_∇`` the bound of the Lipschitz
        constant of ``∇L`` over the measurements (exact for identity queries); for a callable
        loss, the largest Hessian eigenvalue at the start (power iteration).
    tol : float
        Stop when the loss decreased by at most ``tol·max(1, |L|)`` over the last ``window``
        iterations (with L1 terms: at the last smoothing level, the one whose gap ``s·m/2``
        is at most ``tol·max(1, |L|)``). ``0`` runs all ``max_iters`` unless the loss stops
        changing exactly. The loss is a negative log-likelihood, so ``tol`` is in nats.
    window : int
        Number of iterations the stopping rule looks back over.
    callback_every : int
        Iterations between two calls of ``callback``.

    Returns
    -------
    Result
        ``model``: :class:`MarkovRandomField` over the network with the fitted ``θ̂`` (exact
        oracle); with an approximate oracle, the maximum-entropy model of the estimated
        pseudo-marginals when the junction tree is tractable (``extras["model_fit"]`` says
        which), since the oracle's ``θ̂`` parameterises region-graph beliefs, not a
        distribution with those marginals.
        ``loss_trace``: ``L`` after ``0..iterations`` iterations (non-increasing for smooth
        losses; see the module notes for L1).
        ``converged``: whether the stopping rule fired before ``max_iters``. ``extras``:
        ``total_count`` (the ``N`` used), ``total_count_estimated`` (bool), ``marginals`` (the
        oracle's count-scale clique marginals at ``θ̂``, :class:`CliqueTables`), ``log_partition``,
        ``step_size`` (final ``α``), ``initial_step_size``, ``rejected_steps``,
        ``objective_trace`` (the smoothed objective; equal to ``loss_trace`` without L1 terms),
        ``smoothing`` (final ``s``), ``loss_kinds`` (per measurement), ``oracle``,
        ``oracle_state`` and ``model_fit`` (``"oracle"`` or ``"max_entropy"``).

    Raises
    ------
    KeyError
        A measurement names an attribute outside the domain.
    ValueError
        Wrong number of values for a clique, a measurement outside every network clique, a
        non-positive or non-finite total, an unknown loss or oracle, no measurements, or
        ``max_iters < 1``.
    TypeError
        Arguments of the wrong type.

    Examples
    --------
    >>> import numpy as np, numpyro
    >>> numpyro.enable_x64()
    >>> from numpyro_dpgm.measurements import Gaussian, Measurement
    >>> y = np.array([[30.0, 10.0], [20.0, 40.0]])
    >>> fit = prox_pgm([Measurement(("a", "b"), y, Gaussian(1.0))], {"a": 2, "b": 2})
    >>> np.round(np.asarray(fit.extras["marginals"][("a", "b")]), 3).tolist()
    [[30.0, 10.0], [20.0, 40.0]]
    """
    start = time.perf_counter()
    warn_if_float32("prox_pgm")

    # -- network -----------------------------------------------------------------------------
    if isinstance(network_or_domain, MarkovNetwork):
        network, domain = network_or_domain, network_or_domain.domain
    elif isinstance(network_or_domain, Mapping):
        domain = network_or_domain if isinstance(network_or_domain, Domain) else Domain(
            network_or_domain)
        network = None
    else:
        raise TypeError(
            "network_or_domain must be a MarkovNetwork, a Domain or a mapping attribute -> size; "
            f"got {type(network_or_domain).__name__}"
        )
    check_attributes(measurements, domain)
    measurements = check_measurements(measurements, domain)
    custom = None
    if callable(loss) and not isinstance(loss, str):
        custom = loss
    elif not isinstance(loss, str) or loss not in ("auto", "l1", "l2"):
        raise ValueError(f"unknown loss {loss!r}; use 'auto', 'l1', 'l2' or a callable")
    if not measurements and (custom is None or network is None):
        raise ValueError(
            "no measurements: give at least one measurement (or a network and a callable loss)"
        )
    if network is None:
        network = network_from_measurements(domain, measurements)
    if network.num_params == 0:
        raise ValueError("the network has no cliques: there is nothing to estimate")

    # -- options -----------------------------------------------------------------------------
    iters = check_max_iters(max_iters)
    if not isinstance(window, int | np.integer) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if not math.isfinite(float(tol)) or tol < 0:
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if not isinstance(callback_every, int | np.integer) or callback_every < 1:
        raise ValueError(f"callback_every must be a positive integer, got {callback_every!r}")

    # -- total -------------------------------------------------------------------------------
    total, estimated = resolve_total(total_count, measurements)

    # -- loss, oracle, start point -----------------------------------------------------------
    kind = "auto" if custom is not None else loss
    terms, data = build_terms(network, measurements, kind)
    loss_fn = _Loss(network, terms, custom)
    if custom is not None:
        data = ()
    the_oracle = _resolve_oracle(oracle, network)
    dtype = jnp.result_type(float)
    theta0 = resolve_init(init, network)
    theta0 = (jnp.zeros(network.num_params, dtype=dtype) if theta0 is None
              else theta0.astype(dtype))

    num_l1 = sum(int(d.values.size) for term, d in zip(terms, data, strict=False)
                 if term.kind == "l1") if custom is None else 0
    auto_step = step_size is None and custom is not None
    if step_size is not None:
        alpha0 = float(step_size)
        if not math.isfinite(alpha0) or alpha0 <= 0:
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}")
    elif custom is None:
        alpha0 = 2.0 / (lipschitz_bound(network, terms, data) * total)
    else:
        alpha0 = 0.0  # computed from the curvature at the start, inside the compiled program

    # -- iterate (in blocks when reporting progress) ------------------------------------------
    block = iters if callback is None else int(callback_every)
    static = {"oracle": the_oracle, "loss_fn": loss_fn, "window": int(window), "num_l1": num_l1}
    total_arr, tol_arr = jnp.asarray(total, dtype), jnp.asarray(float(tol), dtype)
    state = _start(
        theta=theta0, oracle_state=the_oracle.init_state(), data=data, total=total_arr,
        smooth=jnp.asarray(_SMOOTH0 if num_l1 else 0.0, dtype),
        alpha=jnp.asarray(alpha0, dtype), trace=jnp.full(_buffer_length(iters), jnp.nan, dtype),
        limit=jnp.asarray(min(iters, block)), tol=tol_arr, auto_step=auto_step, **static,
    )
    while True:
        done = int(state.t)
        if callback is not None:
            callback(done, float(state.loss))
        if done >= iters or bool(state.converged):
            break
        state = _resume(state=state, data=data, total=total_arr,
                        limit=jnp.asarray(min(iters, done + block)), tol=tol_arr, **static)

    t = int(state.t)
    theta, model_fit = state.theta, "oracle"
    if not isinstance(the_oracle, ExactOracle):
        theta, model_fit = _max_entropy_model(network, state.mu / total, state.theta)
    model = MarkovRandomField(network, theta)
    extras = {
        **total_extras(total, estimated),
        "marginals": network.unflatten(state.mu),
        "log_partition": state.log_z,
        "step_size": float(state.alpha),
        "initial_step_size": float(state.initial_alpha),
        "rejected_steps": int(state.rejected),
        "objective_trace": state.objective_trace[: t + 1],
        "smoothing": float(state.smooth),
        "loss_kinds": tuple(term.kind for term in terms) if custom is None else ("custom",),
        "oracle": the_oracle,
        "oracle_state": state.oracle_state,
        "model_fit": model_fit,
    }
    return Result(
        model=model,
        loss_trace=state.trace[: t + 1],
        iterations=t,
        converged=bool(state.converged),
        elapsed=time.perf_counter() - start,
        extras=extras,
    )


def answer_queries(
    model: MarkovRandomField | Result,
    queries: Iterable[Iterable[str] | str],
    total: float | None = None,
) -> dict[Clique, Array]:
    """Marginals of attribute sets, in or out of the model (seed 003, Problem 4; exact).

    In-model sets are projected from a junction-tree clique; for an out-of-model set the model
    is augmented with a zero potential on it (which leaves ``p_θ`` unchanged) and the marginal is
    read off the calibrated junction tree of the augmented model (Appendix B). With an exact
    oracle this is the marginal of the fitted maximum-entropy distribution.

    Parameters
    ----------
    model : MarkovRandomField or Result
        A fitted model (a :class:`Result` supplies its model and, by default, its total).
    queries : iterable of attribute tuples
        Each query's table has one axis per attribute, in the order given.
    total : float, optional
        Scale of the answers: 1 gives probabilities; default the fit's total for a
        :class:`Result`, else 1.

    Returns
    -------
    dict
        ``query -> table`` (count scale when ``total`` is the record count).
    """
    if isinstance(model, Result):
        if total is None:
            total = model.extras.get("total_count", 1.0)
        model = model.model
    if not isinstance(model, MarkovRandomField):
        raise TypeError(
            f"model must be a MarkovRandomField or a Result, got {type(model).__name__}"
        )
    total = 1.0 if total is None else float(total)
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"total must be a positive finite number, got {total}")
    if isinstance(queries, str):
        queries = [queries]
    out: dict[Clique, Array] = {}
    for q in queries:
        clique = model.network.domain.check_clique(q)
        out[clique] = total * model.marginal(clique)
    return out
