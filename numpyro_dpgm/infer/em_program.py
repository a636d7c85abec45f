"""The compiled EM loop: natural-space NLBP E-step and free M-step in one program.

The one EM engine of the library: :class:`~numpyro_dpgm.infer.em.EM` runs it on a model of your
own whose CGM's ``theta`` is a param (the evidence: the model's observed sites), and
:func:`~numpyro_dpgm.estimation.cgm_em.cgm_em` on a list of measurements (the evidence:
:class:`~numpyro_dpgm.estimation.losses.MeasurementEvidence`). The evidence is any hashable
callable ``evidence(n, data, smoothing) -> log p(y | n)`` (up to a constant).

One EM iteration (seed 002, Algorithm 2): ``η̂_t`` from NLBP warm-started at ``θ_t``
(:func:`~numpyro_dpgm.oracles.nlbp.nlbp_loop`), ``θ_{t+1} = gauge_fix(η̂_t)`` (moment matching
is free: ``μ(θ_{t+1}) = n_t / N``). The loop is a ``lax.while_loop`` in which the iteration limit,
the tolerances, the measurements' values and noise scales, ``N`` and the warm start are all
traced, so one program serves every refit of a network and measurement structure.

:func:`em_block` runs up to :data:`BLOCK` iterations per call (its per-iteration records have a
fixed length): a run of ``max_iters ≤ BLOCK`` iterations is one call; longer runs call the same
program again with its carry. :func:`em_theta` is the whole loop for a known iteration count,
``vmap``-able over batches of releases.

An E-step that finds nothing better than its start (stiff evidence: a small Laplace scale or
Gaussian σ against ``N``, where the first full NLBP step overshoots) is retried from the same
``θ_t`` with the damping schedule halved, ``α_t ← α_t / 2``, up to ``max_halvings`` times in a
run; the halved schedule is kept for the later E-steps. A retry is an E-step run (it has a
record, with ``moved`` false) but not an EM iteration: the iteration limit counts the E-steps
that moved ``θ``.

Stopping (``stop`` codes, :data:`STOP_REASONS`): ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁ < tol``
with the E-step converged (a fixed point, 1) or not (the E-step stalled, 2); an E-step that
stalled at its start with no halving left (2); an E-step whose iterates were all non-finite,
so that it returned its start (3); else the iteration limit (0). With ``halve_at_rest``
(:class:`~numpyro_dpgm.infer.em.EM`'s rule) a rest after an unconverged E-step is not a stop
while halvings are left: EM goes on with half the damping.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.nlbp import ScaledDamping, nlbp_loop, resolve_damping

__all__ = ["BLOCK", "STOP_REASONS", "EMCarry", "EMRecord", "EMRun", "EMState", "em_block",
           "em_loop", "em_start_state", "em_theta", "gauge_fix"]

Array = Any

#: EM iterations per call of :func:`em_block` (the length of its records).
BLOCK = 64

#: The meaning of the ``stop`` codes of :class:`EMCarry`.
STOP_REASONS = ("iteration limit", "converged", "stalled", "failed")
_CONVERGED, _STALLED, _FAILED = 1, 2, 3


def gauge_fix(network: MarkovNetwork, theta: Array) -> Array:
    """Subtract each clique table's mean (a change of gauge: the distribution is unchanged)."""
    tables = network.unflatten(theta)
    return network.flatten(tables.map(lambda t: t - jnp.mean(t)))


class EMCarry(NamedTuple):
    """The loop state of :func:`em_block`: ``θ_t``, the last E-step's counts, the E-steps run
    (retries included), the EM iterations (E-steps that moved ``θ``), the damping's halvings
    so far and the stop code (0 while running)."""

    theta: Array
    n_hat: Array
    steps: Array
    moves: Array
    halvings: Array
    stop: Array


class EMRecord(NamedTuple):
    """One E-step's record: its objective ``F``, the marginal change, whether NLBP converged,
    the loss ``L(N·μ(θ_{t+1}))`` (the measurements' negative log-likelihood, up to a constant),
    how many NLBP iterates were rejected as non-finite, and whether ``θ`` moved."""

    objective: Array
    change: Array
    estep_converged: Array
    loss: Array
    nonfinite: Array
    moved: Array


class EMState(NamedTuple):
    """Output of :func:`em_theta` (arrays only, so batches of runs stack along a leading axis).

    ``objectives``, ``changes``, ``estep_converged``, ``losses``, ``nonfinite`` and ``moved``
    are per E-step run and have length ``max_em_iters + max_halvings``; entries past ``steps``
    are ``nan`` / ``False`` / 0. ``iterations`` counts the E-steps that moved ``θ``,
    ``halvings`` those of the damping and ``stop`` is a code of :data:`STOP_REASONS`.
    """

    theta: Array
    n_hat: Array
    objectives: Array
    changes: Array
    estep_converged: Array
    iterations: Array
    converged: Array
    losses: Array
    nonfinite: Array
    stop: Array
    moved: Array
    steps: Array
    halvings: Array


