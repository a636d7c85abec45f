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
the noise, the number of EM iterations acts as a regulariser: ``max_iters`` is an explicit
option (default 10, with a naive-MLE start).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..distributions.mrf import MarkovRandomField
from ..infer.bayes import NoisyMarginalsModel
from ..infer.mstep import m_step
from ..inference import junction_tree as jt
from ..inference.nlbp import nlbp_map
from ..measurements import Measurement
from ..network import MarkovNetwork
from .contract import (
    check_max_iters,
    estimator,
    resolve_init,
    resolve_network,
    resolve_total,
    total_extras,
)
from .losses import LossTerm, build_terms, check_measurements, measurement_nll, terms_loss
from .naive import naive_mle
from .result import Result

__all__ = ["cgm_em", "EMState", "MeasurementEvidence", "em_start", "em_theta", "gauge_fix"]

Array = Any


class MeasurementEvidence(NamedTuple):
    """``log p(y | n)`` of a list of measurements, up to a constant (hashable, static).

    Laplace-family noise gives ``−‖Q n_C − y‖₁ / b`` per measurement, Gaussian-family noise
    ``−‖Q n_C − y‖² / (2σ²)``; discrete noise is treated as its continuous counterpart.
    Call as ``evidence(n, data, smoothing)`` with ``data`` from :meth:`build`; ``smoothing > 0``
    replaces ``|r|`` of Laplace terms by a Huber function of width ``smoothing·b``.
    """

    network: MarkovNetwork
    terms: tuple[LossTerm, ...]

    @classmethod
    def build(
        cls, network: MarkovNetwork, measurements: Sequence[Measurement]
    ) -> tuple[MeasurementEvidence, Any]:
        terms, data = build_terms(network, measurements, "auto")
        return cls(network, terms), data

    def __call__(self, n: Array, data: Any, smoothing: Array = 0.0) -> Array:
        return -terms_loss(self.network, self.terms, n, data, jnp.asarray(smoothing))


def gauge_fix(network: MarkovNetwork, theta: Array) -> Array:
    """Subtract each clique table's mean (a change of gauge: the distribution is unchanged)."""
    tables = network.unflatten(theta)
    return network.flatten(tables.map(lambda t: t - jnp.mean(t)))


class EMState(NamedTuple):
    """Output of :func:`em_theta` (arrays only, so batches of runs stack along a leading axis).

    ``objectives``, ``changes`` and ``estep_converged`` have length ``max_em_iters``; entries
    past ``iterations`` are ``nan`` / ``False``.
    """

    theta: Array
    n_hat: Array
    objectives: Array
    changes: Array
    estep_converged: Array
    iterations: Array
    converged: Array


def _max_clique_l1(network: MarkovNetwork, a: Array, b: Array) -> Array:
    return jnp.max(jnp.stack([jnp.sum(jnp.abs(a[network.slice_of(c)] - b[network.slice_of(c)]))
                              for c in network.cliques]))


def _em_step(network, evidence, data, total, st, *, inner_iters, tol, inner_tol, smoothing,
             damping) -> tuple[EMState, Array]:
    """One EM iteration: NLBP E-step warm-started at ``θ_t``, free M-step ``θ_{t+1} = η̂``."""
    r = nlbp_map(network, st.theta, total, evidence, (data, smoothing), space="natural",
                 damping=damping, max_iters=inner_iters, tol=inner_tol)
    theta = gauge_fix(network, r.eta)
    change = _max_clique_l1(network, r.n / total, st.n_hat / total)
    k = st.iterations
    # an EM fixed point needs the last E-step to have converged too (see cgm_em)
    converged = (change < tol) & r.converged
    return EMState(theta, r.n, st.objectives.at[k].set(r.objective),
                   st.changes.at[k].set(change), st.estep_converged.at[k].set(r.converged),
                   k + 1, converged), change


def em_theta(
    network: MarkovNetwork,
    evidence: MeasurementEvidence,
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
) -> EMState:
    """Pure core of :func:`cgm_em` with the natural-space E-step and its free M-step.

    Seed 002, Algorithm 2 inside one ``lax.while_loop``: ``θ_{t+1} = gauge_fix(η̂_t)`` with
    ``η̂_t`` from :func:`~numpyro_dpgm.inference.nlbp.nlbp_map` warm-started at ``θ_t``; stops
    after ``max_em_iters`` iterations or when ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁ < tol``. No
    validation and no host transfers: ``jit``- and ``vmap``-able over ``data`` (the noisy
    tables of a batch of releases), ``theta0`` and ``total``.
    """
    init = _em_init(network, theta0, total, max_em_iters)
    total = jnp.asarray(total, dtype=init.theta.dtype)

    def cond(s: tuple[EMState, Array]) -> Array:
        st, change = s
        return (st.iterations < max_em_iters) & (change >= tol)

    def body(s: tuple[EMState, Array]) -> tuple[EMState, Array]:
        return _em_step(network, evidence, data, total, s[0], inner_iters=inner_iters, tol=tol,
                        inner_tol=inner_tol, smoothing=smoothing, damping=damping)

    state, _ = jax.lax.while_loop(cond, body, (init, jnp.asarray(jnp.inf, init.theta.dtype)))
    return state


