"""Convex-GBP on a region graph (seed 003, §4 and Appendix A).

Convex-GBP (Algorithm 2, after Hazan, Peng & Shashua 2012) minimises the Lagrangian dual of
Problem 3 (the free energy ``F_κ`` over the local polytope, :mod:`.region_graph`),

.. math:: g(λ) = \\sum_{r∈V} κ_r \\log \\sum_{x_r} \\exp\\big(ψ_r(x_r)/κ_r\\big), \\qquad
          ψ_r = θ_r + \\sum_{t ∈ Ch(r)} λ_{t→r} - \\sum_{p ∈ P(r)} λ_{r→p},

by exact block-coordinate steps: the block of a region ``t`` is the set of its upward messages
``{λ_{t→p}: p ∈ P(t)}``, and its minimiser given the other blocks is Algorithm 2's update

.. math:: m_{p→t} = κ_p \\log \\sum_{x_p ∖ x_t} \\exp\\Big(\\big(ψ_p - λ_{t→p}\\big)/κ_p\\Big),

.. math:: λ_{t→p} = κ_{p,t}\\Big(θ_t + \\sum_{c∈Ch(t)} λ_{c→t}
          + \\sum_{p'∈P(t)} m_{p'→t}\\Big) - m_{p→t},

with ``κ_{p,t} = κ_p / (κ_t + Σ_{p'∈P(t)} κ_{p'})``; the beliefs are
``τ_r ∝ exp(ψ_r / κ_r)``. (In the listing of Algorithm 2 the sum over children in ``m_{p→t}``
excludes the receiving child ``t``, and the subtracted term of the ``λ`` update is the down
message ``m_{p→t}`` of the same edge; both follow from minimising ``g`` over the block.) Every
quantity is a log-table, reductions are log-sum-exps, and each message is shifted to a fixed
gauge after every update. Two schedules are offered:

``schedule="sequential"``
    the blocks are greedily coloured so that blocks of one colour touch disjoint regions; the
    colours are visited in turn and each colour's blocks are updated together. Every step is an
    exact block minimisation, so with ``κ > 0`` the dual ``g`` never increases, for any damping.
``schedule="parallel"`` (default)
    every block is updated from the same messages (Jacobi), as in the reference implementation
    of seed 003; one sweep costs one pass over the graph (a sequential sweep costs one per
    colour). With ``K`` colours, damping ``ρ ≥ 1 − 1/K`` keeps ``g`` non-increasing (the damped
    step is then a convex combination of colour-wise exact steps); the default ``ρ = 0.5`` is
    the reference implementation's, guaranteed monotone when ``K ≤ 2`` and convergent in
    practice, while ``ρ = 0`` can oscillate.

Damping ``ρ`` replaces each block by ``ρ·old + (1 − ρ)·new`` (seed 003, §6). With ``κ > 0`` the
minimum of ``g`` equals the maximum of ``θ^⊤τ + H_κ(τ)`` over ``L(G)``: :func:`log_partition`
returns ``g(λ)``, an upper bound of that optimum at every iterate and equal to it at
convergence; with ``κ ≡ 1`` it also bounds the exact ``log Z`` from above (Shearer's
inequality), and with the Möbius numbers on a tree it equals ``log Z``.

The messages are the state of the marginal oracle built on it
(:class:`~numpyro_dpgm.oracles.protocol.ConvexGBPOracle`): a pytree (:class:`GBPState`)
threaded through mirror-descent steps (warm start, seed 003 §6), so everything that touches
``θ`` is a pure function of ``(θ, state)``, ``jit``-able and ``vmap``-able with the (hashable,
cached) region graph static. All region tables and messages live in two flat vectors, and
every projection and neighbour sum is a gather with precomputed indices followed by a dense
reduction; one compiled program serves every call on a region graph (number of sweeps, damping,
tolerance and schedule are traced values), and its size does not grow with the number of
regions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..tables import CliqueTables
from ._region_layout import Layout, Plan, device_layout
from .region_graph import RegionGraph

__all__ = [
    "SCHEDULES",
    "GBPState",
    "convex_gbp",
    "dual_objective",
    "free_energy",
    "init_state",
    "local_inconsistency",
    "log_partition",
    "region_beliefs",
]

Array = Any

SCHEDULES = ("sequential", "parallel")


# ------------------------------------------------------------------------------------------------
# Message passing (pure JAX)
# ------------------------------------------------------------------------------------------------
class GBPState(NamedTuple):
    """Warm-startable state of Convex-GBP.

    Attributes
    ----------
    messages : array of shape ``(rg.num_message_cells,)``
        The dual variables ``λ_{t→p}`` of every edge ``e = (p, t)`` of
        :attr:`RegionGraph.edges`, concatenated: edge ``e``'s log-table over region ``t`` (C order,
        attributes in domain order) starts at ``rg.message_offsets[e]``; each is shifted so that
        its first cell is 0 (the dual is invariant to such shifts).
    iterations : int array
        Sweeps run so far (over every call that threaded this state).
    residual : float array
        Largest absolute change of a message in the last sweep (``inf`` before the first).
    """

    messages: Array
    iterations: Array
    residual: Array


def init_state(rg: RegionGraph, dtype: Any = None) -> GBPState:
    """All-zero messages (uniform in log space), Algorithm 2's initialisation."""
    dtype = jnp.zeros(()).dtype if dtype is None else dtype
    return GBPState(
        jnp.zeros(rg.num_message_cells, dtype=dtype),
        jnp.zeros((), dtype=jnp.int32),
        jnp.full((), jnp.inf, dtype=dtype),
    )


