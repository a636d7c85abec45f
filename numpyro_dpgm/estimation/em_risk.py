"""How far CGM-EM runs, chosen by an estimate of its risk from the release (Monte-Carlo SURE).

From a smoothed start, CGM-EM traces a path of fits ``θ_0, θ_1, …`` that moves from the start
towards the release: the iteration count regularises (seed 002's EM has no penalty; its
fixed points follow the noise). Which iterate is closest to the truth depends on the noise,
the records and the model, so this rule estimates the risk of every iterate from the release
and its public noise model, and keeps the least.

For the answers ``ŷ_t`` that the fit ``θ_t`` gives to the ``m`` released values ``y``, with
``y_i`` of variance ``v_i`` about the estimand ``τ_i``, the whitened squared error
``R_t = Σ_i (ŷ_{t,i} − τ_i)²/v_i`` has Stein's (1981) estimate

.. math:: \\hat R_t = \\sum_i \\frac{(ŷ_{t,i} − y_i)^2}{v_i} − m + 2\\,\\mathrm{df}_t,\\qquad
   \\mathrm{df}_t = \\sum_i \\frac{∂ŷ_{t,i}}{∂y_i},

unbiased for Gaussian ``y − τ`` and a Gaussian approximation otherwise. For Laplace noise of
scale ``b`` about the records' tables, Stein's lemma becomes
``E[e_i g(y)] = E[b(|e_i| + b) ∂g/∂y_i]`` (integration by parts against the Laplace density),
so the divergence is weighted, ``df_t = Σ_i w_i ∂ŷ_{t,i}/∂y_i`` with
``w_i = (|e_i|/b + 1)/2``, the unknown ``|e_i|`` read as the start's residual (as in
:mod:`~numpyro_dpgm.estimation.risk_stop`). On Titanic's tree at ε = 1 (four releases, by
hand) the weighted rule's fits had mean L1 0.292–0.345 against 0.322–0.375 with plain
weights (naive MLE 0.375–0.411, ten iterations 0.290–0.334). About the population the noise is
the counts' sampling and the Laplace noise together, and plain weights are kept: the analogous
weights (the residual's Laplace share) chose worse counts on seed 002's models (third-order
chain, N = 10⁴, ε = 1: KL 1.23–1.39 against 1.16–1.28, three releases, by hand). Two
estimands:

- ``target="sample"``: the records' own tables, ``τ = n`` (what the release describes and
  what synthetic data and query answers are judged against); ``v_i`` is the noise variance.
- ``target="population"``: the model ``p*`` that drew the records (seed 002's KL to the truth);
  ``v_i`` adds the multinomial variance ``N p_i (1 − p_i)`` of the counts, with ``p`` the
  start's answers over ``N``. Where every clique of the network is released whole (an
  identity query of its attributes), the risk is the KL itself rather than a squared error:
  for a fit ``q_φ = exp(φ·T(x) − A(φ))`` on the network's cliques,
  ``KL(p* ‖ q_φ) = −φ·μ* + A(φ) + const``, linear in the population's clique marginals
  ``μ*``, whose released tables ``y`` are unbiased (``E y = N μ*``). Stein's estimate is

  .. math:: N\\,\\hat R_t = −(P^\\top φ_t)·y + N A(φ_t) + \\sum_i s_i
     \\frac{∂(P^\\top φ_t)_i}{∂y_i},

  where ``P = I − V Aᵀ(A V Aᵀ)⁺A`` projects onto tables that agree on their shared margins
  and totals (``A m = 0``): ``μ*`` is such a table, so ``(Pᵀφ)·μ* = φ·μ*``, and ``Pᵀ``
  removes ``φ``'s gauge (the shifts between cliques that leave ``q`` as it is, which would
  otherwise move ``φ·y`` with the noise). The Stein factor is ``s_i = b(|e_i| + b)`` for
  Laplace noise (its own lemma, as above) plus the multinomial variance, the Gaussian ``σ²``
  otherwise. (The records' sampling covariance is dense, overlapping cliques counting the
  same records; estimated from 20,000 draws of the start's law in place of its diagonal it
  did not choose better: KL 1.192 against 1.181 at ε = 1 below, 0.0713 against 0.0722 on
  seed 002's Erdős–Rényi graph at ε = 10, by hand.) Measured on seed 002's third-order chain
  (10 values, N = 10⁴, ten releases a row, by hand): with plain factors (``s_i = v_i``) the
  estimate ranked the paths wrongly (on two releases at ε = 1 it chose iterates of KL 1.260 and
  1.335 where naive MLE had 1.161 and 1.212); with Laplace factors the mean KL was 1.181 at ε = 1
  (naive MLE 1.221, naive MLE at the strength best for each release, chosen with the truth, 1.217;
  below naive in 9 of 10) and 5.600 at ε = 0.1 (6.151 and 5.668; below naive in 9 of 10);
  twenty releases and the grid: ``docs/measurements.md``. Elsewhere the whitened squared
  error above is kept.

``df_t`` is the Monte-Carlo divergence of Ramani, Blu & Unser (2008): EM is run again, from
the start fitted to each, on :data:`PROBES` perturbed releases ``y + δ∘z_p`` (Rademacher
``z_p``, ``δ_i = STEP·√v_i``) in lockstep with the release's own run, and
``df_t ≈ mean_p Σ_i z_{p,i} (ŷ_t(y + δ∘z_p)_i − ŷ_t(y)_i)/δ_i``. EM's path is not smooth in
``y`` (the Laplace kink, the E-step's stopping), so the difference quotient with a finite step
is the divergence of a smoothed path; the same probes serve every iterate, so the choice
depends on differences of ``R̂_t`` between iterates, which are far less noisy than ``R̂_t``.

The start's own dependence on ``y`` counts: on seed 002's chain (N = 10⁴, ε = 1, one release,
by hand) the naive start's divergence was 688 of ``m = 2,400``, and without it the rule
stopped at the first iteration where the error kept falling until the eighth. Because
``t = 0`` is a candidate, the rule can keep the start itself (naive MLE) where EM's moves do
not pay.

With several candidate starts (``init_l2_scale`` a sequence), each start's path is searched
and the least ``R̂`` over all of them wins; ``v`` comes from the first start, so that the
estimates are comparable. The default (:data:`RISK_STARTS`) is the naive fit alone for the
sample, and for the population the naive fit and a smoother one (4× the strength): the naive
start's path stays at naive MLE's level where the noise is large against the counts, and the
KL estimate tells the two paths apart (on the chain above it chose the smoother start in 10
of 10 releases at ε = 1, 6 of 10 at ε = 0.1). A third start (16×) was not better there (mean
KL 1.193 at ε = 1, 5.600 at ε = 0.1), nor were paths of 100 iterations at ε = 0.1 (5.556,
but one release at 6.566 against naive's 5.931). For the sample the whitened squared error
ranked the smoother start's path behind the naive start's, and on Adult at ε = 0.1 its path
had not reached its least risk after 50 iterations.

The choice is the earliest iterate within one standard error of the least ``R̂_t``
(:func:`one_standard_error`): the noise of the release moves ``R̂_t − R̂_{t*}`` by about
``2(Σ_i (ŷ_{t,i} − ŷ_{t*,i})²/v_i)^{1/2}``, and the plain least ``R̂_t`` chases it. On a
12-cell chain with 400 records and Laplace noise of scale 8 (24 releases, ``tests/estimation/
test_em_risk.py``) the plain least had mean KL 0.0904 against 0.0789 for the best fixed count
(no iteration), the one-standard-error choice 0.0813.

The path stops once ``R̂_t`` has not improved for ``max(PATIENCE, t_best/2)`` iterations (the
curves are U-shaped: the search is cut, not the choice), when EM stops, or at ``max_iters``.
Cost: ``1 + PROBES`` EM runs of the searched length instead of one, and ``PROBES`` naive fits
warm-started at the release's own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..infer.em_program import em_block, em_start_state
from ..measurements import Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from .losses import LAPLACE_FAMILY, MeasurementEvidence, term_answers

__all__ = ["MAX_PATH", "PATIENCE", "PROBES", "RISK_STARTS", "STEP", "TARGETS", "RiskPath",
           "one_standard_error", "resolve_stop", "risk_path", "start_scales"]

Array = Any

#: Perturbed releases of the Monte-Carlo divergence (module docstring).
PROBES = 2
#: The finite-difference step ``δ_i = STEP·√v_i`` of the divergence: small against the noise.
STEP = 0.1
#: The search stops after ``max(PATIENCE, t_best/2)`` iterations without a lower risk.
PATIENCE = 5
#: The estimands of ``target``.
TARGETS = ("sample", "population")
#: The longest path the risk rule searches from each start.
MAX_PATH = 50
#: The risk rule's candidate starts per ``target``: naive MLE with its rule's strength times
#: each of these (module docstring).
RISK_STARTS = {"sample": (1.0,), "population": (1.0, 4.0)}


def resolve_stop(max_iters: int | str, m_step_method: str, target: str) -> tuple[str, Any]:
    """``("risk", MAX_PATH)`` for ``max_iters="risk"`` (which needs the natural M-step: the
    compiled loop the risk path runs), else ``("iterations", max_iters)``."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if not isinstance(max_iters, str):
        return "iterations", max_iters
    if max_iters != "risk":
        raise ValueError(f"max_iters must be a count or 'risk', got {max_iters!r}")
    if m_step_method != "natural":
        raise ValueError("max_iters='risk' runs the compiled natural-space loop; with "
                         f"m_step_method={m_step_method!r} give a count")
    return "risk", MAX_PATH


