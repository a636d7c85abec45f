"""EM for collective graphical models (seed 002, Algorithm 2) with an NLBP E-step.

``θ_{t+1} = argmax_θ θ·n_t − N·A(θ)`` with ``n_t = NLBP(θ_t, y)`` the approximate MAP of the
latent count tables given the noisy measurements (seed 002, Eq. 6). The M-step is moment
matching ``μ(θ_{t+1}) = n_t / N``:

* after a natural-space E-step ``n_t = N·μ(η̂)``, so ``θ_{t+1} = η̂`` up to gauge (free);
* ``"closed_form"`` on decomposable networks: ``θ_C = log n_C − log n_{S(C)}`` on the junction
  tree (clique over separator);
* ``"ipf"``: iterative proportional fitting, ``θ_C += log n_C − log N μ_C(θ)`` clique by clique;
* ``"lbfgs"``: L-BFGS on ``θ·n − N·A(θ)`` (the naive estimator's solver without penalty).

Because MAP-EM's fixed points are L1 projections of ``y`` onto ``N·M`` (notes §2.5), which overfit
the noise, the number of EM iterations and NLBP steps act as regularisers: ``max_iters`` and
``inner_iters`` are explicit options (15 NLBP steps, from the naive MLE). By default
(``max_iters="risk"``) the iteration count is chosen from the release: the iterate of least
estimated risk on EM's path (Stein's estimate with a Monte-Carlo divergence,
:mod:`numpyro_dpgm.estimation.em_risk`), for the estimand ``target`` (the records' own tables,
or the population's model that drew them).

With the free natural M-step (the default) the whole loop is one compiled program
(:mod:`numpyro_dpgm.infer.em_program`, the engine that :class:`~numpyro_dpgm.infer.em.EM` runs
on a model of your own): a refit of a known structure with new values, ``N``, noise scales,
warm start, iteration limits or tolerances reuses it. Its reported loss
``L(N·μ(θ_t))`` cannot rise from one iteration to the next (the E-step keeps its best iterate and
the M-step is exact), and the fit never ends worse than its start: if it would (other M-steps,
smoothing), the start is returned and ``extras["kept_start"]`` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from .._warnings import warn
from ..distributions.mrf import MarkovRandomField
from ..infer.bayes import NoisyMarginalsModel
from ..infer.em_program import STOP_REASONS, EMRecord, EMRun, em_loop, em_start_state, gauge_fix
from ..infer.mstep import m_step
from ..infer.result import Result, total_extras
from ..measurements import Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.nlbp import check_halvings, nlbp_map, resolve_damping
from .contract import (
    check_max_iters,
    estimator,
    resolve_init,
    resolve_release,
)
from .em_risk import resolve_stop, risk_path, start_scales
from .losses import MeasurementEvidence, check_measurements
from .naive import naive_fit

__all__ = ["CGMEMWarning", "cgm_em", "START_ITERS", "em_start"]

Array = Any


class CGMEMWarning(UserWarning):
    """A CGM-EM fit whose E-step failed (non-finite values) or stalled at its start."""


def _host_loop(network: MarkovNetwork, evidence: MeasurementEvidence, data: Any, carry: Any,
               total: Array, max_iters: int, opts: dict, method: str,
               callback: Callable[[int, float], None] | None) -> EMRun:
    """EM with an M-step of :func:`~numpyro_dpgm.infer.mstep.m_step`, iterated on the host."""
    theta, n_prev = carry.theta, carry.n_hat
    rows, stop = [], 0
    for t in range(1, max_iters + 1):
        r = nlbp_map(network, theta, total, evidence, (data, opts["smoothing"]),
                     space=opts["space"], damping=opts["damping"], max_iters=opts["inner_iters"],
                     tol=opts["inner_tol"])
        moved = opts["space"] == "counts" or bool(jnp.any(r.eta != theta))
        if moved:
            theta = gauge_fix(network, m_step(network, r.n, theta, method))
        # the model's counts N·μ(θ_{t+1}) and their loss, by the compiled start program
        fitted, loss = em_start_state(network, evidence, theta, data, total)
        change = max(float(jnp.sum(jnp.abs(fitted.n_hat[network.slice_of(c)]
                                           - n_prev[network.slice_of(c)]))) / float(total)
                     for c in network.cliques)
        rows.append((float(r.objective), change, bool(r.converged), float(loss),
                     int(r.rejected), moved))
        n_hat, n_prev = r.n, fitted.n_hat
        if not moved and int(r.rejected) > 0 and int(r.rejected) >= int(r.iterations):
            stop = 3
        elif change < opts["tol"]:
            stop = 1 if bool(r.converged) else 2
        if callback is not None and (stop < 2 or moved):
            callback(t, float(loss))
        if stop:
            break
    records = EMRecord(*(np.asarray(col) for col in zip(*rows, strict=True)))
    return EMRun(theta, n_hat, records, STOP_REASONS[stop])


def _warn_estep(run: EMRun, iterations: int, inner_iters: int) -> None:
    """Say when an E-step failed or stalled, and what to do about it."""
    nonfinite = int(np.sum(run.records.nonfinite))
    if run.stop == "failed":
        warn(f"cgm_em: every NLBP iterate of the E-step of EM iteration {iterations + 1} was "
             "non-finite, so EM stopped at its last finite fit (converged=False, "
             f"{iterations} iteration(s)). Lower damping (e.g. damping=0.01), smooth the "
             "Laplace evidence (smoothing=0.1), or check the measurements' values and noise "
             "scales.", CGMEMWarning)
    elif nonfinite:
        warn(f"cgm_em: {nonfinite} NLBP iterate(s) were non-finite and rejected (the E-step "
             "halved its damping after each), so the fit is not reported as converged. Lower "
             "damping (e.g. damping=0.01) or smooth the Laplace evidence (smoothing=0.1).",
             CGMEMWarning)
    if run.stop == "stalled" and iterations == 0:
        warn(f"cgm_em: the first E-step found nothing better than its start within "
             f"inner_iters={inner_iters}, even with its damping halved {run.halvings} times, "
             "so the fit is its start (0 iterations, converged=False). Raise inner_iters or "
             "max_halvings, or pass a smaller damping for stiff Gaussian evidence.",
             CGMEMWarning)


def _result(run: EMRun, start: Any, loss0: float, inner_iters: int, extras: dict,
            network: MarkovNetwork, began: float) -> Result:
    """The Result of a run: honest iteration count, the start kept if EM ended worse."""
    recs = run.records
    # an E-step that did not move θ (a retry, or one that stalled or failed at its start) is
    # not an iteration, unless it was the last and confirmed a fixed point
    moved = recs.moved.astype(bool)
    counted = moved.copy()
    if run.stop == "converged" and len(counted) and not counted[-1]:
        counted[-1] = True
    iterations = int(np.sum(counted))
    losses = np.concatenate([[float(loss0)], recs.loss[counted]])
    _warn_estep(run, iterations, inner_iters)
    theta, n_hat = run.theta, run.n_hat
    converged = run.stop == "converged" and int(np.sum(recs.nonfinite)) == 0
    kept_start = bool(losses[-1] > losses[0])
    if kept_start:
        theta, n_hat, converged = start.theta, start.n_hat, False
    return Result(
        model=MarkovRandomField(network, theta),
        loss_trace=losses,
        iterations=iterations,
        converged=converged,
        elapsed=time.perf_counter() - began,
        extras={
            "n_hat": n_hat,
            "estep_objective": recs.objective,
            "estep_converged": recs.estep_converged.astype(bool),
            "estep_nonfinite": recs.nonfinite.astype(int),
            "estep_moved": moved,
            "damping_halvings": run.halvings,
            "marginal_change": recs.change,
            "stop_reason": run.stop,
            "kept_start": kept_start,
            "safeguard": (f"EM ended at loss {losses[-1]:.10g}, above its start's "
                          f"{losses[0]:.10g}: the start is returned") if kept_start else None,
            **extras,
        },
    )


@estimator("cgm-em")
def cgm_em(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: str | MarkovRandomField | Array | None = None,
    max_iters: int | str = "risk",
    callback: Callable[[int, float], None] | None = None,
    inner_iters: int = 15,
    space: str = "natural",
    damping: Any = None,
    m_step_method: str | None = None,
    tol: float = 1e-6,
    inner_tol: float = 1e-8,
    naive_l2: float | None = None,
    init_l2_scale: float | Sequence[float] | None = None,
    smoothing: float = 0.0,
    max_halvings: int = 20,
    target: str = "sample",
) -> Result:
    """Learn an MRF from noisy clique tables by EM on the collective graphical model.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers to (linear queries of) clique tables; every measured clique must lie in a
        clique of ``network``.
    network_or_domain : MarkovNetwork, Domain or mapping attribute -> size
        The model's cliques; given a domain, the maximal measured cliques.
    total_count : float, optional
        ``N`` (public); ``None`` estimates it from the measurements (no privacy cost).
    rng_key : JAX PRNG key, optional
        Accepted for the estimators' common contract and ignored (NLBP-EM is deterministic).
    init : None, "naive", "zeros", MarkovRandomField or array
        ``θ_0``: the naive MLE (``None`` or ``"naive"``, the default), uniform (``"zeros"``),
        or a warm start (a previous fit's model or log-potentials). The naive start is
        :func:`~numpyro_dpgm.estimation.naive_mle` with its default rule times
        ``init_l2_scale`` (public quantities only) unless ``naive_l2`` fixes λ, fitted to the
        whole noisy tables of the release (measurements of other queries ignored, cliques
        without such a table held at zero); uniform where the release has no whole table.
    init_l2_scale : float or sequence of floats, optional
        Multiplies the naive rule's λ for the naive start (default 1: the naive estimator's own fit,
        which EM then refines; with ``max_iters="risk"``, the candidates of
        :data:`~numpyro_dpgm.estimation.em_risk.RISK_STARTS` for ``target``: 1 and 4 for the
        population). A sequence gives candidate starts for ``max_iters="risk"``, which
        searches the path of each and keeps the least estimated risk
        (:mod:`~numpyro_dpgm.estimation.em_risk`). Measured, for ten iterations, by ``python -m
        benchmarks cgm_defaults`` (``benchmarks/results/cgm_defaults-cpu.json``, 3 releases per row,
        Laplace at ε ∈ {0.1, 1, 10}): with 15 NLBP steps, scale 1 beat naive MLE on all nine rows of
        Adult's demo tree, Titanic's tree and a 5-value chain with N = 10⁵ (Adult at ε = 0.1: mean
        L1 0.200 against naive's 0.211), while the earlier default, 4 with 50 steps, lost to naive
        on five of them (Adult at ε = 0.1: 0.292). On seed 002's 10-value models with N = 10⁴, where
        the smoother start of scale 2–4 was chosen, scale 1 loses to naive at ε = 1 (third-order
        chain: KL 1.290 against 1.205) and scale 4 wins (1.186). On the released tables against the
        records' own tables (``cgm_defaults-released-cpu.json``, 27 rows, N = 10³–10⁵) scale 1 with
        15 steps was no worse than naive on 26 (0.3 % worse on the last), the earlier default worse
        on 9. These figures are with naive MLE's earlier rule λ = b/N; with its current rule, weaker
        where the noise is small against the counts (``cgm_defaults-naive-rule-cpu.json``), the
        default is no worse than the clipped noisy tables on all 27 rows and no worse than naive on
        20, at most 0.8 % worse on the other 7; with twenty releases per row
        (``cgm_defaults-20seeds-cpu.json``) no worse than naive on 21, and worse beyond two paired
        standard errors on two (seed 002's chain where the noise is small against the counts: by
        0.84 % and 0.59 %).
    max_iters : int or "risk"
        Number of EM iterations (the main loop). It regularises (see the module docstring); more
        iterations approach the L1 projection. ``"risk"`` (the default): the iteration count
        of least estimated risk for ``target`` on a path of up to
        :data:`~numpyro_dpgm.estimation.em_risk.MAX_PATH` iterations
        (:mod:`~numpyro_dpgm.estimation.em_risk`; the natural M-step only), at the cost of
        ``1 + PROBES`` EM runs (three) of the searched length and a naive start per run.
    target : {"sample", "population"}
        With ``max_iters="risk"``, the estimand whose risk is estimated: the records' own
        tables (default; what the release describes and synthetic data is judged against), or
        the model that drew the records (seed 002's KL to the truth, where the counts'
        sampling variance is part of the error; where every clique is released whole, the
        risk estimated is that KL itself).
    callback : callable ``(iteration, loss) -> None``, optional
        Called after every EM iteration ``t = 1, 2, ...`` with the loss of ``θ_t`` (the entry
        ``loss_trace[t]``). With a callback the compiled loop runs one iteration per call (the
        same program); without one, the whole loop is one call.
    inner_iters : int
        NLBP iterations per E-step (warm-started at ``θ_t``). They regularise too: an E-step
        stopped short moves ``θ`` less. 15 (the default) against 50 with the naive start: equal
        or lower error on 10 of the 15 rows of ``cgm_defaults`` (the 10-value chain at ε = 10:
        KL 0.160 against 0.183) and at most 7 % higher on the rest (the 5-value chain at ε = 1:
        0.0147 against 0.0137), in a third of the E-steps' time.
    space : {"natural", "counts"}
        NLBP form (see :mod:`numpyro_dpgm.oracles.nlbp`).
    damping : float or callable ``t -> α_t``, optional
        NLBP's damping (default ``1/(1+t)`` in natural space).
    max_halvings : int
        With the natural M-step: an E-step that finds nothing better than its start (stiff
        evidence, e.g. Laplace noise of a few counts at ε = 10) is retried with the damping
        halved, at most this many times in a run; the halved damping is kept for the later
        E-steps (:mod:`~numpyro_dpgm.infer.em_program`). 0 stops EM at such an E-step.
    m_step_method : str, optional
        ``None`` uses the free natural-space M-step when ``space="natural"``, else
        :func:`~numpyro_dpgm.infer.mstep.m_step`'s ``"auto"``.
    tol : float
        Stop when ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁ < tol``. The run counts as converged only
        if that last E-step converged as well and no E-step met non-finite values; otherwise
        the E-step stalled at its starting point (raise ``inner_iters``, or lower ``damping``
        for stiff Gaussian evidence; a :class:`CGMEMWarning` says so when that left the start).
    smoothing : float
        Huber smoothing of the Laplace kink in the E-step, as a fraction of the noise scale
        ``b`` (0: the exact sign subgradient).

    Returns
    -------
    Result
        ``loss_trace``: the measurements' negative log-likelihood at the model's expected
        counts, ``L(N·μ(θ_t))`` for ``t = 0..iterations``
        (:func:`~numpyro_dpgm.estimation.losses.measurement_nll`). ``iterations`` counts the
        E-steps that moved ``θ`` and a last one that confirmed a fixed point (a retry, or an
        E-step that stalled or failed at its start, does not). ``extras``: ``n_hat`` (final
        E-step counts), per E-step run ``estep_objective`` (F), ``estep_converged``,
        ``estep_nonfinite`` (NLBP iterates rejected as non-finite), ``estep_moved`` (false for
        a retry) and ``marginal_change``; ``damping_halvings``; ``stop_reason``
        (``"iteration limit"``, ``"converged"``, ``"stalled"`` or ``"failed"``); ``kept_start``
        and ``safeguard`` (``True`` and the reason when EM ended with a larger loss than its
        start, which is then returned); ``init`` (how θ₀ was chosen), ``init_l2_scale``,
        ``space``, ``m_step``, ``stop`` (``"risk"`` or ``"iterations"``: how the count was
        chosen), ``total_count``, ``total_count_estimated``; with ``max_iters="risk"`` also
        ``risk`` and ``risk_df`` (``R̂_t`` and its divergence for ``t = 0, 1, …`` of the
        chosen start's searched path), ``risk_paths`` (``R̂_t`` of every start's path),
        ``risk_best`` (the chosen count) and ``target``.

    Warns
    -----
    CGMEMWarning
        When an E-step met non-finite values (its iterates are rejected and its damping
        halved; if none was finite, EM stops at its last finite fit) or the first E-step
        stalled at its start; the message names the remedy.
    """
    began = time.perf_counter()
    release = resolve_release(measurements, network_or_domain, total_count)
    network, total, estimated = release.network, release.total, release.total_estimated
    measurements = check_measurements(release.measurements, network.domain)
    if inner_iters < 1:
        raise ValueError(f"inner_iters must be >= 1, got {inner_iters}")
    max_halvings = check_halvings(max_halvings)
    warn_if_float32("cgm_em")
    if m_step_method is None:
        m_step_method = "natural" if space == "natural" else "auto"
    if m_step_method == "natural" and space != "natural":
        raise ValueError("the free natural M-step needs space='natural'")
    schedule = resolve_damping(space, damping)
    evidence, data = MeasurementEvidence.build(network, measurements)

    init = resolve_init(init, network, named=("naive", "zeros"))
    how = "given" if init is not None and not isinstance(init, str) else (init or "naive")
    if how == "naive" and not any(m.is_identity for m in measurements):
        how = "zeros"  # no whole noisy table to start from
    stop, max_em_iters = resolve_stop(max_iters, m_step_method, target)
    max_em_iters = check_max_iters(max_em_iters)
    scales = start_scales(init_l2_scale, stop, target) if how == "naive" else (None,)

    def start_at(scale: float | None) -> Callable[[Sequence[Measurement]], Array]:
        own: list[Array] = []  # the release's own fit, which warm-starts the perturbed ones

        def start_of(answers: Sequence[Measurement]) -> Array:
            if how != "naive":
                return jnp.asarray(init) if how == "given" else jnp.zeros(network.num_params)
            if answers is measurements and own:
                return own[0]
            # a start: the whole noisy tables there are, other cliques held at zero
            theta = jnp.asarray(naive_fit(release._replace(measurements=list(answers)),
                                          l2=naive_l2, l2_scale=scale,
                                          init=own[0] if own else None, unmeasured="zero",
                                          non_identity="ignore").model.theta)
            if answers is measurements:
                own.append(theta)
            return theta
        return start_of

    starts = [start_at(k) for k in scales]
    theta = starts[0](measurements)
    dtype = theta.dtype
    total_arr = jnp.asarray(total, dtype)
    extras: dict[str, Any] = {}
    if m_step_method == "natural":
        opts = tuple(jnp.asarray(v, t) for v, t in ((tol, dtype), (inner_iters, jnp.int32),
                                                   (inner_tol, dtype), (smoothing, dtype),
                                                   (max_halvings, jnp.int32)))
        if stop == "risk":
            path = risk_path(network, measurements, starts, total_arr, schedule, opts,
                             max_iters=max_em_iters, target=target)
            theta = starts[path.start](measurements)
            # where EM itself stopped right after the chosen iterate, the final run meets that
            # stop too (it does not move θ), so that its reason and warnings are reported
            last = len(path.risk[path.start]) - 1
            max_em_iters = path.best + int(path.em_stopped[path.start] and path.best == last)
            extras.update(risk=path.risk[path.start], risk_df=path.df[path.start],
                          risk_paths=path.risk, risk_best=path.best, target=target)
        start, loss0 = em_start_state(network, evidence, theta, data, total_arr)
        report = None if callback is None else (lambda t, _, loss: callback(t, loss))
        run = em_loop(network, evidence, data, start, total_arr, schedule, max_em_iters, opts,
                      report)
    else:
        start, loss0 = em_start_state(network, evidence, theta, data, total_arr)
        run = _host_loop(network, evidence, data, start, total_arr, max_em_iters,
                         {"space": space, "damping": schedule, "inner_iters": int(inner_iters),
                          "inner_tol": inner_tol, "smoothing": smoothing, "tol": tol},
                         m_step_method, callback)
    chosen = scales[path.start] if stop == "risk" else scales[0]
    extras.update(init=how, init_l2_scale=chosen, space=space, m_step=m_step_method,
                  stop=stop, **total_extras(total, estimated))
    return _result(run, start, loss0, inner_iters, extras, network, began)


#: :func:`em_start`'s EM iterations unless given.
START_ITERS = 10


def em_start(model: NoisyMarginalsModel, **cgm_em_options: Any) -> dict[str, Array]:
    """An interior starting point of NUTS or SVI on ``model`` from the NLBP-EM estimate.

    With ``θ`` inferred: ``θ̂`` from :func:`cgm_em` (options passed through, ``max_iters``
    :data:`START_ITERS` unless given),
    ``φ = from_theta(θ̂)`` and ``n = N·μ(θ̂)``. With ``θ`` fixed: the NLBP MAP of ``n`` at that
    ``θ``. Both lie strictly inside ``N·M``.

    Parameters
    ----------
    model : NoisyMarginalsModel
    **cgm_em_options
        Passed to :func:`cgm_em` (``θ`` fixed: ``inner_iters``, NLBP iterations, default 200).

    Returns
    -------
    dict
        Site values for ``init=`` of :func:`~numpyro_dpgm.infer.bayes.run_nuts` and
        :func:`~numpyro_dpgm.infer.bayes.run_svi`.
    """
    net, latent = model.network, model.latent_network
    if model.theta is None:
        # a start, not the estimate: ten iterations, without the risk rule's extra runs
        cgm_em_options = {"max_iters": START_ITERS, **cgm_em_options}
        fit = cgm_em(model.measurements, net, total_count=model.total_count,
                     **cgm_em_options)
        theta_hat = fit.model.theta
        eta = model.latent_theta(theta_hat)
        return {"phi": model.coding.from_theta(theta_hat),
                "n": model.total_count * latent.flatten(jt.marginals(latent, eta))}
    evidence, data = MeasurementEvidence.build(latent, model.measurements)
    r = nlbp_map(latent, model.latent_theta(model.theta), float(model.total_count), evidence,
                 (data, 0.0), max_iters=int(cgm_em_options.get("inner_iters", 200)))
    return {"n": r.n}