def _max_clique_l1(network: MarkovNetwork, a: Array, b: Array) -> Array:
    return jnp.max(jnp.stack([jnp.sum(jnp.abs(a[network.slice_of(c)] - b[network.slice_of(c)]))
                              for c in network.cliques]))


def _em_step(network: MarkovNetwork, evidence: Callable, schedule: Callable,
             data: Any, total: Array, carry: EMCarry, opts: tuple) -> tuple[EMCarry, EMRecord]:
    """One E-step warm-started at ``θ_t`` with the damping ``2^-h·α_t`` (``h`` halvings so
    far); then the free M-step ``θ_{t+1} = η̂``, or, where nothing beat the start and a halving
    is left, a retry."""
    tol, inner_iters, inner_tol, smoothing, max_halvings, halve_at_rest = opts
    r = nlbp_loop(network, carry.theta, total, evidence, (data, smoothing), space="natural",
                  schedule=ScaledDamping(schedule, 0.5 ** carry.halvings), max_iters=inner_iters,
                  tol=inner_tol, eta0=carry.theta)
    moved = jnp.any(r.eta != carry.theta)
    theta = jnp.where(moved, gauge_fix(network, r.eta), carry.theta)
    change = _max_clique_l1(network, r.n / total, carry.n_hat / total)
    # an EM fixed point needs the last E-step to have converged too: an E-step that found
    # nothing better than its start within its iterations returns that start
    failed = ~moved & (r.rejected > 0) & (r.rejected >= r.iterations)  # no finite iterate
    left = carry.halvings < max_halvings
    retry = ~moved & ~failed & ~r.converged & left
    # with ``halve_at_rest``, marginals at rest after an unconverged E-step that moved θ are
    # not a stop either: EM goes on from there with half the damping
    rest = moved & (change < tol) & ~r.converged & left & halve_at_rest
    # an E-step that returns its start, not retried, ends EM: a fixed point if it converged
    still = (~moved | (change < tol)) & ~rest
    stop = jnp.where(failed, _FAILED,
                     jnp.where(retry, 0,
                               jnp.where(still, jnp.where(r.converged, _CONVERGED, _STALLED),
                                         0)))
    retry = retry | rest
    loss = -evidence(r.n, data, jnp.zeros((), total.dtype))
    record = EMRecord(r.objective, change, r.converged, loss, r.rejected, moved)
    return EMCarry(theta, r.n, carry.steps + 1, carry.moves + moved.astype(carry.moves.dtype),
                   carry.halvings + retry.astype(carry.halvings.dtype),
                   stop.astype(carry.stop.dtype)), record


def _empty_records(length: int, dtype: Any) -> EMRecord:
    nan = jnp.full(length, jnp.nan, dtype)
    return EMRecord(nan, nan, jnp.zeros(length, bool), nan, jnp.zeros(length, jnp.int32),
                    jnp.zeros(length, bool))


def _run(network, evidence, schedule, data, total, carry, limit, opts, first, length):
    """EM iterations ``first..`` until the limit, a stop, or ``length`` records are written."""
    def cond(s: tuple[EMCarry, EMRecord]) -> Array:
        c = s[0]
        return (c.moves < limit) & (c.stop == 0) & (c.steps < first + length)

    def body(s: tuple[EMCarry, EMRecord]) -> tuple[EMCarry, EMRecord]:
        c, recs = s
        c2, rec = _em_step(network, evidence, schedule, data, total, c, opts)
        k = c.steps - first
        return c2, jax.tree.map(lambda buf, v: buf.at[k].set(v), recs, rec)

    return jax.lax.while_loop(cond, body, (carry, _empty_records(length, carry.theta.dtype)))


def _start(network: MarkovNetwork, evidence: Callable, theta0: Array, data: Any,
           total: Array) -> tuple[EMCarry, Array]:
    theta0 = gauge_fix(network, theta0)
    n0 = total * network.flatten(jt.marginals(network, theta0))
    loss0 = -evidence(n0, data, jnp.zeros((), total.dtype))
    zero = jnp.asarray(0, jnp.int32)
    return EMCarry(theta0, n0, zero, zero, zero, zero), loss0