def _em_init(network: MarkovNetwork, theta0: Array, total: Array, max_em_iters: int) -> EMState:
    theta0 = gauge_fix(network, jnp.asarray(theta0))
    dtype = theta0.dtype
    mu0 = network.flatten(jt.marginals(network, theta0))
    cap = max(int(max_em_iters), 1)
    return EMState(theta0, jnp.asarray(total, dtype) * mu0, jnp.full(cap, jnp.nan, dtype),
                   jnp.full(cap, jnp.nan, dtype), jnp.zeros(cap, bool), jnp.asarray(0),
                   jnp.asarray(False))


_em_step_jit = jax.jit(_em_step, static_argnums=(0, 1),
                       static_argnames=("inner_iters", "damping"))


@estimator("cgm-em", legacy_positional=("total_count", "max_em_iters", "inner_iters", "init"))
def cgm_em(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: str | MarkovRandomField | Array | None = None,
    max_iters: int = 10,
    callback: Callable[[int, float], None] | None = None,
    inner_iters: int = 50,
    space: str = "natural",
    damping: Any = None,
    m_step_method: str | None = None,
    tol: float = 1e-6,
    inner_tol: float = 1e-8,
    naive_l2: float | None = None,
    init_l2_scale: float = 4.0,
    smoothing: float = 0.0,
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
        deliberately smooth: ``λ_C = max(init_l2_scale·b_C/N, 10⁻⁴)`` (4× the naive estimator's
        own rule, public quantities only) unless ``naive_l2`` fixes λ; EM's iterations then add
        back the detail the data support. On 10-node third-order chains (|X| = 10, N = 10⁴,
        b = 24/ε, 5 populations) this start with 10 EM iterations gave a mean KL to the truth of
        1.199 (ε = 1) and 5.695 (ε = 0.1) against 1.232 and 6.100 for naive MLE with its own
        rule; from the naive rule's λ itself, EM gave 1.326 and 6.034.
    max_iters : int
        Number of EM iterations (the main loop). It regularises (see the module docstring): 10
        from a naive start was best in our measurements at ε ≈ 1; more iterations approach the
        L1 projection.
    callback : callable ``(iteration, loss) -> None``, optional
        Called after every EM iteration ``t = 1, 2, ...`` with the loss of ``θ_t`` (the entry
        ``loss_trace[t]``).
    inner_iters : int
        NLBP iterations per E-step (warm-started at ``θ_t``).
    space : {"natural", "counts"}
        NLBP form (see :mod:`numpyro_dpgm.inference.nlbp`).
    m_step_method : str, optional
        ``None`` uses the free natural-space M-step when ``space="natural"``, else
        :func:`~numpyro_dpgm.infer.mstep.m_step`'s ``"auto"``.
    tol : float
        Stop when ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁ < tol``. The run counts as converged only
        if that last E-step converged as well; otherwise the E-step stalled at its starting
        point (raise ``inner_iters``, or lower ``damping`` for stiff Gaussian evidence).
    smoothing : float
        Huber smoothing of the Laplace kink in the E-step, as a fraction of the noise scale
        ``b`` (0: the exact sign subgradient).

    Returns
    -------
    Result
        ``loss_trace``: the measurements' negative log-likelihood at the model's expected
        counts, ``L(N·μ(θ_t))`` for ``t = 0..iterations``
        (:func:`~numpyro_dpgm.estimation.losses.measurement_nll`). ``extras``: ``n_hat`` (final
        E-step counts), ``estep_objective`` (F per EM iteration), ``estep_converged``, ``init``
        (how θ₀ was chosen), ``marginal_change``, ``total_count``, ``total_count_estimated``.
    """
    start = time.perf_counter()
    network, measurements = resolve_network(network_or_domain, measurements)
    measurements = check_measurements(measurements, network.domain)
    total, estimated = resolve_total(total_count, measurements)
    max_em_iters = check_max_iters(max_iters)
    if inner_iters < 1:
        raise ValueError(f"inner_iters must be >= 1, got {inner_iters}")
    warn_if_float32("cgm_em")
    evidence, data = MeasurementEvidence.build(network, measurements)

    init = resolve_init(init, network, named=("naive", "zeros"))
    how = "given" if init is not None and not isinstance(init, str) else (init or "naive")
    if how == "naive":
        theta = naive_mle(measurements, network, total_count=total, l2=naive_l2,
                          l2_scale=init_l2_scale).model.theta
    elif how == "zeros":
        theta = jnp.zeros(network.num_params)
    else:
        theta = init
    theta = gauge_fix(network, theta)
    nll = measurement_nll(network, measurements, total)
    losses = [nll(theta)]

    def record(theta: Array) -> None:
        losses.append(nll(theta))
        if callback is not None:
            callback(len(losses) - 1, losses[-1])

    if m_step_method is None:
        m_step_method = "natural" if space == "natural" else "auto"
    if m_step_method == "natural" and space != "natural":
        raise ValueError("the free natural M-step needs space='natural'")

    if m_step_method == "natural":
        # the loop of em_theta on the host, one compiled EM step at a time
        st = _em_init(network, theta, total, max_em_iters)
        change = np.inf
        while int(st.iterations) < max_em_iters and change >= tol:
            st, change = _em_step_jit(network, evidence, data, jnp.asarray(total), st,
                                      inner_iters=int(inner_iters), tol=tol, inner_tol=inner_tol,
                                      smoothing=smoothing, damping=damping)
            change = float(change)
            record(st.theta)
        k = int(st.iterations)
        objectives = np.asarray(st.objectives[:k])
        return Result(
            model=MarkovRandomField(network, st.theta),
            loss_trace=np.asarray(losses),
            iterations=k,
            converged=bool(st.converged),
            elapsed=time.perf_counter() - start,
            extras={
                "n_hat": st.n_hat,
                "estep_objective": objectives,
                "estep_converged": np.asarray(st.estep_converged[:k]),
                "marginal_change": np.asarray(st.changes[:k]),
                "init": how,
                "space": space,
                "m_step": m_step_method,
                **total_extras(total, estimated),
            },
        )
    mu_prev = network.flatten(jt.marginals(network, theta))
    objectives, changes, inner_conv = [], [], []
    n_hat = total * mu_prev
    converged = False
    for _ in range(max_em_iters):
        r = nlbp_map(network, theta, total, evidence, (data, smoothing), space=space,
                     damping=damping,
                     max_iters=inner_iters, tol=inner_tol)
        n_hat = r.n
        if m_step_method == "natural":
            theta = gauge_fix(network, r.eta)
            mu = n_hat / total
        else:
            theta = gauge_fix(network, m_step(network, n_hat, theta, m_step_method))
            mu = network.flatten(jt.marginals(network, theta))
        change = max(
            float(jnp.sum(jnp.abs(mu[network.slice_of(c)] - mu_prev[network.slice_of(c)])))
            for c in network.cliques
        )
        objectives.append(float(r.objective))
        changes.append(change)
        inner_conv.append(bool(r.converged))
        mu_prev = mu
        record(theta)
        if change < tol:
            # θ stopped moving. That is an EM fixed point only if the E-step converged too: an
            # E-step that found nothing better than its starting point within inner_iters
            # returns that point, and EM would repeat it for ever without having converged.
            converged = bool(r.converged)
            break
    return Result(
        model=MarkovRandomField(network, theta),
        loss_trace=np.asarray(losses),
        iterations=len(objectives),
        converged=converged,
        elapsed=time.perf_counter() - start,
        extras={
            "n_hat": n_hat,
            "estep_objective": np.asarray(objectives),
            "estep_converged": np.asarray(inner_conv),
            "marginal_change": np.asarray(changes),
            "init": how,
            "space": space,
            "m_step": m_step_method,
            **total_extras(total, estimated),
        },
    )


def em_start(model: NoisyMarginalsModel, **cgm_em_options: Any) -> dict[str, Array]:
    """An interior starting point of NUTS or SVI on ``model`` from the NLBP-EM estimate.

    With ``θ`` inferred: ``θ̂`` from :func:`cgm_em` (options passed through; its naive start,
    or ``init="zeros"`` when some clique has no measurement of its own),
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
        try:
            fit = cgm_em(model.measurements, net, total_count=model.total_count,
                         **cgm_em_options)
        except ValueError:
            if "init" in cgm_em_options:
                raise
            # the naive start needs every clique measured; start EM from uniform instead
            fit = cgm_em(model.measurements, net, total_count=model.total_count, init="zeros",
                         **cgm_em_options)
        theta_hat = fit.model.theta
        eta = model.latent_theta(theta_hat)
        return {"phi": model.coding.from_theta(theta_hat),
                "n": model.total_count * latent.flatten(jt.marginals(latent, eta))}
    evidence, data = MeasurementEvidence.build(latent, model.measurements)
    r = nlbp_map(latent, model.latent_theta(model.theta), float(model.total_count), evidence,
                 (data, 0.0), max_iters=int(cgm_em_options.get("inner_iters", 200)))
    return {"n": r.n}
