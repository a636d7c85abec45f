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

The default is ``"l2"`` for every noise (its variance weights the terms; Private-PGM's default
too): on Adult's tree workload with Laplace noise, 1,000 iterations of the L1 path left the
released marginals at 2.2× the error of the L2 fit (ε = 1), and with almost no noise the L1
path's steps, scaled by ``b``, barely moved (a 9-attribute forest at ε = 1000 stayed at 0.83
mean L1 while the noisy tables were at 0.0000).

The iteration scheme (``method``) is, by default with the exact oracle, the accelerated
Bregman gradient method with function restart of
:mod:`~numpyro_dpgm.estimation.mirror_descent` (each iteration one oracle call; the fit
returned is the best oracle point), and plain mirror descent (``"md"``, Algorithm 1) with an
approximate oracle. Plain mirror descent follows an Armijo rule: start from
``α₀ = 2/(L_∇·N)`` with ``L_∇`` the Lipschitz constant of ``∇L``, accept a trial step when it
gives sufficient decrease ``f(μ) − f(μ') ≥ ½⟨∇f(μ), μ − μ'⟩`` (then ``α ← 1.1α``, or by
Private-PGM's 1.01 with a warm-started approximate oracle; see
:mod:`~numpyro_dpgm.estimation.mirror_descent`), otherwise reject it and halve ``α``. The
objective is therefore non-increasing (with either scheme).

The L1 loss is not differentiable where a residual vanishes, which is where its minimisers
sit, and a subgradient step with this line search stalls there (on a 3-attribute chain the loss
stopped at twice the optimum found by linear programming). Its terms are therefore minimised
through the Huber function ``h_δ(r)`` (``r²/(2δ)`` for ``|r| ≤ δ``, ``|r| − δ/2`` beyond), a
smooth approximation with ``|r| − δ/2 ≤ h_δ(r) ≤ |r|`` (Nesterov 2005), by continuation:
``δ_M = s·b_M`` starts at ``s = 1`` and ``s`` is halved whenever the smoothed problem has
stopped improving, until the smoothing gap ``s·m/2`` (``m`` L1 answers) is below the tolerance.
``loss_trace`` reports the exact L1 loss; the smoothed objective is non-increasing within each
level.

The marginal oracle is pluggable (:class:`~numpyro_dpgm.oracles.protocol.MarginalOracle`):
the exact junction tree (:class:`~numpyro_dpgm.oracles.protocol.ExactOracle`) or an
approximate oracle carrying a warm-startable state, such as Convex-GBP on a region graph
(Algorithm 2), which turns Prox-PGM into APPGM (Theorem 2). This module checks the input and
builds the loss, the oracle and the start point; the iterations themselves are
:func:`~numpyro_dpgm.estimation.mirror_descent.mirror_descent`.

Out-of-model queries (Problem 4) are answered from the fitted model itself: with an exact
oracle the fitted ``p_θ̂`` is a proper distribution, and the marginal of any attribute set is
computed exactly on the junction tree of the model augmented with a zero potential on that set
(Appendix B, "exact out-of-model inference"); see
:func:`~numpyro_dpgm.infer.result.answer_queries`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._jit import check_compile_mode, device_array
from .._precision import warn_if_float32
from .._warnings import warn
from ..distributions.mrf import MarkovRandomField
from ..domain import Domain
from ..infer.result import Result, total_extras
from ..measurements import Measurement, estimate_total
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.protocol import ORACLES, ExactOracle, MarginalOracle, resolve_oracle
from ..tables import CliqueTables, project_table
from .contract import (
    check_attributes,
    check_max_iters,
    estimator,
    network_from_measurements,
    resolve_init,
    resolve_total,
    warn_sparse_cliques,
)
from .losses import (
    build_terms,
    check_measurements,
    expected_noise_loss,
    group_terms,
    lipschitz_bound,
    measurement_loss,
)
from .mirror_descent import ARMIJO_C, METHODS, MarginalLoss, ProxPGMState, mirror_descent
from .naive import fit_mle
from .risk_stop import BUDGET, OPTIMUM, RISK, risk_path

__all__ = [
    "ARMIJO_C",
    "ORACLES",
    "ExactOracle",
    "MarginalOracle",
    "ProxPGMConvergenceWarning",
    "ProxPGMState",
    "estimate_total",
    "measurement_loss",
    "prox_pgm",
]

Array = Any

#: Default stopping tolerance (relative decrease of the loss over ``window`` iterations).
DEFAULT_TOL = 1e-10
#: Values of ``stop``: the least estimated risk where it applies and is affordable, else the
#: optimum; iterate to the optimum, to the noise level (discrepancy principle), or to the least
#: estimated risk on the path (SURE).
STOP_RULES = ("auto", "optimum", "discrepancy", "risk")
#: ``stop="auto"`` gives the risk path ``max_iters // AUTO_BUDGET_SHARE`` iterations to reach the
#: noise level (the pilot iterate). The whole path took 2.3–3.1 times the pilot's iterations on
#: Adult's tree workloads and Appendix C.4 at ε = 0.1 and 1 (the releases of ``python -m
#: benchmarks converge`` and of ``python -m benchmarks compile_time`` with ``--data adult`` and
#: ``heldout``, seed 0; pilots 37, 224, 40, 252, 62, 260, 40, 191, paths ended at 113, 556,
#: 122, 679, 145, 607, 112, 538, read from ``stop="risk"`` fits by hand), so a later pilot could
#: not finish within ``max_iters``.
AUTO_BUDGET_SHARE = 3


class ProxPGMConvergenceWarning(UserWarning):
    """A Prox-PGM fit reached its iteration limit before its stopping rule fired."""


def _warn_not_converged(max_iters: int, trace: Any, window: int) -> None:
    """Say loudly that the fit stopped short, by how much it still moved, and what to do."""
    t = len(trace) - 1
    back = max(0, t - window)
    moved = float(trace[back] - trace[t])
    warn(
        f"prox_pgm stopped at the iteration limit (max_iters={max_iters}) before converging: "
        f"the loss still fell by {moved:.3g} over the last {t - back} iterations (final loss "
        f"{float(trace[t]):.6g}). The fit may be far from the optimum; raise max_iters or "
        "continue from this fit with init=fit.model (pass tol=0 to run a fixed number of "
        "iterations without this warning).",
        ProxPGMConvergenceWarning,
    )


#: ``model_fit`` choices of :func:`prox_pgm` with an approximate oracle.
MODEL_FITS = ("max_entropy", "oracle")


def _max_entropy_model(
    network: MarkovNetwork, pseudo: Array, theta: Array, max_cells: float = 5e7,
    max_iters: int = 1000,
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
    fit = fit_mle(network, pseudo, 1e-6, init=theta, max_iters=max_iters)
    if not fit.converged:
        warnings.warn(
            f"prox_pgm: the maximum-entropy model of the oracle's pseudo-marginals did not "
            f"converge in {fit.iterations} L-BFGS iterations (gradient norm "
            f"{fit.extras['grad_norm']:.3g}): pseudo-marginals outside the marginal polytope "
            "have no finite unregularised fit, and this one's tiny L2 term puts its optimum far "
            "away, so the model's marginals are not extras['marginals'] (the oracle's). Remedy: "
            "read extras['marginals'], or pass model_fit='oracle' to skip this fit",
            ProxPGMConvergenceWarning, stacklevel=4)
        return fit.model.theta, "max_entropy (not converged)"
    return fit.model.theta, "max_entropy"


def noisy_start(network: MarkovNetwork, measurements: Sequence[Measurement],
                total: float) -> np.ndarray | None:
    """A start ``θ₀`` built from the noisy tables themselves (``None`` when none applies).

    Every network clique released whole (identity queries on exactly its attributes) gets
    ``log`` of its inverse-variance-averaged table, clipped below at the noise's standard
    deviation and normalised; an attribute shared by ``k > 1`` such cliques has ``(k − 1)``
    copies of the log of its one-way table subtracted, which makes ``p_θ₀`` the closed-form fit
    of a tree of pairwise tables (``Π p_C / Π p_S``) and a close start otherwise. ``θ₀`` lies in
    the span of the released cliques' features, so the fit's limit is unchanged (the
    maximum-entropy solution); only the way there is shorter, which matters when the noise is
    small and the optimum is far from uniform.
    """
    sets: dict[frozenset[str], int] = {}
    for i, c in enumerate(network.cliques):
        sets.setdefault(frozenset(c), i)
    sums: dict[int, np.ndarray] = {}
    weights: dict[int, float] = {}
    for m in measurements:
        if m.query is not None or frozenset(m.clique) not in sets:
            continue
        slot = sets[frozenset(m.clique)]
        clique = network.cliques[slot]
        table = np.asarray(project_table(
            np.asarray(m.values, dtype=float).reshape(network.domain.shape_of(m.clique)),
            tuple(m.clique), clique))
        w = 1.0 / m.noise.variance
        sums[slot] = sums.get(slot, 0.0) + w * table
        weights[slot] = weights.get(slot, 0.0) + w
    if not sums:
        return None
    theta = np.zeros(network.num_params)
    logs: dict[int, np.ndarray] = {}
    for slot, acc in sums.items():
        floor = max(math.sqrt(1.0 / weights[slot]), 1e-12 * total)
        table = np.maximum(acc / weights[slot], floor)
        logs[slot] = np.log(table / table.sum())
        theta[network.slice_of(network.cliques[slot])] = logs[slot].ravel()
    holders: dict[str, list[int]] = {}
    for slot in sorted(logs):
        for a in network.cliques[slot]:
            holders.setdefault(a, []).append(slot)
    for a, slots in holders.items():
        if len(slots) < 2:
            continue
        first = network.cliques[slots[0]]
        one_way = np.exp(np.asarray(project_table(logs[slots[0]], first, (a,), log=True)))
        shape = [network.domain[v] if v == a else 1 for v in first]
        block = theta[network.slice_of(first)].reshape(network.domain.shape_of(first))
        block = block - (len(slots) - 1) * np.log(one_way).reshape(shape)
        theta[network.slice_of(first)] = block.ravel()
    return theta


# ------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------
@estimator("prox-pgm")
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
    loss: str | Callable[[CliqueTables], Array] = "l2",
    method: str = "auto",
    step_size: float | None = None,
    tol: float = DEFAULT_TOL,
    window: int = 10,
    callback_every: int = 100,
    stop: str = "auto",
    compile_mode: str = "optimized",
    model_fit: str = "max_entropy",
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
        Draws the probe vectors of ``stop="risk"``; ignored otherwise (Prox-PGM is
        deterministic; ``stop="auto"`` takes the probes of ``jax.random.key(0)``).
    init : MarkovRandomField or array, optional
        Warm start: log-potentials in the network's layout (or a model over the same network),
        e.g. a previous fit's ``model``. ``None``: :func:`noisy_start` (the noisy tables of the
        cliques released whole; same optimum, shorter path), or ``θ = 0`` (the uniform
        distribution) when no clique is released whole or the loss is a callable.
    max_iters : int
        Maximum number of mirror-descent iterations (each costs one oracle call).
    callback : callable ``(iteration, loss) -> None``, optional
        Called with ``(0, L(θ₀))`` before the first iteration, then every ``callback_every``
        iterations and once at the end, with the number of iterations done and the loss
        (progress reporting; the compiled loop runs in blocks of ``callback_every``).
    oracle : "exact", MarginalOracle, or callable network -> MarginalOracle
        The marginal oracle. ``"exact"`` is the junction tree (:class:`ExactOracle`). An
        approximate oracle with a warm-startable state (e.g. Convex-GBP) makes this APPGM.
    loss : "l2", "auto", "l1" or callable
        ``"l2"`` (default): ``Σ_M ½‖(Q_Mμ_{C_M} − y_M)/σ_M‖²`` with ``σ_M²`` the noise
        variance;
        ``"l1"``: ``Σ_M ‖Q_Mμ_{C_M} − y_M‖₁/b_M`` with ``b_M`` the Laplace scale (``σ_M`` for
        Gaussian noise); ``"auto"``: L1 for Laplace-family and L2 for Gaussian-family noise,
        per measurement (the noise's negative log-likelihood). A callable receives the
        count-scale marginals of the network's cliques (:class:`CliqueTables`) and returns a
        scalar convex loss; it must be traceable by JAX.
    method : "auto", "accelerated" or "md"
        The iteration scheme: ``"accelerated"`` (accelerated Bregman gradient with line search
        and function restart), ``"md"`` (Algorithm 1 with Armijo steps); ``"auto"`` takes
        ``"accelerated"`` with the exact oracle and ``"md"`` otherwise.
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
    stop : "auto", "optimum", "discrepancy" or "risk"
        ``"auto"`` (default): ``"risk"`` where it applies (``loss="l2"``, the exact oracle,
        ``method`` ``"auto"`` or ``"md"``, no ``init``: a warm start asks for the optimum
        near it, not for a path from the maximum-entropy point) and the path reaches the
        noise level within ``max_iters // 3`` iterations (:data:`AUTO_BUDGET_SHARE`), else
        ``"optimum"``; the path gives that budget up sooner where its loss falls too slowly to
        reach the level in time (:data:`~numpyro_dpgm.estimation.risk_stop.SPEEDUP`). At high
        noise the path is short and its fit the more accurate; at low noise it is long and the
        optimum is nearly as good, so the iterations spent on the path
        (``extras["risk_path_iterations"]``; ``iterations`` counts the optimum's) are the
        price of the choice. ``extras["stop"]`` names the rule that made the fit.
        ``"optimum"``: iterate to the minimiser of ``L`` (the ``tol`` rule).
        ``"risk"``: the mirror-descent path from the uniform distribution (``init`` when
        given), and the fit is its iterate of least estimated squared error against the true
        tables: Stein's unbiased risk estimate ``2L − m + 2·df`` with the divergence ``df``
        by forward-mode differentiation of the path (for Laplace noise, Stein's identity for
        the Laplace density; :mod:`~numpyro_dpgm.estimation.risk_stop`). It runs until the
        estimate has not improved for a while (a quarter of the iterations from the noise
        level to the best iterate,
        :data:`~numpyro_dpgm.estimation.risk_stop.PATIENCE_SHARE`), so it costs more
        iterations than ``"discrepancy"``, each an oracle JVP (along
        :data:`~numpyro_dpgm.estimation.risk_stop.PROBES` tangents) instead of an oracle
        call: at low noise on large models that is slow (Appendix C.4 at ε = 10: 5,000
        iterations, the limit, in 545 s on two CPU cores, total variation 0.0072 against the
        optimum's 0.0090 in 50 s),
        at high noise it is the more accurate fit (C.4 at ε = 1: 0.0302 against 0.0439 in
        247 s; Adult's tree workload: mean L1 0.072 against 0.108 at ε = 1). Needs
        ``loss="l2"``, the exact oracle and ``method`` ``"auto"`` or ``"md"``; ``extras``
        adds ``selected_iteration``, ``pilot_iteration``, ``risk``, ``degrees_of_freedom``,
        ``risk_trace`` and ``final_loss`` (``iterations`` counts the whole path).
        ``rng_key`` draws its probe vectors (default ``jax.random.key(0)``).
        ``"discrepancy"``: Morozov's discrepancy principle on the mirror-descent path, a
        regularised fit. The path starts from the uniform distribution (the maximum-entropy
        point; ``init`` when given) with ``method="md"`` unless another is named, and stops at
        the first iterate whose loss is at most its expected value at the true tables,
        ``E[L(n)]`` (:func:`~numpyro_dpgm.estimation.losses.expected_noise_loss`: ``½`` per
        answer for ``"l2"``): the fit explains the measurements as well as the truth does, and
        no better. Entropic mirror descent stopped early is entropy-regularised, so the fit
        leans towards maximum entropy instead of fitting the noise. Whether that is closer to
        the truth depends on the data: on Adult's tree workload with Laplace noise it was
        (mean L1 on the released marginals 0.080 against the optimum's 0.108 at ε = 1, 0.265
        against 0.372 at ε = 0.1), on small dense tables of strong interactions it was not
        (a 4-cycle of 6-cell tables, 500 records, σ = 30: 103 against 94 counts over 20
        releases); see ``docs/howto/private-pgm.md``. Where ``L`` cannot reach that level the
        ``tol`` rule ends it at the optimum.
        ``extras["stopped_by"]`` says which rule ended the fit. Needs a built-in loss.
    compile_mode : "optimized" or "quick"
        How XLA compiles the fit's loop (:mod:`numpyro_dpgm._jit`): ``"optimized"`` (default)
        with its usual optimisation passes; ``"quick"`` without the backend's, about twice as
        fast to compile and 1.5 to 2 times slower per iteration (AIM's refits on Adult). For fits
        that compile a network once and run it briefly, as the refits of
        :func:`~numpyro_dpgm.aim` and :func:`~numpyro_dpgm.mechanisms.mwem_pgm`, where compiling
        is most of the time.

    model_fit : "max_entropy" or "oracle"
        With an approximate oracle, the ``model`` returned: ``"max_entropy"`` (default) fits
        the maximum-entropy model of the oracle's pseudo-marginals by L-BFGS on the exact
        junction tree where it is tractable (at most 1,000 iterations; a
        :class:`ProxPGMConvergenceWarning` where they do not converge, when it is also the
        slow part of the call: 105 s of 115 on Adult's 32 random pairs at ε = 0.1, gradient
        norm 0.20 after 1,000 iterations, by hand); ``"oracle"`` keeps the oracle's ``θ̂``, for
        callers who read only ``extras["marginals"]``. Ignored with the exact oracle.

    Returns
    -------
    Result
        ``model``: :class:`MarkovRandomField` over the network with the fitted ``θ̂`` (exact
        oracle); with an approximate oracle, the maximum-entropy model of the estimated
        pseudo-marginals when the junction tree is tractable (``extras["model_fit"]`` says
        which, ``"max_entropy (not converged)"`` where its fit did not converge), since the
        oracle's ``θ̂`` parameterises region-graph beliefs, not a distribution with those
        marginals.
        ``loss_trace``: ``L`` after ``0..iterations`` iterations (non-increasing for smooth
        losses; see the module notes for L1).
        ``converged``: whether the stopping rule fired before ``max_iters``; when it did not
        (and ``tol > 0``) a :class:`ProxPGMConvergenceWarning` names the remedy. ``extras``:
        ``total_count`` (the ``N`` used), ``total_count_estimated`` (bool), ``marginals`` (the
        oracle's count-scale clique marginals at ``θ̂``, :class:`CliqueTables`), ``log_partition``,
        ``step_size`` (final ``α``), ``initial_step_size``, ``rejected_steps``,
        ``objective_trace`` (the smoothed objective; equal to ``loss_trace`` without L1 terms),
        ``smoothing`` (final ``s``), ``loss_kinds`` (per measurement), ``oracle``,
        ``oracle_state``, ``model_fit`` (``"oracle"`` or ``"max_entropy"``), ``method`` (the
        scheme used) and ``restarts`` (momentum restarts of the accelerated scheme).

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
    >>> ms = [Measurement(("a", "b"), y, Gaussian(1.0))]
    >>> fit = prox_pgm(ms, {"a": 2, "b": 2}, stop="optimum")
    >>> np.round(np.asarray(fit.extras["marginals"][("a", "b")]), 3).tolist()
    [[30.0, 10.0], [20.0, 40.0]]

    By default the fit is the path's iterate of least estimated risk where that rule applies:

    >>> fit = prox_pgm(ms, {"a": 2, "b": 2})
    >>> fit.extras["stop"], fit.extras["selected_iteration"] <= fit.iterations
    ('risk', True)
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
    if method not in ("auto", *METHODS):
        raise ValueError(f"unknown method {method!r}; use 'auto', 'accelerated' or 'md'")
    check_compile_mode(compile_mode)
    if model_fit not in MODEL_FITS:
        raise ValueError(f"model_fit must be one of {MODEL_FITS}, got {model_fit!r}")
    if stop not in STOP_RULES:
        raise ValueError(f"unknown stop {stop!r}; use 'auto', 'optimum', 'discrepancy' or "
                         "'risk'")
    if stop == "risk" and method == "accelerated":
        raise ValueError("stop='risk' follows the mirror-descent path: use method='auto' or 'md'")
    if stop == "risk" and loss != "l2":
        raise ValueError("stop='risk' estimates the squared error of the fit: use loss='l2'")
    if stop == "discrepancy" and custom is not None:
        raise ValueError("stop='discrepancy' needs the measurements' noise: use loss='l2', "
                         "'l1' or 'auto', not a callable")

    # -- total -------------------------------------------------------------------------------
    total, estimated = resolve_total(total_count, measurements)
    warn_sparse_cliques(network, total)

    # -- loss, oracle, start point -----------------------------------------------------------
    kind = "auto" if custom is not None else loss
    terms, data = build_terms(network, measurements, kind)
    if custom is None:
        kinds, groups = group_terms(network, terms, data)
        loss_fn, loop_data = MarginalLoss(kinds), groups
    else:
        loss_fn, loop_data, data = MarginalLoss(network=network, custom=custom), (), ()
    the_oracle = resolve_oracle(oracle, network)
    if stop == "risk" and not isinstance(the_oracle, ExactOracle):
        raise ValueError("stop='risk' differentiates the path through the exact oracle: use "
                         "oracle='exact', or stop='optimum' with an approximate oracle")
    rule = stop
    if stop == "auto":
        risky = (custom is None and loss == "l2" and method != "accelerated" and init is None
                 and isinstance(the_oracle, ExactOracle))
        rule = "risk" if risky else "optimum"
    dtype = jnp.result_type(float)
    given = resolve_init(init, network)
    target = expected_noise_loss(measurements, loss) if stop == "discrepancy" else -math.inf

    num_l1 = sum(int(d.values.size) for term, d in zip(terms, data, strict=False)
                 if term.kind == "l1") if custom is None else 0
    alpha0: float | None
    if step_size is not None:
        alpha0 = float(step_size)
        if not math.isfinite(alpha0) or alpha0 <= 0:
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}")
    elif custom is None:
        alpha0 = 2.0 / (lipschitz_bound(network, terms, data) * total)
    else:
        alpha0 = None  # from the curvature at the start, inside the compiled program

    # -- iterate (in blocks when reporting progress) ------------------------------------------
    spent = None
    if rule == "risk":
        budget = iters // AUTO_BUDGET_SHARE if stop == "auto" else None
        theta_path = (jnp.zeros(network.num_params, dtype=dtype) if given is None
                      else jnp.asarray(given, dtype=dtype))
        fit = _risk_fit(the_oracle, loss_fn, theta_path, loop_data, total, estimated, network,
                        measurements, start, stop, iters=iters, alpha=alpha0, tol=tol,
                        window=window, budget=budget,
                        rng_key=rng_key if stop == "risk" else None, callback=callback,
                        callback_every=callback_every, compile_mode=compile_mode)
        if isinstance(fit, Result):
            return fit
        rule, spent = "optimum", fit  # the path did not reach the noise level in time
    scheme = method if method != "auto" else (
        "accelerated" if isinstance(the_oracle, ExactOracle) and rule == "optimum" else "md")
    theta0 = given
    if theta0 is None and custom is None and rule == "optimum":
        theta0 = noisy_start(network, measurements, total)
    theta0 = (jnp.zeros(network.num_params, dtype=dtype) if theta0 is None
              else jnp.asarray(theta0, dtype=dtype))
    state, trace, objective_trace = mirror_descent(
        the_oracle, loss_fn, theta0, loop_data, total, iters=iters, alpha=alpha0, num_l1=num_l1,
        tol=tol, window=window, method=scheme, target=target, callback=callback,
        callback_every=callback_every, compile_mode=compile_mode,
    )
    converged = bool(state.converged)
    stopped_by = ("discrepancy" if converged and float(state.loss) <= target else
                  "tolerance" if converged else "iteration limit")
    if not converged and tol > 0:
        _warn_not_converged(iters, trace, window)

    t = int(state.t)
    theta, fitted = state.theta, "oracle"
    if not isinstance(the_oracle, ExactOracle) and model_fit == "max_entropy":
        theta, fitted = _max_entropy_model(network, state.mu / total, state.theta)
    model = MarkovRandomField(network, theta)
    extras = {
        **total_extras(total, estimated),
        "marginals": network.unflatten(state.mu),  # sliced on the host
        "log_partition": state.log_z,
        "step_size": float(state.alpha),
        "initial_step_size": float(state.initial_alpha),
        "rejected_steps": int(state.rejected),
        "objective_trace": device_array(objective_trace),
        "method": scheme,
        "restarts": int(state.restarts),
        "smoothing": float(state.smooth),
        "loss_kinds": tuple(term.kind for term in terms) if custom is None else ("custom",),
        "oracle": the_oracle,
        "oracle_state": state.oracle_state,
        "model_fit": fitted,
        "stopped_by": stopped_by,
        "discrepancy_level": target if stop == "discrepancy" else None,
        "stop": rule,
        "risk_path_iterations": spent,
    }
    return Result(
        model=model,
        loss_trace=device_array(trace),
        iterations=t,
        converged=converged,
        elapsed=time.perf_counter() - start,
        extras=extras,
    )


def _risk_fit(oracle: ExactOracle, loss_fn: MarginalLoss, theta0: Array, groups: Any,
              total: float, estimated: bool, network: MarkovNetwork,
              measurements: Sequence[Measurement], start: float, stop: str,
              **options: Any) -> Result | int:
    """``prox_pgm(stop="risk")``: the path's iterate of least estimated risk
    (:mod:`~numpyro_dpgm.estimation.risk_stop`); the path's iterations when it gave its
    ``budget`` up before reaching the noise level."""
    iters = options["iters"]
    level = expected_noise_loss(measurements, "l2")
    state, trace, risk_trace = risk_path(oracle, loss_fn, theta0, groups, total, level=level,
                                         **options)
    md = state.md
    reason = int(state.reason)
    if reason == BUDGET:
        return int(md.t)
    stopped_by = {RISK: "risk", OPTIMUM: "tolerance"}.get(reason, "iteration limit")
    if stopped_by == "iteration limit":
        where = ("no iterate had reached the noise level, where the estimates are compared"
                 if int(state.pilot) < 0 else
                 f"the least estimate so far was at iteration {int(state.best_t)}")
        warn(f"prox_pgm(stop={stop!r}) reached max_iters={iters} on the risk path before its "
             f"rule fired: {where}. "
             "The fit is the best iterate so far; raise max_iters.", ProxPGMConvergenceWarning)
    # a path that reached the optimum before the noise level compared no risks: its fit is the
    # optimum of the loss (the least-squares fit explains the release worse than the truth would)
    rule = "optimum" if reason == OPTIMUM and int(state.pilot) < 0 else "risk"
    model = MarkovRandomField(network, state.best_theta)
    extras = {
        **total_extras(total, estimated),
        "marginals": network.unflatten(state.best_mu),
        "log_partition": state.best_log_z,
        "step_size": float(md.alpha),
        "initial_step_size": float(md.initial_alpha),
        "rejected_steps": int(md.rejected),
        "objective_trace": device_array(trace),
        "method": "md",
        "restarts": 0,
        "smoothing": 0.0,
        "loss_kinds": ("l2",) * len(measurements),
        "oracle": oracle,
        "oracle_state": md.oracle_state,
        "model_fit": "oracle",
        "stopped_by": stopped_by,
        "discrepancy_level": level,
        "selected_iteration": int(state.best_t),
        "pilot_iteration": int(state.pilot) if int(state.pilot) >= 0 else None,
        "risk": float(state.best_risk),
        "degrees_of_freedom": float(state.best_df),
        "risk_trace": device_array(risk_trace),
        "final_loss": float(md.loss),
        "stop": rule,
        "risk_path_iterations": None,
    }
    return Result(model=model, loss_trace=device_array(trace), iterations=int(md.t),
                  converged=bool(md.converged), elapsed=time.perf_counter() - start,
                  extras=extras)

