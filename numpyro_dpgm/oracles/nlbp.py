"""Non-linear belief propagation (NLBP): approximate MAP of the latent counts of a CGM.

Seed 002, Algorithm 1 (after Sun, Sheldon & Kumar 2015) maximises the relaxed CGM posterior
(seed 002, Eq. 6)

.. math:: F(n) = θ·n + H(n) + \\log p(y \\mid n), \\qquad n ∈ N·\\mathcal{M},

by repeatedly linearising the evidence term: ``θ' = θ + ∇_n log p(y|n)``, ``n' = N·μ(θ')`` from
a standard marginal oracle, then damping. ``∇_n log p(y|n)`` is any differentiable function's
gradient (computed by autodiff), so Laplace, Gaussian and partial (linear-query) measurements
all work.

Two forms are offered (``space=``):

``"natural"`` (default)
    damping in natural-parameter space, ``η ← (1−α_t)η + α_t(θ + g(Nμ(η)))``, ``n = Nμ(η)``.
    This is entropic mirror descent on ``−F``; its iterates are in the model family, ``F`` is
    exact at every iterate (``H(n) = N·A(η) − η·n``), and the best iterate is returned.
``"counts"``
    seed 002's Algorithm 1 as printed: ``n ← (1−α_t)n + α_t N μ(θ + g(n))``; returns the final
    damped ``n``.

Both have the same fixed points. With a Laplace likelihood the gradient is a sign function; a
diminishing damping ``α_t`` (default ``1/(1+t)`` in natural space, ``0.5/(1+t/10)`` in count space)
handles the kink; a Huber smoothing of the evidence is an option of the callers.

An iterate with a non-finite objective or counts (an overflowing linearisation) is rejected: the
loop stays where it was and halves its damping from then on (``NLBPResult.rejected`` counts such
steps). Finite runs are unaffected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..network import MarkovNetwork
from . import junction_tree as jt

__all__ = ["NLBPResult", "nlbp_map", "nlbp_loop", "default_damping", "resolve_damping",
           "ConstantDamping", "ScaledDamping", "check_halvings"]

Array = Any


class NLBPResult(NamedTuple):
    """Output of :func:`nlbp_map`.

    Attributes
    ----------
    n : array ``(num_params,)``
        The MAP estimate of the counts (best iterate in natural space, last in count space).
    eta : array ``(num_params,)``
        Natural parameters with ``n = N·μ(η)`` (natural space; in count space the last BP
        input ``θ + g``).
    objective : scalar
        ``F(n)`` at the returned iterate (natural space; in count space ``F`` of the last BP
        output, a diagnostic).
    iterations : int
    converged : bool
        Whether the relative change ``‖n_{t+1} − n_t‖₁ / (N·#cliques)`` fell below ``tol``.
    trace : array ``(max_iters,)``
        ``F`` per iteration (``nan`` after the last and at rejected iterates).
    rejected : int
        Iterates rejected as non-finite (each halved the damping of the steps after it).
    """

    n: Array
    eta: Array
    objective: Array
    iterations: Array
    converged: Array
    trace: Array
    rejected: Array


def _harmonic(t: Array) -> Array:
    return 1.0 / (1.0 + t)


def _slow_harmonic(t: Array) -> Array:
    return 0.5 / (1.0 + t / 10.0)


class ConstantDamping(NamedTuple):
    """A constant damping ``α_t = alpha`` (hashable, so compiled loops are reused)."""

    alpha: float

    def __call__(self, t: Array) -> Array:
        return jnp.asarray(self.alpha, dtype=jnp.result_type(t))


class ScaledDamping(NamedTuple):
    """A schedule scaled by a constant, ``α_t = scale·schedule(t)`` (hashable when the schedule
    is, so compiled loops are reused); EM halves its damping this way when an E-step stalls."""

    schedule: Callable[[Array], Array]
    scale: float

    def __call__(self, t: Array) -> Array:
        return self.scale * self.schedule(t)


def check_halvings(max_halvings: Any) -> int:
    """``max_halvings`` of EM's stalled E-steps as an int; anything but a non-negative integer
    is refused."""
    if not 0 <= int(max_halvings) == max_halvings:
        raise ValueError(f"max_halvings must be a non-negative integer, got {max_halvings}")
    return int(max_halvings)


def default_damping(space: str) -> Callable[[Array], Array]:
    """Damping schedule ``α_t``: ``1/(1+t)`` (natural space) or ``0.5/(1+t/10)`` (counts)."""
    if space == "natural":
        return _harmonic
    if space == "counts":
        return _slow_harmonic
    raise ValueError(f"space must be 'natural' or 'counts', got {space!r}")


def resolve_damping(space: str, damping: Any = None) -> Callable[[Array], Array]:
    """The schedule ``α_t`` of ``damping``: ``None`` (:func:`default_damping`), a constant in
    ``(0, 1]`` (:class:`ConstantDamping`) or a callable ``t -> α_t`` (returned as is)."""
    if damping is None:
        return default_damping(space)
    if callable(damping):
        return damping
    alpha = float(damping)
    if not 0 < alpha <= 1:
        raise ValueError(f"damping must be in (0, 1], got {alpha}")
    return ConstantDamping(alpha)


def _oracle(network: MarkovNetwork, eta: Array) -> tuple[Array, Array]:
    """``(A(η), μ(η))`` by one calibration and its reverse-mode derivative."""
    return jax.value_and_grad(lambda t: jt.log_partition(network, t))(eta)


def nlbp_map(
    network: MarkovNetwork,
    theta: Array,
    total_count: Array,
    log_evidence: Callable[..., Array],
    evidence_args: Any = (),
    *,
    space: str = "natural",
    damping: float | Callable[[Array], Array] | None = None,
    max_iters: int = 200,
    tol: float = 1e-8,
    eta0: Array | None = None,
) -> NLBPResult:
    """Approximate MAP of ``p(n | y; θ)`` for the relaxed CGM by NLBP (seed 002, Alg. 1).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array ``(num_params,)``
        Log-potentials of the record model.
    total_count : scalar
        ``N``.
    log_evidence : callable ``(n, *evidence_args) -> scalar``
        ``log p(y | n)``; differentiated by autodiff. Pass data through ``evidence_args`` (not a
        closure) so repeated calls reuse the compiled loop.
    space : {"natural", "counts"}
        Where damping happens (see the module docstring).
    damping : float or callable ``t -> α_t``, optional
        Constant or schedule; defaults to :func:`default_damping`.
    max_iters, tol : int, float
        Iteration cap and tolerance on ``‖Δn‖₁ / (N·#cliques)``.
    eta0 : array, optional
        Warm start (natural space: initial η; default θ).
    """
    if space not in ("natural", "counts"):
        raise ValueError(f"space must be 'natural' or 'counts', got {space!r}")
    schedule = resolve_damping(space, damping)
    if max_iters < 1:
        raise ValueError(f"max_iters must be at least 1, got {max_iters}")
    theta = jnp.asarray(theta)
    eta0 = theta if eta0 is None else jnp.asarray(eta0)
    return _nlbp_jit(network, space, schedule, log_evidence, int(max_iters),
                     theta, jnp.asarray(total_count, dtype=theta.dtype), eta0, evidence_args,
                     jnp.asarray(tol, dtype=theta.dtype))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _nlbp_jit(network, space, schedule, log_evidence, max_iters, theta, total, eta0, args, tol):
    return nlbp_loop(network, theta, total, log_evidence, args, space=space, schedule=schedule,
                     max_iters=max_iters, tol=tol, eta0=eta0, trace_len=max_iters)


class _Loop(NamedTuple):
    t: Array
    eta: Array
    n: Array
    best: tuple[Array, Array, Array]
    delta: Array
    trace: Array
    shrink: Array
    rejected: Array


def nlbp_loop(
    network: MarkovNetwork,
    theta: Array,
    total: Array,
    log_evidence: Callable[..., Array],
    args: Any,
    *,
    space: str,
    schedule: Callable[[Array], Array],
    max_iters: Array,
    tol: Array,
    eta0: Array,
    trace_len: int = 0,
) -> NLBPResult:
    """Pure core of :func:`nlbp_map` (no validation, no ``jit``): traceable in every array.

    ``max_iters`` and ``tol`` may be traced; ``trace_len`` (static) is the length of the
    returned ``trace`` (0 drops it, so the iteration cap need not be a compile-time constant).
    """
    grad_ev = jax.grad(log_evidence)
    scale = total * len(network.cliques)
    dtype = theta.dtype

    def objective(eta: Array, log_z: Array, n: Array) -> Array:
        # F(n) = θ·n + H(n) + log p(y|n) with H(n) = N·A(η) − η·n for n = Nμ(η)
        return jnp.dot(theta, n) + total * log_z - jnp.dot(eta, n) + log_evidence(n, *args)

    log_z0, mu0 = _oracle(network, eta0)
    n0 = total * mu0
    f0 = objective(eta0, log_z0, n0)
    # a non-finite start is beaten by any finite iterate
    best0 = (n0, eta0, jnp.where(jnp.isfinite(f0), f0, -jnp.inf))

    def cond(s: _Loop) -> Array:
        return (s.t < max_iters) & (s.delta >= tol)

    def body(s: _Loop) -> _Loop:
        alpha = schedule(s.t.astype(dtype)) * s.shrink
        target = theta + grad_ev(s.n, *args)
        if space == "natural":
            eta = (1 - alpha) * s.eta + alpha * target
            log_z, mu = _oracle(network, eta)
            n = total * mu
            f = objective(eta, log_z, n)
        else:
            log_z, mu = _oracle(network, target)
            n_bp = total * mu
            n = (1 - alpha) * s.n + alpha * n_bp
            f = objective(target, log_z, n_bp)
            eta = target
        ok = jnp.isfinite(f) & jnp.all(jnp.isfinite(n))
        eta, n = jnp.where(ok, eta, s.eta), jnp.where(ok, n, s.n)
        if space == "natural":
            better = ok & (f > s.best[2])
            best = jax.tree.map(lambda a, b: jnp.where(better, a, b), (n, eta, f), s.best)
        else:
            best = jax.tree.map(lambda a, b: jnp.where(ok, a, b), (n, eta, f), s.best)
        delta = jnp.where(ok, jnp.sum(jnp.abs(n - s.n)) / scale, jnp.inf)
        trace = s.trace.at[s.t].set(jnp.where(ok, f, jnp.nan)) if trace_len else s.trace
        return _Loop(s.t + 1, eta, n, best, delta, trace, jnp.where(ok, s.shrink, s.shrink / 2),
                     s.rejected + (~ok).astype(jnp.int32))

    init = _Loop(jnp.asarray(0), eta0, n0, best0, jnp.asarray(jnp.inf, dtype),
                 jnp.full((trace_len,), jnp.nan, dtype=dtype), jnp.asarray(1.0, dtype),
                 jnp.asarray(0, jnp.int32))
    s = jax.lax.while_loop(cond, body, init)
    n, eta, f = s.best
    return NLBPResult(n, eta, f, s.t, s.delta < tol, s.trace, s.rejected)
