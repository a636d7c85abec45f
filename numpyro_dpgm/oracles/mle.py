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

__all__ = ["DEFAULT_L2_FLOOR", "L2_MIN_SCALE", "L2_RATIO_KNEE", "LBFGSState", "MLEFit", "check_tie",
           "default_l2", "fit_theta", "project_simplex", "solve_mle", "vanishing_floor"]

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
        loss_trace=np.asarray(state.trace)[: iters + 1],  # on the host: no program per length
        iterations=iters,
        converged=grad_norm <= tol,
        grad_norm=grad_norm,
        l2=lam,
        stalled=bool(state.stalled),
        elapsed=elapsed,
    )


#: Smallest L2 strength of the default rule (see :func:`default_l2`).
DEFAULT_L2_FLOOR = 1e-4

#: Noise-to-count ratio ``r = b·K/N`` below which the default rule weakens ``b/N``
#: (see :func:`default_l2`).
L2_RATIO_KNEE = 0.3

#: Smallest multiplier of ``b/N`` in the default rule (reached at ``r ≤ 0.09``).
L2_MIN_SCALE = 0.3


# ------------------------------------------------------------------------------------------------
# Simplex projection
# ------------------------------------------------------------------------------------------------
def project_simplex(v: Array, total: Array = 1.0) -> Array:
    """Euclidean projection onto the scaled simplex ``{w ≥ 0, Σ w = total}``.

    The sort-based algorithm of Duchi, Shalev-Shwartz, Singer & Chandra (2008), Fig. 1, which
    seed 002 (§3.1) applies to every noisy clique marginal: sort ``v`` decreasingly into ``u``,
    let ``ρ`` be the largest ``j`` with ``u_j − (Σ_{r≤j} u_r − total)/j > 0``, set
    ``τ = (Σ_{r≤ρ} u_r − total)/ρ`` and return ``w = max(v − τ, 0)``. ``O(K log K)`` for ``K``
    entries; the result has exact zeros where ``v ≤ τ``.

    Parameters
    ----------
    v : array
        Any shape; the whole array is projected as one vector (raveled in C order) and the result
        has ``v``'s shape.
    total : float
        The simplex's total, ``> 0``.

    Returns
    -------
    array
        ``argmin_w ‖w − v‖₂`` subject to ``w ≥ 0`` and ``Σ w = total``.

    Notes
    -----
    Pure JAX, so it can be ``jit``-ed and ``vmap``-ed (over leading axes via ``vmap``). A concrete
    ``total`` is validated; a traced one is not.

    Examples
    --------
    >>> import numpy as np
    >>> np.asarray(project_simplex(np.array([0.5, 1.5, -1.0])))
    array([0., 1., 0.])
    """
    v = jnp.asarray(v)
    if v.size == 0:
        raise ValueError("cannot project an empty array onto the simplex")
    if not jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(jnp.result_type(float))
    if not isinstance(total, jax.core.Tracer):
        t = float(np.asarray(total))
        if not math.isfinite(t) or t <= 0:
            raise ValueError(f"the simplex total must be a positive finite number, got {t}")
    return _project_simplex(v, jnp.asarray(total, dtype=v.dtype))


@jax.jit
def _project_simplex(v: Array, total: Array) -> Array:
    flat = jnp.ravel(v)
    u = jnp.sort(flat)[::-1]
    css = jnp.cumsum(u) - total
    j = jnp.arange(1, flat.size + 1, dtype=flat.dtype)
    # u_j − css_j / j > 0 holds for j = 1..ρ and fails after (Duchi et al. 2008, Lemma 2)
    rho = jnp.sum(u * j > css)
    tau = css[rho - 1] / rho.astype(flat.dtype)
    return jnp.reshape(jnp.maximum(flat - tau, 0.0), v.shape)


# ------------------------------------------------------------------------------------------------
# The default L2 strength (naive MLE's rule)
# ------------------------------------------------------------------------------------------------
def vanishing_floor(total_count: float) -> float:
    """The floor of :func:`naive_mle`'s default L2 rule: ``min(10⁻⁴, 1/(N·ln(e·N)))``.

    At the maximiser, a cell's fitted marginal differs from its projected target by
    ``λ|θ|``; an empty cell's log-potential grows like ``ln(1/λ)``, so the bias is about
    ``λ·ln(1/λ)``, which this floor keeps at about ``1/N`` (one record; at most ``1.2/N`` for
    ``N ≤ 10⁷``): with negligible noise the fit reproduces the released tables to within about a
    record, while the maximiser stays finite where cells are empty.

    >>> round(vanishing_floor(1e4) * 1e4 * math.log(math.e * 1e4), 12)
    1.0
    >>> vanishing_floor(10.0) == DEFAULT_L2_FLOOR
    True
    """
    n = max(float(total_count), 1.0)
    return min(DEFAULT_L2_FLOOR, 1.0 / (n * math.log(math.e * n)))