def _take(x: Array, index: Array) -> Array:
    """``x[index]`` for indices known to be in bounds (no wrap-around handling)."""
    return x.at[index].get(mode="promise_in_bounds")


def _reduce_sum(x: Array, plan: Plan) -> Array:
    """``out_i = Σ_j sign_ij x[index_ij]`` over the plan's rows (padding adds 0)."""
    x = jnp.concatenate([x, jnp.zeros(1, x.dtype)])
    outs = []
    for b, index in enumerate(plan.index):
        if index.shape[0] == 0 or index.shape[1] == 0:
            outs.append(jnp.zeros(index.shape[0], x.dtype))
            continue
        vals = _take(x, index)
        if plan.sign:
            vals = vals * plan.sign[b].astype(x.dtype)
        outs.append(jnp.sum(vals, axis=1))
    return _concat(outs, x.dtype)


def _concat(outs: list[Array], dtype: Any) -> Array:
    if not outs:
        return jnp.zeros(0, dtype)
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _lse_rows(vals: Array) -> Array:
    """Row-wise log-sum-exp of a matrix (rows of ``-inf`` give ``-inf``)."""
    top = jnp.max(vals, axis=1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return jnp.log(jnp.sum(jnp.exp(vals - top[:, None]), axis=1)) + top


def _reduce_logsumexp(x: Array, plan: Plan, scaled: bool = False) -> Array:
    """``out_i = log Σ_j exp(x[index_ij])`` (``κ_i log Σ_j exp(x[index_ij]/κ_i)`` if scaled)."""
    x = jnp.concatenate([x, jnp.full(1, -jnp.inf, x.dtype)])
    outs = []
    for b, index in enumerate(plan.index):
        if index.shape[0] == 0 or index.shape[1] == 0:  # no rows, or empty sums
            outs.append(jnp.full(index.shape[0], -jnp.inf, x.dtype))
            continue
        vals = _take(x, index)
        if scaled:
            k = plan.scale[b].astype(x.dtype)
            outs.append(k * _lse_rows(vals / k[:, None]))
        else:
            outs.append(_lse_rows(vals))
    return _concat(outs, x.dtype)


def _theta_cells(rg: RegionGraph, lay: Layout, log_potentials: Array | CliqueTables) -> Array:
    """Region log-potentials as one vector: each clique's table in its region, 0 elsewhere."""
    net = rg.network
    if isinstance(log_potentials, CliqueTables):
        theta = net.flatten(log_potentials)
    else:
        theta = jnp.asarray(log_potentials)
    if theta.shape != (net.num_params,):
        raise ValueError(
            f"log-potentials have shape {theta.shape}; the network expects "
            f"({net.num_params},). Use jax.vmap for a batch of parameter vectors."
        )
    if not jnp.issubdtype(theta.dtype, jnp.floating):
        theta = theta.astype(jnp.zeros(()).dtype)
    return _take(jnp.concatenate([theta, jnp.zeros(1, theta.dtype)]), lay.theta_src)


def _psi(lay: Layout, theta: Array, lam: Array) -> Array:
    """Reparameterised potentials ``ψ_r = θ_r + Σ_{t∈Ch(r)} λ_{t→r} − Σ_{p∈P(r)} λ_{r→p}``."""
    return theta + _reduce_sum(lam, lay.psi)


def _targets(rg: RegionGraph, lay: Layout, theta: Array, lam: Array) -> tuple[Array, Array]:
    """Algorithm 2's update of every message from the messages ``lam`` (exact block minimisers).

    With ``L_{p→t} = κ_p log Σ_{x_p∖x_t} exp(ψ_p/κ_p)``, Algorithm 2's down message is
    ``m_{p→t} = L_{p→t} − λ_{t→p}`` and ``S_t = θ_t + Σ_c λ_{c→t} + Σ_p m_{p→t}
    = ψ_t + Σ_p L_{p→t}``, so the new up message is ``λ_{t→p} + κ_{p,t} S_t − L_{p→t}``.
    Returns the new messages and ``S`` per message cell.
    """
    psi = _psi(lay, theta, lam)
    scaled = any(rg.kappa[p] != 1.0 for p, _ in rg.edges)
    big_l = _reduce_logsumexp(psi, lay.fan, scaled=scaled)
    s = _take(psi, lay.child) + _reduce_sum(big_l, lay.par)
    return lam + lay.weight.astype(psi.dtype) * s - big_l, s


def _sweep(
    rg: RegionGraph, lay: Layout, theta: Array, lam: Array, damping: Array, parallel: Array
) -> tuple[Array, Array]:
    """One Convex-GBP iteration: every block updated once. Returns messages and max change.

    Sequential schedule: for each colour ``k`` in turn, the blocks of colour ``k`` take their
    exact minimisers given the current messages (the others are recomputed but discarded, so one
    loop body serves every colour). Parallel schedule: one step updates every block.
    """

    def stage(k: Array, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        lam, change = carry
        new = _targets(rg, lay, theta, lam)[0]
        mixed = damping * lam + (1.0 - damping) * new
        mixed = mixed - _take(mixed, lay.first)  # first cell 0: a gauge of the dual
        mixed = jnp.where(parallel | (lay.msg_stage == k), mixed, lam)
        return mixed, jnp.maximum(change, jnp.max(jnp.abs(mixed - lam)))

    stages = jnp.where(parallel, 1, rg.num_colors)
    return jax.lax.fori_loop(0, stages, stage, (lam, jnp.zeros((), theta.dtype)))


def _log_beliefs(
    rg: RegionGraph, lay: Layout, theta: Array, lam: Array, psi: Array
) -> Array:
    """Normalised log-beliefs of every region cell.

    ``log τ_r = ψ_r/κ_r − log Σ exp(ψ_r/κ_r)`` (the last line of Algorithm 2) where ``κ_r > 0``;
    regions with ``κ_r ≤ 0`` (childless, e.g. Bethe single-attribute regions) take the block
    belief ``S_r / (κ_r + Σ_{p∈P(r)} κ_p)`` (see :func:`_targets`), which equals it at a fixed
    point whenever both are defined.
    """
    kappa = lay.cell_kappa.astype(psi.dtype)
    x = psi if all(k == 1.0 for k in rg.kappa) else psi / jnp.where(kappa > 0, kappa, 1.0)
    if any(k <= 0 for k in rg.kappa):
        s = _targets(rg, lay, theta, lam)[1]
        block = _take(s, lay.cell_msg) / lay.cell_denom.astype(psi.dtype)
        x = jnp.where(kappa > 0, x, block)
    return x - _take(_reduce_logsumexp(x, lay.region), lay.cell_region)


def _dual(rg: RegionGraph, lay: Layout, psi: Array) -> Array:
    """``g(λ) = Σ_r κ_r log Σ exp(ψ_r/κ_r)`` (``max ψ_r`` where ``κ_r = 0``) plus uncovered."""
    kappa = lay.region_kappa.astype(psi.dtype)
    safe = jnp.where(kappa != 0, kappa, 1.0)
    terms = kappa * _reduce_logsumexp(psi / _take(safe, lay.cell_region), lay.region)
    if any(k == 0 for k in rg.kappa):  # then some region exists, so the plan has rows
        x = jnp.concatenate([psi, jnp.full(1, -jnp.inf, psi.dtype)])
        top = jnp.max(_take(x, lay.region.index[0]), axis=1)
        terms = jnp.where(kappa != 0, terms, top)
    return jnp.sum(terms) + rg.log_uncovered


def _check_state(rg: RegionGraph, state: GBPState) -> None:
    if not isinstance(state, GBPState):
        raise TypeError(f"state must be a GBPState (see init_state), got {type(state).__name__}")
    shape = tuple(np.shape(state.messages))
    if shape != (rg.num_message_cells,):
        raise ValueError(
            f"state messages have shape {shape}; the region graph needs "
            f"({rg.num_message_cells},). Use jax.vmap for a batch of states."
        )


def _run(
    rg: RegionGraph,
    lay: Layout,
    theta: Array,
    state: GBPState,
    iters: Array,
    damping: Array,
    parallel: Array,
    tol: Array,
) -> GBPState:
    """Sweeps until ``iters`` more have run or the largest message change is ``≤ tol``."""
    dtype = theta.dtype
    start = GBPState(jnp.asarray(state.messages, dtype), jnp.asarray(state.iterations, jnp.int32),
                     jnp.full((), jnp.inf, dtype))
    if rg.num_message_cells == 0:
        return start
    damping = damping.astype(dtype)
    limit = start.iterations + iters

    def cond(s: GBPState) -> Array:
        return (s.iterations < limit) & ~(s.residual <= tol)

    def body(s: GBPState) -> GBPState:
        new, change = _sweep(rg, lay, theta, s.messages, damping, parallel)
        return GBPState(new, s.iterations + 1, change)

    out = jax.lax.while_loop(cond, body, start)
    # no sweep ran: keep the residual the state came with
    return out._replace(residual=jnp.where(out.iterations == start.iterations,
                                           jnp.asarray(state.residual, dtype), out.residual))


def validate_run_args(iters: int, damping: Any, schedule: str) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative integer, got {iters!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
    if isinstance(damping, (int, float)) and not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping!r}")


def _tables(rg: RegionGraph, flat: Array, regions: bool) -> CliqueTables:
    if not regions:
        return rg.network.unflatten(flat)
    off = rg.region_offsets
    return CliqueTables({
        r: jnp.reshape(flat[off[i]:off[i] + math.prod(rg.shapes[i])], rg.shapes[i])
        for i, r in enumerate(rg.regions)
    })


class _Solved(NamedTuple):
    regions: Array  # beliefs of every region cell (flat layout), scaled to ``total``
    cliques: Array  # the network cliques' tables, flat in the network's parameter layout
    log_z: Array  # the dual value g(λ) (log-partition estimate)
    state: GBPState


@functools.partial(jax.jit, static_argnames=("rg",))
def _solve(
    rg: RegionGraph,
    lay: Layout,
    log_potentials: Array | CliqueTables,
    state: GBPState,
    iters: Array,
    damping: Array,
    total: Array,
    parallel: Array,
    tol: Array,
) -> _Solved:
    """Sweeps, then beliefs and dual value: the single compiled entry point per region graph."""
    theta = _theta_cells(rg, lay, log_potentials)
    state = _run(rg, lay, theta, state, iters, damping, parallel, tol)
    psi = _psi(lay, theta, state.messages)
    beliefs = total * jnp.exp(_log_beliefs(rg, lay, theta, state.messages, psi))
    return _Solved(beliefs, _take(beliefs, lay.param_dst), _dual(rg, lay, psi), state)


def checked_solve(
    rg: RegionGraph,
    log_potentials: Array | CliqueTables,
    state: GBPState | None,
    iters: int,
    damping: Any,
    total: Any,
    schedule: str,
    tol: Any,
    layout: Layout | None = None,
) -> _Solved:
    """Check the arguments and run :func:`_solve`.

    ``layout`` is ``rg``'s index arrays (``device_layout(rg)``); passed in, possibly as traced
    values of an enclosing compiled loop, they are data of the program rather than constants
    baked into it. ``None`` takes the cached device copy.
    """
    _prepare(rg, state, iters, damping, schedule)
    dtype = _float_dtype(log_potentials)
    if state is None:
        state = init_state(rg, dtype)
    return _solve(
        rg, device_layout(rg) if layout is None else layout, log_potentials, state,
        jnp.asarray(iters, jnp.int32),
        jnp.asarray(damping, dtype), jnp.asarray(total, dtype),
        jnp.asarray(schedule == "parallel"),
        jnp.asarray(-jnp.inf if tol is None else tol, dtype))


def _float_dtype(log_potentials: Array | CliqueTables) -> Any:
    leaves = jax.tree.leaves(log_potentials)
    dtype = jnp.result_type(*leaves) if leaves else jnp.zeros(()).dtype
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.zeros(()).dtype


def _prepare(
    rg: RegionGraph, state: GBPState | None, iters: int, damping: Any, schedule: str
) -> None:
    validate_run_args(iters, damping, schedule)
    if not isinstance(rg, RegionGraph):
        raise TypeError(
            f"rg must be a RegionGraph (see build_region_graph), got {type(rg).__name__}"
        )
    if state is not None:
        _check_state(rg, state)
    if not jax.config.jax_enable_x64:
        warn_if_float32("Convex-GBP oracle")


def convex_gbp(
    rg: RegionGraph,
    log_potentials: Array | CliqueTables,
    state: GBPState | None = None,
    iters: int = 1000,
    damping: float | Array = 0.5,
    total: float | Array = 1.0,
    schedule: str = "parallel",
    tol: float | Array | None = 1e-10,
    regions: bool = False,
) -> tuple[CliqueTables, GBPState]:
    """Convex generalized belief propagation (Algorithm 2 of seed 003), warm-startable.

    Solves the approximate free-energy minimisation of Problem 3,
    ``min_{τ∈L(G)} −θ^⊤τ − H_κ(τ)``, by block-coordinate descent on its dual (see the module
    docstring), in log space with damping.

    Parameters
    ----------
    rg : RegionGraph
        Static structure and counting numbers (from :func:`build_region_graph`).
    log_potentials : array of shape ``(num_params,)`` or CliqueTables
        ``θ`` in the network's parameter layout (or as tables over its cliques); each clique's
        table is the potential of the region equal to it, other regions have ``θ_r = 0``.
    state : GBPState, optional
        Messages to start from (warm start); :func:`init_state` when ``None``.
    iters : int
        Maximum number of sweeps (each updates every block once); 1 for a warm-started step
        inside mirror descent (seed 003, §6).
    damping : float in [0, 1)
        ``ρ``: each block becomes ``ρ·old + (1 − ρ)·new``. 0.5 is the reference
        implementation's; with the sequential schedule and ``κ > 0`` any value converges and 0
        needs the fewest sweeps.
    total : float
        Beliefs are scaled to sum to ``total`` (1 for probabilities, ``N`` for counts).
    schedule : {"parallel", "sequential"}
        All blocks from the same messages (the reference implementation's Jacobi schedule), or
        colour-by-colour exact block steps (the dual never increases when ``κ > 0``).
    tol : float or None
        Stop once no message changes by more than ``tol`` in a sweep (at least one sweep is run,
        so a converged state is confirmed by one more); ``None`` runs all ``iters`` sweeps.
    regions : bool
        Return the beliefs of every region instead of the network's cliques.

    Returns
    -------
    beliefs : CliqueTables
        Pseudo-marginals ``τ`` of the network's cliques (attributes in the clique's order), or of
        every region (domain order) with ``regions=True``; each sums to ``total``.
    state : GBPState
        The messages after the last sweep, to warm-start the next call.

    Raises
    ------
    TypeError, ValueError
        on a wrong region graph, state, parameter shape, ``iters``, ``damping`` or schedule.
    """
    out = checked_solve(rg, log_potentials, state, iters, damping, total, schedule, tol)
    return _tables(rg, out.regions if regions else out.cliques, regions), out.state


def region_beliefs(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState,
    total: float | Array = 1.0,
) -> CliqueTables:
    """Beliefs ``τ_r`` of every region for the given messages (no message update)."""
    _check_state(rg, state)
    out = checked_solve(rg, log_potentials, state, 0, 0.5, total, "sequential", None)
    return _tables(rg, out.regions, True)


def dual_objective(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState
) -> Array:
    """The objective Convex-GBP minimises: the dual ``g(λ)`` of Problem 3 (module docstring).

    With ``κ > 0`` it is convex in the messages, never increases under the sequential schedule,
    and is at every iterate an upper bound of ``max_{τ∈L(G)} θ^⊤τ + H_κ(τ)``, reached at
    convergence. ``Σ_{uncovered} log k_a`` is included, so it estimates ``log Z``.
    """
    _check_state(rg, state)
    return checked_solve(rg, log_potentials, state, 0, 0.5, 1.0, "sequential", None).log_z


def log_partition(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState
) -> Array:
    """Estimate of ``log Z = A(θ)`` from the messages: the dual value :func:`dual_objective`.

    At a fixed point it equals ``−F_κ(τ)`` (Problem 3's optimal value, negated). With the
    Möbius numbers on a tree-structured region graph that is the exact ``log Z``; with
    ``κ ≡ 1`` it is an upper bound of ``log Z``.
    """
    return dual_objective(rg, log_potentials, state)


def free_energy(
    rg: RegionGraph, log_potentials: Array | CliqueTables, beliefs: CliqueTables
) -> Array:
    """Approximate free energy ``F_κ(τ) = −θ^⊤τ − Σ_r κ_r H(τ_r)`` of Problem 3.

    Parameters
    ----------
    beliefs : CliqueTables
        A table over every region (as returned with ``regions=True``), each summing to 1.

    Returns
    -------
    scalar
        ``F_κ(τ) − Σ_{uncovered} log k_a``, so that ``−F`` estimates ``log Z``. With the Möbius
        numbers this is the Kikuchi (Bethe on factor graphs) free energy.
    """
    lay = device_layout(rg)
    theta = _theta_cells(rg, lay, log_potentials)
    missing = [r for r in rg.regions if r not in beliefs]
    if missing:
        raise KeyError(f"beliefs are missing region(s) {missing}; pass regions=True output")
    tau = jnp.concatenate([jnp.ravel(beliefs[rg.regions[r]]) for r in rg.cell_order])
    safe = jnp.where(tau > 0, tau, 1.0)
    plogp = jnp.where(tau > 0, tau * jnp.log(safe), 0.0)
    kappa = lay.cell_kappa.astype(theta.dtype)
    return -jnp.dot(theta, tau) + jnp.dot(kappa, plogp) - rg.log_uncovered


def local_inconsistency(
    rg: RegionGraph, beliefs: CliqueTables, pairs: Sequence[tuple[int, int]] | None = None
) -> Array:
    """Largest ``‖P_{p→t}τ_p − τ_t‖_∞`` over the edges (Eq. (2)'s consistency constraints).

    Parameters
    ----------
    beliefs : CliqueTables
        Tables over every region (``regions=True`` output or :func:`region_beliefs`).
    pairs : sequence of (int, int), optional
        ``(p, t)`` region pairs to check; :attr:`RegionGraph.edges` by default, and
        :meth:`RegionGraph.ancestor_pairs` checks every ancestor–descendant pair.
    """
    pairs = rg.edges if pairs is None else pairs
    worst = jnp.zeros(())
    for p, t in pairs:
        rp, rt = rg.regions[p], rg.regions[t]
        keep = set(rt)
        axes = tuple(k for k, a in enumerate(rp) if a not in keep)
        proj = jnp.sum(beliefs[rp], axis=axes) if axes else beliefs[rp]
        worst = jnp.maximum(worst, jnp.max(jnp.abs(proj - beliefs[rt])))
    return worst