@functools.partial(jax.jit, static_argnums=(0, 1))
def em_start_state(network: MarkovNetwork, evidence: Callable, theta0: Array,
                   data: Any, total: Array) -> tuple[EMCarry, Array]:
    """The carry of EM at ``θ_0`` (gauge-fixed, ``n = N·μ(θ_0)``) and the loss there."""
    return _start(network, evidence, theta0, data, total)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def em_block(network: MarkovNetwork, evidence: Callable, schedule: Callable,
             data: Any, total: Array, carry: EMCarry, limit: Array, tol: Array,
             inner_iters: Array, inner_tol: Array, smoothing: Array,
             max_halvings: Array, halve_at_rest: Array = False) -> tuple[EMCarry, EMRecord]:
    """Up to :data:`BLOCK` E-steps from ``carry``, until ``carry.moves == limit`` or a stop.

    Every argument but the network, the evidence's structure and the damping schedule is
    traced. The records hold the E-steps ``carry.steps ..`` of the input carry in order
    (``nan`` / ``False`` / 0 past the last one run). ``halve_at_rest``: where the marginals
    come to rest (change below ``tol``) after an E-step that moved ``θ`` without converging,
    halve the damping and go on while halvings are left, instead of stopping as stalled.
    """
    opts = (tol, inner_iters, inner_tol, smoothing, max_halvings, halve_at_rest)
    return _run(network, evidence, schedule, data, total, carry, limit, opts, carry.steps, BLOCK)


def em_theta(
    network: MarkovNetwork,
    evidence: Callable,
    data: Any,
    theta0: Array,
    total: Array,
    *,
    max_em_iters: int = 10,
    inner_iters: int = 50,
    tol: float = 1e-6,
    inner_tol: float = 1e-8,
    smoothing: Array = 0.0,
    damping: Any = None,
    max_halvings: int = 20,
) -> EMState:
    """Pure core of :func:`~numpyro_dpgm.estimation.cgm_em.cgm_em` with the natural-space
    E-step and its free M-step.

    Seed 002, Algorithm 2 inside one ``lax.while_loop``: ``θ_{t+1} = gauge_fix(η̂_t)`` with
    ``η̂_t`` from NLBP warm-started at ``θ_t``; stops after ``max_em_iters`` iterations or when
    ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁ < tol``; a stalled E-step is retried with half the
    damping up to ``max_halvings`` times (module docstring). No validation and no host
    transfers: ``jit``- and ``vmap``-able over ``data`` (the noisy tables of a batch of
    releases), ``theta0`` and ``total``. ``damping`` is a schedule ``t -> α_t`` (``None``:
    NLBP's natural-space default).
    """
    theta0 = jnp.asarray(theta0)
    dtype = theta0.dtype
    total = jnp.asarray(total, dtype)
    cap = max(int(max_em_iters), 1) + int(max_halvings)
    carry, _ = _start(network, evidence, theta0, data, total)
    opts = (jnp.asarray(tol, dtype), inner_iters, jnp.asarray(inner_tol, dtype),
            jnp.asarray(smoothing, dtype), max_halvings, False)
    carry, recs = _run(network, evidence, resolve_damping("natural", damping), data, total,
                       carry, max_em_iters, opts, 0, cap)
    return EMState(carry.theta, carry.n_hat, recs.objective, recs.change, recs.estep_converged,
                   carry.moves, carry.stop == _CONVERGED, recs.loss, recs.nonfinite, carry.stop,
                   recs.moved, carry.steps, carry.halvings)


class EMRun(NamedTuple):
    """What :func:`em_loop` returns: the last ``θ`` and E-step counts, the per-E-step records
    (numpy arrays, retries included), the stop reason (an entry of :data:`STOP_REASONS`) and
    the damping's halvings."""

    theta: Array
    n_hat: Array
    records: EMRecord
    stop: str
    halvings: int = 0


def em_loop(network: MarkovNetwork, evidence: Callable, data: Any, carry: EMCarry,
            total: Array, schedule: Callable, max_iters: int, opts: tuple,
            callback: Callable[[int, EMCarry, float], None] | None = None) -> EMRun:
    """EM by :func:`em_block` from ``carry`` until a stop or ``max_iters`` iterations.

    One call per :data:`BLOCK` E-steps; with a callback, one call per iteration (the same
    program), then ``callback(iteration, carry, loss)`` after it. ``opts`` are ``em_block``'s
    ``(tol, inner_iters, inner_tol, smoothing, max_halvings[, halve_at_rest])``.
    """
    chunks = []
    while True:
        k, moves = int(carry.steps), int(carry.moves)
        limit = max_iters if callback is None else moves + 1
        carry, recs = em_block(network, evidence, schedule, data, total, carry,
                               jnp.asarray(limit, jnp.int32), *opts)
        done, stop = int(carry.steps), int(carry.stop)
        chunks.append(jax.tree.map(lambda a, new=done - k: np.asarray(a)[:new], recs))
        # an E-step that returned its converged start confirms a fixed point: an iteration too
        fixed = stop == _CONVERGED and done > k and not bool(chunks[-1].moved[-1])
        if callback is not None and (int(carry.moves) > moves or fixed):
            callback(int(carry.moves) + int(fixed), carry, float(chunks[-1].loss[-1]))
        if stop or int(carry.moves) >= max_iters:
            break
    records = EMRecord(*(np.concatenate(parts) for parts in zip(*chunks, strict=True)))
    return EMRun(carry.theta, carry.n_hat, records, STOP_REASONS[stop], int(carry.halvings))
