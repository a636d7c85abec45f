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
- ``target="population"``: the tables ``N·μ*`` of the model that drew the records (seed 002's
  KL to the truth); ``v_i`` adds the multinomial variance ``N p_i (1 − p_i)`` of the counts,
  with ``p`` the start's answers over ``N``.

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
estimates are comparable. The default is one start, naive MLE's own fit
(:data:`RISK_STARTS`): a smoother start (4× the strength) reached a lower KL on seed 002's
chain (1.08 against 1.15 at N = 10⁴, ε = 1, one release, by hand), but the whitened squared
error ranked it behind the naive start there, and on Adult at ε = 0.1 its path had not reached
its least risk after 50 iterations.

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
#: The risk rule's candidate starts: naive MLE with its rule's strength times each of these
#: (its own fit; module docstring).
RISK_STARTS = (1.0,)


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


def start_scales(init_l2_scale: float | Sequence[float] | None, stop: str) -> tuple[float, ...]:
    """CGM-EM's candidate naive starts as multipliers of the naive rule's strength: ``None``
    is :data:`RISK_STARTS` for the risk rule and ``(1,)`` (the naive fit) otherwise; several
    need the risk rule, which chooses among them."""
    if init_l2_scale is None:
        return RISK_STARTS if stop == "risk" else (1.0,)
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


def _variances(measurements: Sequence[Measurement], start: np.ndarray, total: float,
               target: str) -> np.ndarray:
    """``v_i`` of every released value about the estimand: the noise variance, plus the
    counts' multinomial variance about ``N·μ*`` for ``target="population"``."""
    noise = np.concatenate([np.full(int(np.size(m.values)), float(m.noise.variance))
                            for m in measurements])
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

    def risk_of(carries: list) -> tuple[float, float, np.ndarray]:
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
    return RiskPath(tuple(risks), tuple(dfs), start,
                    one_standard_error(risks[start], fitted[start], v), target, tuple(stopped))


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