def start_scales(init_l2_scale: float | Sequence[float] | None, stop: str,
                 target: str = "sample") -> tuple[float, ...]:
    """CGM-EM's candidate naive starts as multipliers of the naive rule's strength: ``None``
    is :data:`RISK_STARTS` of ``target`` for the risk rule and ``(1,)`` (the naive fit)
    otherwise; several need the risk rule, which chooses among them."""
    if init_l2_scale is None:
        return RISK_STARTS[target] if stop == "risk" else (1.0,)
    scales = ((init_l2_scale,) if isinstance(init_l2_scale, int | float)
              else tuple(init_l2_scale))
    if not scales or not all(math.isfinite(k) and k > 0 for k in scales):
        raise ValueError(f"init_l2_scale must be a positive number or a non-empty sequence of "
                         f"them, got {init_l2_scale!r}")
    if len(scales) > 1 and stop != "risk":
        raise ValueError("several starts (init_l2_scale as a sequence) need max_iters='risk', "
                         "which chooses among them")
    return tuple(float(k) for k in scales)


class RiskPath(NamedTuple):
    """The risk estimates along EM's paths from each start (iteration 0 is the start).

    ``risk[k][t]`` is ``R̂_t`` on the path from start ``k``, ``df[k][t]`` its divergence
    estimate; ``start`` and ``best`` the start and iteration of least ``R̂``; ``target`` the
    estimand; ``em_stopped[k]`` whether EM itself stopped the path from start ``k`` (converged,
    stalled or failed at the E-step after its last iterate).
    """

    risk: tuple[np.ndarray, ...]
    df: tuple[np.ndarray, ...]
    start: int
    best: int
    target: str
    em_stopped: tuple[bool, ...]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _answers(network: MarkovNetwork, evidence: MeasurementEvidence, theta: Array,
             data: Any, total: Array) -> Array:
    mu = total * network.flatten(jt.marginals(network, theta))
    return jnp.concatenate(term_answers(network, evidence.terms, mu, data))


