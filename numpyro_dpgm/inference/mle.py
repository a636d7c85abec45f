"""The inverse of marginal inference: log-potentials whose marginals match given targets.

``θ̂ = argmax_θ θ·μ̂ − A(θ) − ½ Σ λ_i θ_i²`` (the per-record log-likelihood of seed 002, Eq. 2,
with the targets ``μ̂`` in place of the data marginals, plus an L2 penalty), solved by L-BFGS
(``optax.lbfgs`` with a zoom line search) on the exact junction-tree log-partition inside one
``lax.while_loop``. With ``λ = 0`` and ``μ̂`` in the interior of the marginal polytope this is
moment matching, the M-step of every EM variant; with ``λ > 0`` it is the naive estimator's fit
(:func:`numpyro_dpgm.estimation.naive.fit_mle` wraps :func:`fit_theta` into a ``Result``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

from .._precision import warn_if_float32
from ..network import MarkovNetwork
from . import junction_tree as jt
from .triangulation import DEFAULT_METHOD

__all__ = ["LBFGSState", "MLEFit", "check_tie", "fit_theta", "solve_mle"]

Array = Any


class MLEFit(NamedTuple):
    """Output of :func:`fit_theta`.

    Attributes
    ----------
    theta : array ``(num_params,)``
        The fitted log-potentials (network layout, ties expanded).
    free_params : array ``(K,)`` or None
        The free parameters ``ŵ`` of a tied fit (``None`` without ``tie``).
    loss_trace : numpy array
        The minimised objective ``A(θ) − θ·μ̂ + ½Σλθ²`` at ``θ₀`` and after every iteration.
    iterations : int
    converged : bool
        The gradient norm reached ``tol``.
    grad_norm : float
        Final gradient norm.
    l2 : numpy array
        The per-parameter ``λ``.
    stalled : bool
        The line search could not make progress (a gradient at round-off level).
    elapsed : float
        Seconds of the solve.
    """

    theta: Array
    free_params: Array | None
    loss_trace: np.ndarray
    iterations: int
    converged: bool
    grad_norm: float
    l2: np.ndarray
    stalled: bool
    elapsed: float


class LBFGSState(NamedTuple):
    """Loop state of :func:`solve_mle` (all arrays, so it can be a ``while_loop`` carry)."""

    theta: Array
    opt_state: Any
    iteration: Array
    value: Array
    grad: Array
    stalled: Array
    trace: Array


def _l2_vector(network: MarkovNetwork, l2: Any) -> np.ndarray:
    """Validate ``l2`` (scalar, per-clique mapping or per-parameter vector) -> per-parameter."""
    if isinstance(l2, Mapping):
        missing = [c for c in network.cliques if c not in l2]
        if missing:
            raise ValueError(f"l2 mapping lacks clique(s) {missing}")
        vec = np.concatenate([np.full(s, float(l2[c])) for c, s in
                              zip(network.cliques, network.sizes, strict=True)])
    else:
        arr = np.asarray(l2, dtype=float)
        if arr.ndim == 0:
            vec = np.full(network.num_params, float(arr))
        elif arr.shape == (network.num_params,):
            vec = arr
        else:
            raise ValueError(
                f"l2 has shape {arr.shape}; expected a scalar or ({network.num_params},)"
            )
    if not np.all(np.isfinite(vec)) or np.any(vec < 0):
        raise ValueError("the L2 strength must be finite and non-negative")
    return vec


def check_tie(network: MarkovNetwork, tie: Any) -> tuple[np.ndarray, int]:
    """Validate a parameter tying ``θ = w[tie]``; return ``(tie, K)`` (identity when ``None``)."""
    if tie is None:
        return np.arange(network.num_params), network.num_params
    idx = np.asarray(tie)
    if idx.shape != (network.num_params,) or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(
            f"tie must be an integer array of shape ({network.num_params},) mapping every "
            f"parameter of the network to a free parameter; got {idx.dtype} {idx.shape}")
    k = int(idx.max()) + 1
    if idx.min() < 0 or len(np.unique(idx)) != k:
        raise ValueError("tie must use every free-parameter index 0..K-1 at least once")
    return idx, k


def _as_param_vector(network: MarkovNetwork, x: Any, name: str) -> Array:
    if isinstance(x, Mapping):  # CliqueTables or a plain dict
        tables = {}
        for c in network.cliques:
            if c not in x:
                raise ValueError(f"{name} lacks clique {c} of the network")
            tables[c] = x[c]
        x = network.flatten(tables)
    x = jnp.asarray(x)
    if x.shape != (network.num_params,):
        raise ValueError(
            f"{name} has shape {x.shape}; the network expects ({network.num_params},)"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


@functools.partial(
    jax.jit, static_argnames=("network", "capacity", "memory_size", "max_linesearch_steps",
                              "method"))
def _fit(
    network: MarkovNetwork,
    mu_hat: Array,
    l2: Array,
    theta0: Array,
    tol: Array,
    max_iters: Array,
    capacity: int,
    memory_size: int,
    max_linesearch_steps: int,
    method: str,
    tie: Array | None = None,
) -> LBFGSState:
    """L-BFGS on the negated objective ``A(θ) − θ·μ̂ + ½ Σ λ_i θ_i²`` inside one while loop.

    ``max_iters`` is traced (no recompilation when it changes); the loss trace has the static
    length ``capacity ≥ max_iters + 1``.
    """

    def loss(theta: Array) -> Array:
        full = theta if tie is None else theta[tie]
        return (jt.log_partition(network, full, method) - jnp.dot(theta, mu_hat)
                + 0.5 * jnp.sum(l2 * theta**2))

    opt = optax.lbfgs(
        memory_size=memory_size,
        linesearch=optax.scale_by_zoom_linesearch(
            max_linesearch_steps=max_linesearch_steps, initial_guess_strategy="one"),
    )
    value0, grad0 = jax.value_and_grad(loss)(theta0)
    trace = jnp.full((capacity,), jnp.nan, dtype=theta0.dtype).at[0].set(value0)
    init = LBFGSState(theta0, opt.init(theta0), jnp.asarray(0), value0, grad0,
                       jnp.asarray(False), trace)

    def cond(s: LBFGSState) -> Array:
        return (s.iteration < max_iters) & (otu.tree_norm(s.grad) > tol) & ~s.stalled

    def body(s: LBFGSState) -> LBFGSState:
        updates, opt_state = opt.update(
            s.grad, s.opt_state, s.theta, value=s.value, grad=s.grad, value_fn=loss)
        theta = optax.apply_updates(s.theta, updates)
        # the zoom line search stores the value and gradient at the accepted point
        value = otu.tree_get(opt_state, "value")
        grad = otu.tree_get(opt_state, "grad")
        it = s.iteration + 1
        # a failed line search returns a zero step: nothing further can change
        stalled = jnp.all(updates == 0)
        return LBFGSState(theta, opt_state, it, value, grad, stalled, s.trace.at[it].set(value))

    return jax.lax.while_loop(cond, body, init)


def solve_mle(
    network: MarkovNetwork, mu_hat: Array, l2: Array, theta0: Array, *, tol: float,
    max_iters: int, memory_size: int = 10, max_linesearch_steps: int = 30,
    method: str = DEFAULT_METHOD, tie: Array | None = None,
) -> LBFGSState:
    """Pure core of :func:`fit_theta`: the final L-BFGS state, no validation, no host transfers.

    ``jit``- and ``vmap``-able over ``mu_hat``, ``l2`` and ``theta0`` (per-parameter arrays of
    the network's layout, or of the free layout with ``tie``).
    """
    capacity = max(1024, 1 << int(max_iters).bit_length())  # ≥ max_iters + 1, few sizes
    mu_hat = jnp.asarray(mu_hat)
    return _fit(network, mu_hat, l2, theta0, jnp.asarray(tol, dtype=mu_hat.dtype),
                jnp.asarray(int(max_iters)), capacity, int(memory_size),
                int(max_linesearch_steps), method, tie)


def fit_theta(
    network: MarkovNetwork,
    mu_hat: Any,
    l2: Any,
    *,
    init: Any = None,
    tol: float = 1e-8,
    max_iters: int = 1000,
    memory_size: int = 10,
    max_linesearch_steps: int = 30,
    method: str = DEFAULT_METHOD,
    tie: Any = None,
) -> MLEFit:
    """L2-regularised maximum likelihood from target marginals: ``θ̂`` and how the solver ended.

    :math:`\\hat θ = \\arg\\max_θ\\; θ·μ̂ − A(θ) − \\tfrac12 \\sum_i λ_i θ_i^2` by L-BFGS on the
    exact junction-tree ``A``; the parameters are those of
    :func:`numpyro_dpgm.estimation.naive.fit_mle`, which wraps the answer into a ``Result``.

    Returns
    -------
    MLEFit

    Raises
    ------
    TypeError
        if ``network`` is not a MarkovNetwork.
    ValueError
        for targets or initial values of the wrong shape, a negative or non-finite ``l2``,
        or non-positive ``tol``/``max_iters``.
    """
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    if tie is None:
        mu = _as_param_vector(network, mu_hat, "mu_hat")
        lam = _l2_vector(network, l2)
        theta0 = (jnp.zeros(network.num_params, dtype=mu.dtype) if init is None
                  else _as_param_vector(network, init, "init").astype(mu.dtype))
    else:
        tie, free = check_tie(network, tie)
        mu = jnp.asarray(mu_hat, dtype=jnp.result_type(float))
        if mu.shape != (free,):
            raise ValueError(f"mu_hat has shape {mu.shape}; the tied layout has ({free},)")
        lam = np.broadcast_to(np.asarray(l2, dtype=float), (free,))
        if not np.all(np.isfinite(lam)) or np.any(lam < 0):
            raise ValueError("the L2 strength must be finite and non-negative")
        theta0 = (jnp.zeros(free, dtype=mu.dtype) if init is None
                  else jnp.asarray(init, dtype=mu.dtype))
        if theta0.shape != (free,):
            raise ValueError(f"init has shape {theta0.shape}; expected ({free},)")
        tie = jnp.asarray(tie)
    if not bool(jnp.all(jnp.isfinite(mu))):
        raise ValueError("mu_hat has non-finite values")
    if not math.isfinite(tol) or tol <= 0:
        raise ValueError(f"tol must be positive, got {tol}")
    for name, val in (("max_iters", max_iters), ("memory_size", memory_size),
                      ("max_linesearch_steps", max_linesearch_steps)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val}")
    if mu.dtype == jnp.float32:
        warn_if_float32("fit_mle")
    start = time.perf_counter()
    state = solve_mle(network, mu, jnp.asarray(lam, dtype=mu.dtype), theta0, tol=tol,
                      max_iters=max_iters, memory_size=memory_size,
                      max_linesearch_steps=max_linesearch_steps, method=method, tie=tie)
    state = jax.block_until_ready(state)
    elapsed = time.perf_counter() - start
    iters = int(state.iteration)
    grad_norm = float(jnp.linalg.norm(state.grad))
    return MLEFit(
        theta=state.theta if tie is None else state.theta[tie],
        free_params=None if tie is None else state.theta,
        loss_trace=np.asarray(state.trace[: iters + 1]),
        iterations=iters,
        converged=grad_norm <= tol,
        grad_norm=grad_norm,
        l2=lam,
        stalled=bool(state.stalled),
        elapsed=elapsed,
    )
