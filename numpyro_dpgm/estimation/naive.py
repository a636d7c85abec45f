"""Naive MLE: project each noisy table onto the simplex, then fit by L2-regularised MLE.

This is the baseline of seed 002 (Bernstein et al. 2017, §3.1 "Noisy sufficient statistics").
Given noisy clique tables ``y_C = n_C + noise`` (Eq. 3), naive MLE

1. forms the pseudo-marginals ``μ̄_C = y_C / N`` (Prop. 4) and projects each one separately onto
   the probability simplex (Duchi et al. 2008), giving ``μ̃_C``;
2. maximises the per-record log-likelihood of Eq. (2) with ``μ̃`` in place of the data marginals,
   plus an L2 penalty:

   .. math:: \\hat θ = \\arg\\max_θ\\; θ·μ̃ − A(θ) − \\tfrac{λ}{2}\\|θ\\|^2 .

The projected tables are mutually inconsistent and have exact zeros, so ``μ̃`` lies outside the
interior of the marginal polytope and the unregularised maximum is not attained (Prop. 2 and the
"Pathologies" paragraph of §3.1). The penalty makes the objective strongly concave, so ``θ̂``
exists and is unique. The paper writes the penalty as ``λ‖θ‖²``; here it is ``(λ/2)‖θ‖²`` so that
the gradient is ``μ̃ − μ(θ) − λθ``.

The default strength follows a rule in public quantities only (the noise scale, ``N`` and the
tables' sizes), see :func:`default_l2`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..distributions.mrf import MarkovRandomField
from ..domain import Clique
from ..inference.mle import fit_theta, solve_mle
from ..inference.triangulation import DEFAULT_METHOD
from ..measurements import Measurement
from ..metrics import embed_theta
from ..network import MarkovNetwork
from ..tables import CliqueTables, project_table
from .contract import (
    check_max_iters,
    estimator,
    resolve_init,
    resolve_network,
    resolve_total,
    total_extras,
)
from .result import Result

__all__ = [
    "DEFAULT_L2_FLOOR",
    "L2_RATIO_KNEE",
    "L2_MIN_SCALE",
    "project_simplex",
    "default_l2",
    "vanishing_floor",
    "fit_mle",
    "naive_mle",
    "naive_theta",
    "project_tables",
]

Array = Any

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
# L2-regularised MLE
# ------------------------------------------------------------------------------------------------
def fit_mle(
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
) -> Result:
    """L2-regularised maximum likelihood from target marginals.

    Maximises the per-record log-likelihood of seed 002, Eq. (2) divided by ``N``, with the
    targets ``μ̂`` in place of the data marginals, and an L2 penalty:

    .. math:: \\hat θ = \\arg\\max_θ\\; θ·μ̂ − A(θ) − \\tfrac12 \\sum_i λ_i θ_i^2 ,

    whose gradient is ``μ̂ − μ(θ) − λ⊙θ`` (``∇A = μ``, §3). ``A`` comes from the exact
    junction-tree oracle and its gradient from autodiff. Solved by L-BFGS (``optax.lbfgs`` with a
    zoom line search) from ``θ = 0`` in a ``lax.while_loop`` under ``jit``
    (:func:`numpyro_dpgm.inference.mle.fit_theta`, packaged as a :class:`Result`).

    Parameters
    ----------
    network : MarkovNetwork
    mu_hat : array ``(num_params,)`` or CliqueTables
        Target marginals in the network's layout (any real values; tables need not be
        consistent, non-negative or normalised, but with λ = 0 the maximum exists only for
        targets in the interior of the marginal polytope).
    l2 : float, mapping clique -> float, or array ``(num_params,)``
        Non-negative L2 strength ``λ`` (per clique or per parameter when not a scalar).
    init : array ``(num_params,)`` or CliqueTables, optional
        Starting log-potentials (default zero, the uniform distribution).
    tol : float
        Stop when the Euclidean norm of the gradient is at most ``tol``.
    max_iters : int
        Iteration limit of L-BFGS.
    memory_size : int
        Number of curvature pairs L-BFGS keeps.
    max_linesearch_steps : int
        Limit of the zoom line search per iteration.
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic of the junction tree; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.inference.build_junction_tree`).
    tie : int array ``(num_params,)``, optional
        Parameter tying: the network's log-potentials are ``w[tie]`` for ``K = max(tie) + 1``
        free parameters ``w`` (e.g. one pairwise table shared by every step of a
        time-homogeneous chain). ``mu_hat``, ``l2`` and ``init`` then live in the free layout
        ``(K,)`` (``mu_hat`` = the tied sums ``Jᵀμ̂`` of the network's targets), the objective
        is ``w·μ̂ − A(w[tie]) − ½Σλw²`` and ``extras["free_params"]`` holds ``ŵ``.

    Returns
    -------
    Result
        ``model`` is ``MarkovRandomField(network, θ̂)``; ``loss_trace`` holds the minimised
        objective ``A(θ) − θ·μ̂ + ½Σλθ²`` at ``θ₀`` and after every iteration; ``converged``
        means the gradient norm reached ``tol``. ``extras``: ``"grad_norm"`` (final gradient
        norm), ``"l2"`` (the per-parameter λ, a numpy array), ``"stalled"`` (the line search
        could not make progress, which happens when the gradient is at round-off level).

    Raises
    ------
    TypeError
        if ``network`` is not a MarkovNetwork.
    ValueError
        for targets or initial values of the wrong shape, a negative or non-finite ``l2``,
        or non-positive ``tol``/``max_iters``.
    """
    fit = fit_theta(network, mu_hat, l2, init=init, tol=tol, max_iters=max_iters,
                    memory_size=memory_size, max_linesearch_steps=max_linesearch_steps,
                    method=method, tie=tie)
    extras = {"grad_norm": fit.grad_norm, "l2": fit.l2, "stalled": fit.stalled}
    if tie is not None:
        extras["free_params"] = fit.free_params
    return Result(
        model=MarkovRandomField(network, fit.theta, method=method),
        loss_trace=fit.loss_trace,
        iterations=fit.iterations,
        converged=fit.converged,
        elapsed=fit.elapsed,
        extras=extras,
    )


def project_tables(network: MarkovNetwork, y: Array, total: Array) -> Array:
    """``μ̃``: every clique's slice of the flat noisy tables ``y / N`` projected onto the simplex.

    Pure and ``vmap``-able (step 1 of :func:`naive_mle` for one identity release per clique).
    """
    return jnp.concatenate([
        _project_simplex(y[network.slice_of(c)] / total, jnp.asarray(1.0, dtype=y.dtype))
        for c in network.cliques
    ])


def naive_theta(
    network: MarkovNetwork,
    y: Array,
    total: Array,
    l2: Array,
    *,
    tol: float = 1e-8,
    max_iters: int = 1000,
    memory_size: int = 10,
    max_linesearch_steps: int = 30,
    method: str = DEFAULT_METHOD,
) -> tuple[Array, Array]:
    """Pure core of :func:`naive_mle` for one noisy table per clique: ``(θ̂, gradient norm)``.

    ``y`` holds the noisy tables in the network's flat layout, ``total`` is ``N`` and ``l2`` the
    per-parameter (or scalar) strength; no validation, no host transfers, so it can be
    ``jit``-ed and ``vmap``-ed over batches of releases (the trials of an experiment). The loss
    trace and diagnostics of :func:`fit_mle` are dropped.
    """
    y = jnp.asarray(y)
    mu = project_tables(network, y, jnp.asarray(total, dtype=y.dtype))
    lam = jnp.broadcast_to(jnp.asarray(l2, dtype=y.dtype), mu.shape)
    state = solve_mle(network, mu, lam, jnp.zeros_like(mu), tol=tol, max_iters=max_iters,
                      memory_size=memory_size, max_linesearch_steps=max_linesearch_steps,
                      method=method)
    return state.theta, jnp.linalg.norm(state.grad)


# ------------------------------------------------------------------------------------------------
# Naive MLE from measurements
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


class _Combined(NamedTuple):
    """Inverse-variance average of the identity measurements of one network clique."""

    table: np.ndarray  # in the network clique's axis order
    variance: float  # per-cell noise variance of the average
    count: int


def _is_identity(m: Measurement) -> bool:
    if m.query is None:
        return True
    q = m.query
    return q.shape[0] == q.shape[1] and bool(np.array_equal(q, np.eye(q.shape[0])))


def _combine(
    measurements: Sequence[Measurement], network: MarkovNetwork, non_identity: str
) -> tuple[dict[Clique, _Combined], tuple[int, ...]]:
    """Group identity measurements by network clique; average each group (inverse variance)."""
    by_set = {frozenset(c): c for c in network.cliques}
    groups: dict[Clique, list[tuple[np.ndarray, float]]] = {}
    ignored = []
    for k, m in enumerate(measurements):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{k}] is a {type(m).__name__}, not a Measurement")
        clique = network.domain.check_clique(m.clique)
        shape = network.domain.shape_of(clique)
        if m.num_cells != math.prod(shape):
            raise ValueError(
                f"measurement {k} of clique {clique} covers {m.num_cells} cells; the domain "
                f"gives that clique {math.prod(shape)} cells (shape {shape})"
            )
        if not _is_identity(m):
            if non_identity == "ignore":
                ignored.append(k)
                continue
            raise ValueError(
                f"measurement {k} of clique {clique} answers a non-identity query; naive MLE "
                "projects whole noisy tables onto the simplex. Pass non_identity='ignore' to "
                "skip such measurements, or use an estimator for general linear measurements "
                "(prox_pgm, cgm_em)"
            )
        target = by_set.get(frozenset(clique))
        if target is None:
            raise ValueError(
                f"measurement {k} is of clique {clique}, which is not a clique of the network "
                f"{list(network.cliques)}; add it with network.with_cliques([...])"
            )
        table = project_table(np.reshape(m.values, shape), clique, target)  # a transpose
        groups.setdefault(target, []).append((np.asarray(table, dtype=float), m.noise.variance))
    combined = {}
    for c, items in groups.items():
        weights = np.array([1.0 / v for _, v in items])
        table = sum(w * t for w, (t, _) in zip(weights, items, strict=True)) / weights.sum()
        combined[c] = _Combined(np.asarray(table), float(1.0 / weights.sum()), len(items))
    return combined, tuple(ignored)


@estimator("naive", legacy_positional=("total_count", "l2"))
def naive_mle(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: Any = None,
    max_iters: int = 10_000,
    callback: Callable[[int, float], None] | None = None,
    l2: float | None = None,
    l2_floor: float | None = None,
    l2_scale: float = 1.0,
    unmeasured: str = "error",
    non_identity: str = "error",
    tol: float = 1e-8,
    memory_size: int = 10,
    method: str = DEFAULT_METHOD,
) -> Result:
    """Naive MLE of seed 002, §3.1: simplex-projected noisy marginals, then regularised MLE.

    For every clique ``C`` of the network, its identity measurements ``y_C`` (Eq. 3) are averaged
    with weights ``1/v`` (``v`` the per-cell noise variance) when there are several, divided by
    ``N`` and projected onto the probability simplex (:func:`project_simplex`) to give ``μ̃_C``;
    then ``θ̂ = argmax θ·μ̃ − A(θ) − (λ/2)‖θ‖²`` by :func:`fit_mle`.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy tables. Each measurement's clique must be a clique of ``network`` up to the order
        of its attributes (tables are transposed to the network's order).
    network_or_domain : MarkovNetwork, Domain or mapping attribute -> size
        The model's cliques; given a domain, the maximal measured cliques.
    total_count : float or None
        ``N``, treated as public. ``None`` estimates it from the measurements (the
        inverse-variance weighted average of the noisy table sums, clipped below at 1), which is
        post-processing of the release.
    rng_key : JAX PRNG key, optional
        Accepted for the estimators' common contract and ignored (naive MLE is deterministic).
    init : MarkovRandomField or array, optional
        Warm start of L-BFGS: a previous fit's model or log-potentials in the network's layout
        (entries of unmeasured cliques are ignored). ``None``: ``θ = 0``.
    max_iters : int
        Iteration limit of L-BFGS (the main loop). The default, 10,000, is a bound, not a cost:
        the fit stops at ``tol``. Weak penalties need thousands of iterations (Adult's demo tree
        at ε = 10: about 2,000).
    callback : callable ``(iteration, loss) -> None``, optional
        Called once after the fit with every entry of the loss trace, ``(k, loss_trace[k])``
        for ``k = 0..iterations`` (L-BFGS runs compiled, in one piece).
    l2 : float, optional
        L2 strength ``λ`` for every parameter. ``None`` (default) applies the documented rule of
        :func:`default_l2` per clique: ``λ_C = max(s_C·b_C/N, l2_floor)``, where ``b_C`` is the
        Laplace-equivalent scale ``sqrt(v_C / 2)`` of the per-cell noise variance ``v_C`` of the
        clique's (averaged) measurement and ``s_C = min(1, max(0.3, b_C·K_C/(0.3·N)))`` weakens
        the penalty where the noise is small against the mean count ``N/K_C`` of the clique's
        ``K_C`` cells (so that the fit's error on the released tables falls to the noisy
        tables' own or below). With noise large against the counts, as in seed 002's release
        (Eq. 3, ``b = |C|/ε``) at ε = 0.1 with ``N ≤ 10⁴`` or at ε = 1 with ``N = 10³``, this is
        ``λ = max(b/N, l2_floor)``.
    l2_scale : float
        Multiplier of the default rule, ``λ_C = max(l2_scale·s_C·b_C/N, l2_floor)`` (e.g. CGM-EM
        may start from a deliberately smoother fit).
    l2_floor : float, optional
        Floor of the default rule (ignored when ``l2`` is given). ``None`` (default):
        :func:`vanishing_floor` of ``N``, ``min(10⁻⁴, 1/(N·ln(e·N)))``, so that the
        regularisation vanishes with the noise: as ``b → 0`` the fit's error on the released
        marginals falls to the noisy tables' own (about a record per cell).
    unmeasured : {"error", "zero"}
        What to do with network cliques that no measurement covers. ``"error"`` (default) raises.
        ``"zero"`` fixes their log-potentials at zero and fits the others: with nothing measured
        about a clique, the fit adds no interaction there, which is the same as fitting the
        network of the measured cliques alone.
    non_identity : {"error", "ignore"}
        Measurements of general linear queries (not the identity) cannot be projected onto the
        simplex: ``"error"`` (default) raises, ``"ignore"`` skips them (listed in
        ``extras["ignored"]``).
    tol, memory_size, method
        Passed to :func:`fit_mle`.

    Returns
    -------
    Result
        ``model`` holds ``θ̂`` in ``network``'s layout. ``loss_trace`` is the minimised
        objective ``A(θ) − θ·μ̃ + (λ/2)‖θ‖²`` (per record) at ``θ = 0`` and after every L-BFGS
        iteration. ``extras``:

        - ``"l2"``: dict clique -> λ used for the clique's parameters (measured cliques);
        - ``"l2_rule"``: the default rule with its constants and floor, or ``"given"``;
        - ``"noise_scale"``: dict clique -> Laplace-equivalent scale ``b_C`` of its target;
        - ``"total_count"``: the ``N`` used, and ``"total_count_estimated"`` (bool);
        - ``"mu_tilde"``: CliqueTables of the projected targets of the measured cliques;
        - ``"unmeasured"``: cliques whose log-potentials were fixed at zero;
        - ``"ignored"``: indices of skipped non-identity measurements;
        - ``"grad_norm"``, ``"stalled"``: from :func:`fit_mle`.

    Raises
    ------
    TypeError
        for a network that is not a MarkovNetwork or items that are not Measurements.
    KeyError
        for a measurement over an attribute not in the domain.
    ValueError
        for no usable measurement, a measurement whose size does not match its clique or whose
        clique is not in the network, non-identity queries (by default), unmeasured cliques
        (by default), ``total_count ≤ 0``, a negative ``l2``, or unknown option values.
    """
    start = time.perf_counter()
    if unmeasured not in ("error", "zero"):
        raise ValueError(f"unmeasured must be 'error' or 'zero', got {unmeasured!r}")
    if non_identity not in ("error", "ignore"):
        raise ValueError(f"non_identity must be 'error' or 'ignore', got {non_identity!r}")
    if isinstance(measurements, Measurement):
        measurements = [measurements]
    measurements = list(measurements)
    if not measurements:
        raise ValueError("naive_mle needs at least one measurement")
    network, measurements = resolve_network(network_or_domain, measurements)
    max_iters = check_max_iters(max_iters)
    theta_init = resolve_init(init, network)
    if l2 is not None:
        lam_given = float(l2)
        if not math.isfinite(lam_given) or lam_given < 0:
            raise ValueError(f"l2 must be finite and non-negative, got {l2}")

    combined, ignored = _combine(measurements, network, non_identity)
    if not combined:
        raise ValueError("no identity measurement left: naive MLE has nothing to fit")
    missing = tuple(c for c in network.cliques if c not in combined)
    if missing and unmeasured == "error":
        raise ValueError(
            f"network clique(s) {list(missing)} have no measurement. Measure them, drop them "
            "from the network, or pass unmeasured='zero' to hold their log-potentials at zero"
        )

    n_total, estimated = resolve_total(
        total_count, [m for k, m in enumerate(measurements) if k not in ignored])

    fit_net = network if not missing else MarkovNetwork(
        network.domain, [c for c in network.cliques if c in combined])
    scales = {c: math.sqrt(combined[c].variance / 2.0) for c in fit_net.cliques}
    if l2 is None:
        if not math.isfinite(l2_scale) or l2_scale <= 0:
            raise ValueError(f"l2_scale must be a positive number, got {l2_scale}")
        if l2_floor is None:
            l2_floor = vanishing_floor(n_total)
        lam = {c: max(l2_scale * default_l2(scales[c], n_total, 0.0,
                                            cells=network.domain.size(c)), l2_floor)
               for c in fit_net.cliques}
        factor = "" if l2_scale == 1 else f"{l2_scale:g}·"
        rule = (f"max({factor}s·b/N, {l2_floor:g}), s = min(1, max({L2_MIN_SCALE:g}, "
                f"b·K/({L2_RATIO_KNEE:g}·N)))")
    else:
        lam = dict.fromkeys(fit_net.cliques, lam_given)
        rule = "given"

    dtype = jnp.result_type(float)
    mu_tilde = CliqueTables({
        c: project_simplex(jnp.asarray(combined[c].table / n_total, dtype=dtype))
        for c in fit_net.cliques
    })
    if theta_init is not None and fit_net is not network:
        theta_init = jnp.concatenate([theta_init[network.slice_of(c)] for c in fit_net.cliques])
    fit = fit_mle(fit_net, mu_tilde, lam, init=theta_init, tol=tol, max_iters=max_iters,
                  memory_size=memory_size, method=method)
    if callback is not None:
        for k, value in enumerate(np.asarray(fit.loss_trace)):
            callback(k, float(value))
    theta = fit.theta if fit_net is network else embed_theta(fit_net, fit.theta, network)
    extras = {
        "l2": lam,
        "l2_rule": rule,
        "noise_scale": scales,
        **total_extras(n_total, estimated),
        "init": "zeros" if theta_init is None else "given",
        "mu_tilde": mu_tilde,
        "unmeasured": missing,
        "ignored": ignored,
        "grad_norm": fit.extras["grad_norm"],
        "stalled": fit.extras["stalled"],
    }
    return Result(
        model=MarkovRandomField(network, theta, method=method),
        loss_trace=fit.loss_trace,
        iterations=fit.iterations,
        converged=fit.converged,
        elapsed=time.perf_counter() - start,
        extras=extras,
    )