def _noise_variances(measurements: Sequence[Measurement]) -> np.ndarray:
    """The noise variance of every released value."""
    return np.concatenate([np.full(int(np.size(m.values)), float(m.noise.variance))
                           for m in measurements])


def _variances(measurements: Sequence[Measurement], start: np.ndarray, total: float,
               target: str) -> np.ndarray:
    """``v_i`` of every released value about the estimand: the noise variance, plus the
    counts' multinomial variance about ``N·μ*`` for ``target="population"``."""
    noise = _noise_variances(measurements)
    if target == "sample":
        return noise
    p = np.clip(start / total, 0.0, 1.0)
    return noise + total * p * (1.0 - p)


def _stein_weights(measurements: Sequence[Measurement], residual: np.ndarray,
                   target: str) -> np.ndarray:
    """``w_i`` of the divergence (module docstring): 1 for Gaussian noise (Stein's lemma) and
    for the population; for Laplace noise of scale ``b`` about the records' tables,
    ``(|e_i|/b + 1)/2`` with the noise ``e_i`` read as the start's residual."""
    weights, k = [], 0
    for m in measurements:
        size = int(np.size(m.values))
        if target == "sample" and isinstance(m.noise, LAPLACE_FAMILY):
            weights.append((np.abs(residual[k:k + size]) / float(m.noise.scale) + 1.0) / 2.0)
        else:
            weights.append(np.ones(size))
        k += size
    return np.concatenate(weights)