def default_l2(noise_scale: float, total_count: float, floor: float = DEFAULT_L2_FLOOR,
               cells: int | None = None) -> float:
    """The default L2 strength ``λ = max(s·b/N, floor)`` of naive MLE.

    Parameters
    ----------
    noise_scale : float
        ``b``: the Laplace scale of the noise on every cell of a table, or for other noise its
        Laplace-equivalent scale ``b = sqrt(variance / 2)`` (the Laplace scale with the same
        variance); ``0`` for exact counts.
    total_count : float
        ``N``, the number of records.
    floor : float
        Lower bound on ``λ``.
    cells : int, optional
        ``K``, the number of cells of the table. ``None``: ``s = 1``, the rule ``max(b/N,
        floor)`` of seed 002's experiments. Given, ``s = min(1, max(0.3, r/0.3))`` with the
        noise-to-count ratio ``r = b·K/N`` (the noise scale over the mean count of a cell):
        the strength falls to ``0.3·b/N`` where the noise is small against the counts
        (``r ≤ 0.09``). See Notes.

    Notes
    -----
    Both inputs are public (the noise distribution is part of the release; ``N`` is public or
    estimated from the release), so the rule never looks at the private data.

    Reasoning. The stationarity condition of the regularised MLE is ``μ̃ − μ(θ̂) = λθ̂``: ``λ|θ|``
    is how far a fitted marginal may stay from its projected noisy target. The noise on a
    pseudo-marginal cell ``y/N`` has standard deviation ``√2·b/N`` (seed 002, Eq. 4), and log-
    potentials of fitted models are of order one, so ``λ ≈ b/N`` lets the fit ignore deviations of
    the order of the noise while following the signal above it. With too small a λ the fit chases
    the zeros the projection creates, driving marginals to vanishingly small values and the KL
    to the truth to large values (§3.1, "Pathologies", Fig. 1c). On 10-node third-order chains
    with 10 values per attribute, ``N = 10⁴`` and Laplace noise ``b = 24/ε``, the λ that minimised
    the KL to the true model (found with the true model, which a release cannot use) was between
    ``0.5·b/N`` and ``4·b/N`` at ``ε = 1`` and ``ε = 0.1``, while a fixed ``λ = 10⁻³`` was up to
    ~13 times worse at ``ε = 0.1``. ``λ = b/N`` lies inside that range.

    The floor (default ``10⁻⁴``) keeps the maximiser finite when the noise is negligible: even
    exact counts have empty cells, where the unregularised MLE does not exist.

    Where the noise is small against the counts, ``b/N`` regularises too much: the bias
    ``λ|θ|`` grows with the log-potentials (several units for cells of probability 10⁻³), so
    it exceeds the noise itself (``√2·b/N`` per cell) and the fit's error on the released
    tables stays above that of the noisy tables. ``python -m benchmarks naive_l2`` measured
    this on seed 002's 10-value models (``N`` = 10³–10⁵), a 5-value chain, Adult's demo tree
    and Titanic's tree, Laplace noise at ε ∈ {0.1, 1, 10}, two releases per row, every fit run
    to convergence (``benchmarks/results/naive_l2-cpu.json``). With ``s = 1`` the mean L1 on
    the released tables was above the clipped noisy tables' on 11 of the 13 rows with
    ``r ≤ 0.14``, by up to 34 % (the third-order chain with ``N = 10⁵`` at ε = 10: 0.00309
    against 0.00241). With this rule it was at or below them on 25 of the 27 rows and within
    0.4 % on the other two (0.00143 against 0.00142), and lower than with ``s = 1`` on every
    row where the two differ (Adult at ε = 10: 0.0078 against 0.0097). The price is in the KL to
    the population where many small cells are projected to zero: the 5-value chain at
    ε = 0.1 (``r = 0.06``) 0.295 against 0.228 with ``s = 1``; elsewhere the KL was lower or
    within 7 %. ``s = 0.1`` everywhere lowered the L1 by at most 4 % more but raised that KL
    to 0.547 (and the chain's with ``r = 0.024`` by 22 %), at twice the iterations. On a chain
    of random potentials (two 216-cell tables, ``N = 10⁵``, ``r = 0.004``; the test suite's)
    the rule stays 3 % above the noisy tables, where ``s = 0.1`` would end 2 % below them.
    ``cells`` turns the rule on; all its inputs are public.
    """
    b, n, f = float(noise_scale), float(total_count), float(floor)
    if not math.isfinite(b) or b < 0:
        raise ValueError(f"noise_scale must be finite and non-negative, got {b}")
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"total_count must be positive, got {n}")
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"floor must be finite and non-negative, got {f}")
    if cells is None:
        return max(b / n, f)
    if isinstance(cells, bool) or int(cells) != cells or cells < 1:
        raise ValueError(f"cells must be a positive integer, got {cells!r}")
    s = min(1.0, max(L2_MIN_SCALE, b * int(cells) / (n * L2_RATIO_KNEE)))
    return max(s * b / n, f)