class _KLLayout(NamedTuple):
    """What :func:`_cross_entropy` needs of a release whose every network clique is released
    whole: ``index[j]``, the position in ``y`` of the released value of the ``j``-th entry of
    ``θ``'s layout, and the constraints ``A`` (``A m = 0``: tables that agree on their shared
    margins and totals) with ``K⁺ = (A V Aᵀ)⁺``."""

    index: np.ndarray
    a: np.ndarray
    k_pinv: np.ndarray


def _margin_rows(shape: tuple[int, ...], keep: tuple[int, ...]) -> np.ndarray:
    """For every cell of a table of ``shape``, its cell in the margin over axes ``keep``."""
    cells = np.indices(shape).reshape(len(shape), -1)
    if not keep:
        return np.zeros(cells.shape[1], int)
    return np.ravel_multi_index(tuple(cells[k] for k in keep), tuple(shape[k] for k in keep))


def _kl_layout(network: MarkovNetwork, measurements: Sequence[Measurement],
               v: np.ndarray) -> _KLLayout | None:
    """The layout of :func:`_cross_entropy`, or ``None`` where a clique of the network is not
    released whole (an identity query of exactly its attributes; of several, the least noisy)."""
    offsets = np.cumsum([0] + [int(np.size(m.values)) for m in measurements])
    index = []
    for clique in network.cliques:
        whole = [k for k, m in enumerate(measurements)
                 if m.query is None and set(m.clique) == set(clique)]
        if not whole:
            return None
        k = min(whole, key=lambda k: float(measurements[k].noise.variance))
        attrs = measurements[k].clique
        cells = np.arange(offsets[k], offsets[k + 1]).reshape(
            [network.domain[x] for x in attrs])
        index.append(np.transpose(cells, [attrs.index(x) for x in clique]).ravel())
    blocks = []
    cliques = network.cliques
    for i in range(len(cliques)):
        for j in range(i + 1, len(cliques)):
            shared = tuple(x for x in cliques[i] if x in cliques[j])
            if not shared and j != i + 1:
                continue  # totals: consecutive pairs suffice
            size = int(np.prod([network.domain[x] for x in shared]))
            block = np.zeros((size, network.num_params))
            for c, sign in ((i, 1.0), (j, -1.0)):
                keep = tuple(cliques[c].index(x) for x in shared)
                rows = _margin_rows(network.shapes[c], keep)
                block[rows, network.offsets[c] + np.arange(network.sizes[c])] = sign
            blocks.append(block)
    if not blocks:
        return _KLLayout(np.concatenate(index), np.zeros((0, network.num_params)),
                         np.zeros((0, 0)))
    a = np.concatenate(blocks)
    index = np.concatenate(index)
    return _KLLayout(index, a, np.linalg.pinv((a * v[index]) @ a.T))


def _consistent_part(layout: _KLLayout, v: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """``Pᵀφ`` for the projection ``P = I − V Aᵀ K⁺ A`` onto tables that agree on their shared
    margins: it removes ``φ``'s gauge (the shifts between cliques that leave the model as it
    is), so that ``(Pᵀφ)·y`` does not depend on it."""
    return phi - layout.a.T @ (layout.k_pinv @ (layout.a @ (v * phi)))


@functools.partial(jax.jit, static_argnums=(0,))
def _log_partition(network: MarkovNetwork, theta: Array) -> Array:
    return jt.log_partition(network, theta)


def _perturbed(measurements: Sequence[Measurement], steps: np.ndarray) -> list[Measurement]:
    """The release with every value moved by its entry of ``steps``."""
    out, k = [], 0
    for m in measurements:
        size = int(np.size(m.values))
        values = np.asarray(m.values, float) + steps[k:k + size].reshape(np.shape(m.values))
        out.append(Measurement(m.clique, values, m.noise, m.query))
        k += size
    return out


def risk_path(
    network: MarkovNetwork,
    measurements: Sequence[Measurement],
    starts: Sequence[Callable[[Sequence[Measurement]], Array]],
    total: Array,
    schedule: Callable,
    opts: tuple,
    *,
    max_iters: int,
    target: str = "sample",
    rng_key: Any = None,
) -> RiskPath:
    """Run EM from each start and estimate the risk of every iterate (module docstring).

    Parameters
    ----------
    network : MarkovNetwork
    measurements : sequence of Measurement
        The release (checked); its values, structure and noise variances.
    starts : sequence of callables ``measurements -> θ_0``
        EM's candidate starts as functions of a release: each is applied to the perturbed
        releases too, so that the divergence counts the start's dependence on ``y``. The
        variances ``v_i`` (``target="population"``) come from the first start.
    total, schedule, opts
        As :func:`~numpyro_dpgm.estimation.em_program.em_block` takes them.
    max_iters : int
        The longest path searched from each start.
    target : {"sample", "population"}
        The estimand (module docstring).
    rng_key : JAX PRNG key, optional
        The probes' signs (default ``jax.random.key(0)``: the choice is then a function of the
        release alone).

    Returns
    -------
    RiskPath
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    evidence, data = MeasurementEvidence.build(network, measurements)
    y = np.concatenate([np.ravel(np.asarray(m.values, float)) for m in measurements])
    first = starts[0](measurements)
    y0 = np.asarray(_answers(network, evidence, first, data, total))
    v = _variances(measurements, y0, float(total), target)
    w = _stein_weights(measurements, y - y0, target)
    key = jax.random.key(0) if rng_key is None else rng_key
    z = np.asarray(jax.random.rademacher(key, (PROBES, y.size), dtype=jnp.float32)).astype(float)
    delta = STEP * np.sqrt(v)
    releases = [measurements] + [_perturbed(measurements, delta * zp) for zp in z]
    datas = [data] + [MeasurementEvidence.build(network, r)[1] for r in releases[1:]]

    layout = _kl_layout(network, measurements, v) if target == "population" else None
    if layout is not None:
        # Stein's factor of each value for the KL: b(|e| + b) for Laplace noise (its own
        # lemma, |e| read as the start's residual) plus the counts' multinomial variance
        noise = _noise_variances(measurements)
        stein = _stein_weights(measurements, y - y0, "sample") * noise + (v - noise)

    def risk_of(carries: list) -> tuple[float, float, np.ndarray]:
        if layout is not None:
            return _cross_entropy(network, layout, [c.theta for c in carries], y, v, stein, z,
                                  delta, total)
        answers = [np.asarray(_answers(network, evidence, c.theta, d, total))
                   for c, d in zip(carries, datas, strict=True)]
        df = float(np.mean([np.sum(w * zp * (a - answers[0]) / delta)
                            for zp, a in zip(z, answers[1:], strict=True)]))
        return float(np.sum((answers[0] - y) ** 2 / v)) - y.size + 2.0 * df, df, answers[0]

    risks, dfs, fitted, stopped = [], [], [], []
    for k, start_of in enumerate(starts):
        thetas = [first if k == 0 else start_of(measurements)]
        thetas += [start_of(r) for r in releases[1:]]
        carries = [em_start_state(network, evidence, th, d, total)[0]
                   for th, d in zip(thetas, datas, strict=True)]
        path = [risk_of(carries)]
        best, ended = 0, False
        for t in range(1, max_iters + 1):
            carries = [em_block(network, evidence, schedule, d, total, c,
                                jnp.asarray(int(c.moves) + 1, jnp.int32), *opts)[0]
                       for c, d in zip(carries, datas, strict=True)]
            if int(carries[0].moves) < t:  # EM stopped (converged, stalled or failed)
                ended = True
                break
            path.append(risk_of(carries))
            if path[-1][0] < path[best][0]:
                best = t
            if t - best >= max(PATIENCE, math.ceil(best / 2)):
                break
        risks.append(np.asarray([r for r, _, _ in path]))
        dfs.append(np.asarray([d for _, d, _ in path]))
        fitted.append([a for _, _, a in path])
        stopped.append(ended)
    start = int(np.argmin([np.min(r) for r in risks]))
    # the risk's noise between iterates: 2(Σ Δŷ²/v)^½ whitened, (Σ v_i Δℓ_i²)^½ for the KL
    scale = v if layout is None else 4.0 / v[layout.index]
    return RiskPath(tuple(risks), tuple(dfs), start,
                    one_standard_error(risks[start], fitted[start], scale), target,
                    tuple(stopped))


def _cross_entropy(network: MarkovNetwork, layout: _KLLayout, thetas: Sequence[Array],
                   y: np.ndarray, v: np.ndarray, stein: np.ndarray, z: np.ndarray,
                   delta: np.ndarray, total: Any) -> tuple[float, float, np.ndarray]:
    """``(N·R̂, df, Pᵀφ)``: Stein's estimate of ``N`` times the cross-entropy
    ``−E_{p*} log q_φ = −φ·μ* + A(φ)`` of the fit (``thetas[0]``; ``thetas[1:]`` on the
    perturbed releases) to the population ``p*``, whose KL to it differs by a constant
    (module docstring)."""
    i = layout.index
    phis = [_consistent_part(layout, v[i], np.asarray(t)) for t in thetas]
    df = float(np.mean([np.sum(stein[i] * zp[i] * (ph - phis[0]) / delta[i])
                        for zp, ph in zip(z, phis[1:], strict=True)]))
    risk = (-float(np.sum(phis[0] * y[i])) + float(total) * float(
        _log_partition(network, thetas[0])) + df)
    return risk, df, phis[0]


def one_standard_error(risk: np.ndarray, answers: Sequence[np.ndarray], v: np.ndarray) -> int:
    """The first iterate whose ``R̂_t`` is within one standard error of the least.

    ``R̂_t − R̂_{t*}`` carries the noise ``−2Σ_i (ŷ_{t,i} − ŷ_{t*,i}) e_i / v_i`` of the release,
    of standard deviation ``2·(Σ_i (ŷ_{t,i} − ŷ_{t*,i})²/v_i)^{1/2}``: an iterate that lies within
    it of the least is not distinguishable from it, and the earliest such iterate (the most
    regularised, nearest the start) is kept, the one-standard-error rule of Breiman et al.
    (1984, §3.4.3).
    """
    best = int(np.argmin(risk))
    for t in range(best):
        se = 2.0 * math.sqrt(float(np.sum((answers[t] - answers[best]) ** 2 / v)))
        if risk[t] <= risk[best] + se:
            return t
    return best
