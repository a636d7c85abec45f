"""DP-SGD on the MRF log-likelihood: the private baseline of seed 002 (§4, "PSGD").

Private stochastic gradient descent (Abadi et al. 2016, Alg. 1) applied to the average
log-likelihood of records under an MRF, ``ℓ(θ) = (1/N) Σ_i θ·φ(x_i) − A(θ)`` (seed 002, Eq. 2):

1. Poisson-sample a lot: every record joins independently with probability ``q = L/N``;
2. per-record gradient ``g_i = Jᵀ(φ(x_i) − μ(θ))`` (``φ`` the one-hot cell indicators of every
   clique, ``μ = ∇A`` from the junction tree, ``J`` the optional tying of parameters);
3. clip each to norm ``c``: ``ḡ_i = g_i · min(1, c/‖g_i‖)``;
4. ``θ ← θ + η · ((Σ_lot ḡ_i + c·σ·z) / L − λθ)``, ``z ~ N(0, I)``.

Clipping needs no per-record gradient in memory: ``‖g_i‖² = ‖Jᵀφ(x_i)‖² − 2 (Jᵀφ(x_i))·(Jᵀμ)
+ ‖Jᵀμ‖²`` and ``Σ w_i g_i = Σ w_i Jᵀφ(x_i) − (Σ w_i) Jᵀμ``, so one step costs one junction-tree
calibration plus ``O(lot · |𝒞|)`` gathers and scatters.

Privacy. One record changes the clipped sum by at most ``c`` in L2 norm under add/remove
neighbours, so each step is the Poisson-subsampled Gaussian mechanism with noise multiplier
``σ``; ``T`` steps are accounted with ``dp_accounting`` (RDP by default, or PLD) and converted to
``(ε, δ)``, with ``δ = 1/N`` by default as in seed 002 (§4.1). :func:`calibrate_noise_multiplier`
finds the smallest ``σ`` whose accounted ε is at most the target (bisection over the
accountant). A target that needs ``σ`` above ``max_noise_multiplier`` is *unreachable* with the
chosen lot size and number of steps: :class:`UnreachableEpsilonError` says so (seed 002 omits
such ε from its plots). DP-SGD gives ``(ε, δ)``-DP, weaker than the pure ε-DP of the Laplace
releases the other estimators use.
"""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..data import Dataset
from ..distributions.mrf import MarkovRandomField
from ..estimation.contract import approx_budget, stochastic_key
from ..infer.result import Result
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.mle import check_tie
from ..privacy.guarantees import ApproxDP
from ..privacy.ledger import PrivacyLedger

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "ACCOUNTANTS",
    "UnreachableEpsilonError",
    "accounted_epsilon",
    "calibrate_noise_multiplier",
    "log_likelihood_gradient",
    "psgd",
]

Array = Any

ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")

#: Default cap on the noise multiplier σ (see :class:`PSGDConfig`).
DEFAULT_MAX_NOISE_MULTIPLIER = 50.0


_SIGMA_FLOOR = 0.05


class UnreachableEpsilonError(ValueError):
    """The target ε needs a noise multiplier above the cap for the lot size and steps chosen."""


# ------------------------------------------------------------------------------------------------
# accounting
# ------------------------------------------------------------------------------------------------
def _accountant(kind: str) -> dp_accounting.PrivacyAccountant:
    import dp_accounting  # imported on first use: it loads scipy.signal (half a second)

    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")


def _event(noise_multiplier: float, sampling_rate: float, steps: int) -> dp_accounting.DpEvent:
    import dp_accounting

    step = dp_accounting.PoissonSampledDpEvent(
        sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def accounted_epsilon(
    noise_multiplier: float, sampling_rate: float, steps: int, delta: float,
    accountant: str = "rdp",
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps at ``δ`` (add/remove neighbours)."""
    acc = _accountant(accountant)
    acc.compose(_event(noise_multiplier, sampling_rate, steps))
    return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(
    epsilon: float, delta: float, sampling_rate: float, steps: int,
    *, accountant: str = "rdp", max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
    tol: float = 1e-3,
) -> float:
    """Smallest noise multiplier ``σ`` (to ``tol``) whose accounted ε is at most ``epsilon``.

    Bisection over the accountant (``dp_accounting.calibrate_dp_mechanism``) on
    ``[0.05, max_noise_multiplier]``; the returned σ satisfies ``ε(σ) ≤ epsilon``.

    Raises
    ------
    UnreachableEpsilonError
        if even ``σ = max_noise_multiplier`` accounts to more than ``epsilon``.
    """
    _check_positive(epsilon=epsilon, max_noise_multiplier=max_noise_multiplier, tol=tol)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps}")
    return _calibrate(float(epsilon), float(delta), float(sampling_rate), int(steps), accountant,
                      float(max_noise_multiplier), float(tol))


@functools.lru_cache(maxsize=256)
def _calibrate(epsilon: float, delta: float, sampling_rate: float, steps: int, accountant: str,
               max_noise_multiplier: float, tol: float) -> float:
    """The bisection of :func:`calibrate_noise_multiplier`, memoised: it depends on public
    hyper-parameters only, and repeated fits at one setting (trials of an experiment) need it
    once."""
    at_cap = accounted_epsilon(max_noise_multiplier, sampling_rate, steps, delta, accountant)
    if at_cap > epsilon:
        raise UnreachableEpsilonError(
            f"ε = {epsilon:g} at δ = {delta:g} is unreachable: {steps} steps at sampling rate "
            f"{sampling_rate:.4g} spend ε = {at_cap:.4g} even at the largest noise multiplier "
            f"{max_noise_multiplier:g}; use fewer epochs, a smaller lot or more records"
        )
    lo, hi = _bracket(epsilon, delta, sampling_rate, steps, accountant, max_noise_multiplier,
                      tol)
    if lo == hi:
        return lo
    from dp_accounting import mechanism_calibration

    sigma = mechanism_calibration.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda s: _event(s, sampling_rate, int(steps)),
        epsilon, delta,
        mechanism_calibration.ExplicitBracketInterval(lo, hi),
        tol=tol,
    )
    return float(sigma)


def _bracket(epsilon: float, delta: float, sampling_rate: float, steps: int, accountant: str,
             max_noise_multiplier: float, tol: float) -> tuple[float, float]:
    """``(lo, hi)`` with ``ε(lo) > epsilon ≥ ε(hi)`` for the bisection (``lo == hi``: that σ).

    The PLD accountant costs seconds per σ below 1 and explodes below σ ≈ 0.05, where the RDP
    accountant costs milliseconds; RDP's ε bounds the same mechanism's from above, so RDP's
    calibrated σ brackets PLD's from above and half of it, checked, from below. Each bound is
    checked with the accountant itself, and the interval falls back to ``[0.05, cap]``."""
    floor = min(_SIGMA_FLOOR, max_noise_multiplier)
    lo, hi = floor, max_noise_multiplier
    if accountant != "rdp":
        try:
            upper = _calibrate(epsilon, delta, sampling_rate, steps, "rdp",
                               max_noise_multiplier, tol)
        except UnreachableEpsilonError:  # RDP's looser ε: PLD may still reach it below the cap
            upper = max_noise_multiplier
        if accounted_epsilon(upper, sampling_rate, steps, delta, accountant) <= epsilon:
            hi = upper
            half = max(0.5 * upper, floor)
            if accounted_epsilon(half, sampling_rate, steps, delta, accountant) > epsilon:
                return half, hi
    # below σ ≈ 0.05 the PLD accountant's discretisation explodes; such σ are never needed for
    # the ε of interest, and the floor itself is returned when it already meets the target
    if accounted_epsilon(floor, sampling_rate, steps, delta, accountant) <= epsilon:
        return floor, floor
    return lo, hi


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, int | float | np.floating | np.integer) and math.isfinite(v)
                and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")


# ------------------------------------------------------------------------------------------------
# gradient
# ------------------------------------------------------------------------------------------------
def log_likelihood_gradient(
    network: MarkovNetwork, records: Any, theta: Array, tie: Any = None,
) -> Array:
    """Per-record gradients ``Jᵀ(φ(x_i) − μ(θ_full))`` of ``log p(x_i; θ)`` (dense, for tests).

    ``theta`` holds the free parameters; with ``tie`` (an index map, see :func:`psgd`) the
    network's log-potentials are ``theta[tie]``.
    """
    tie_idx, k = check_tie(network, tie)
    theta = jnp.asarray(theta)
    mu = network.flatten(jt.marginals(network, theta[tie_idx]))
    m = jax.ops.segment_sum(mu, tie_idx, num_segments=k)
    cells = jnp.asarray(tie_idx)[network.cell_indices(jnp.asarray(records))]  # (n, |C|)
    phi = jax.vmap(lambda c: jnp.zeros(k, mu.dtype).at[c].add(1.0))(cells)
    return phi - m


class _Data(NamedTuple):
    cells: Array  # (N, |C|) free-parameter index of each record's cell per clique
    sq_norm: Array  # (N,) ‖Jᵀφ(x_i)‖²


@functools.partial(jax.jit, static_argnames=("network", "num_free", "steps", "max_lot"))
def _run(network, tie_idx, num_free, data, key, theta0, steps, max_lot, rate, expected_lot,
         sigma, clip, lr, l2):
    n = data.cells.shape[0]

    def full(w):
        return w[tie_idx]

    def step(carry, key):
        w = carry
        mu = network.flatten(jt.marginals(network, full(w)))
        m = jax.ops.segment_sum(mu, tie_idx, num_segments=num_free)
        k_sample, k_noise = jax.random.split(key)
        mask = jax.random.bernoulli(k_sample, rate, (n,))
        (lot,) = jnp.nonzero(mask, size=max_lot, fill_value=n)
        valid = lot < n
        lot = jnp.where(valid, lot, 0)
        cells = data.cells[lot]  # (max_lot, |C|)
        dot = jnp.sum(m[cells], axis=1)
        norm = jnp.sqrt(jnp.maximum(data.sq_norm[lot] - 2 * dot + jnp.dot(m, m), 0.0))
        scale = jnp.where(valid, jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-300)), 0.0)
        scale = jnp.where(jnp.isinf(clip), valid.astype(w.dtype), scale)
        summed = jnp.zeros(num_free, w.dtype).at[cells.ravel()].add(
            jnp.repeat(scale, cells.shape[1])) - jnp.sum(scale) * m
        noise = jnp.where(sigma > 0, sigma * clip, 0.0) * jax.random.normal(
            k_noise, (num_free,), w.dtype)
        grad = (summed + noise) / expected_lot - l2 * w
        overflow = jnp.sum(mask) > max_lot
        return w + lr * grad, overflow

    keys = jax.random.split(key, steps)
    w, overflow = jax.lax.scan(step, theta0, keys)
    return w, jnp.sum(overflow)


# ------------------------------------------------------------------------------------------------
# the estimator
# ------------------------------------------------------------------------------------------------
def psgd(
    data: Any,
    network: MarkovNetwork,
    *,
    budget: ApproxDP | float | None,
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    delta: float | None = None,
    epochs: float = 5.0,
    lot_size: int | None = None,
    clip_norm: float | None = None,
    learning_rate: float = 0.5,
    l2: float = 0.0,
    noise_multiplier: float | None = None,
    max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
    accountant: str = "rdp",
    tie: Any = None,
    init: Any = None,
) -> Result:
    """Learn an MRF from records by DP-SGD (Abadi et al. 2016) with a calibrated accountant.

    Parameters
    ----------
    data : int array ``(N, num_attrs)`` or Dataset
        One record per person (codes in domain order); the guarantee is per record.
    network : MarkovNetwork
        The model's structure (a learner of parameters needs its cliques; the learners of
        structure take a domain in this place).
    budget : ApproxDP, float or None
        The target ``(ε, δ)``: an :class:`~numpyro_dpgm.privacy.ApproxDP`, or a bare ``ε``
        with ``δ = delta`` (default ``1/N``, seed 002, §4.1). ``None`` runs without noise
        (non-private, for tests and references) unless ``noise_multiplier`` is given.
    rng_key : JAX PRNG key
        Lot sampling and noise (**simulation**: JAX's floating-point Gaussian sampler);
        required (a ``TypeError`` without it).
    ledger : PrivacyLedger, optional
        Debited with the accounted ``ApproxDP(ε, δ)`` of the run before the first step (an
        ``"approx"`` ledger; a zCDP ledger cannot pay an (ε, δ) guarantee and refuses).
    delta : float, optional
        δ of the guarantee when ``budget`` is a bare ε or when ``noise_multiplier`` is
        given; default ``1/N``.
    epochs : float
        Passes over the data: ``T = ceil(epochs·N/L)`` steps.
    lot_size : int, optional
        Expected lot size ``L`` (Poisson rate ``q = L/N``); default ``ceil(√N)``; ``N`` runs
        full-batch gradient descent.
    clip_norm : float, optional
        ``c``; default ``√|𝒞|`` (the norm of ``φ(x)`` for an untied network: one cell per
        clique). ``inf`` disables clipping (non-private runs only).
    learning_rate : float
        ``η`` of the ascent step on the average log-likelihood. The defaults (5 epochs, lot
        ``√N``, ``η = 0.5``) were the best of ``η ∈ {0.1, 0.5, 2}`` × lot ``∈ {100, 1000}`` ×
        ``{1, 5}`` epochs on a separate 10-node third-order chain (``|X| = 10``, ``N = 10⁴``,
        ε = 1; KL to the truth 1.10 against 1.26–8.4 for the others), seed 002's "grid search"
        done once on synthetic data.
    l2 : float
        ``λ`` of an L2 penalty ``(λ/2)‖θ‖²`` (needs no privacy: it does not touch the data).
    noise_multiplier : float, optional
        ``σ`` given directly (then ``epsilon`` is computed, not targeted).
    max_noise_multiplier : float
        Cap on the calibrated σ: beyond it the noise on the averaged gradient, ``σc/L`` per
        coordinate per step, swamps the signal (a gradient coordinate is a difference of
        marginal probabilities, at most 1) for any lot size used here. Targets that need more
        raise :class:`UnreachableEpsilonError`.
    accountant : {"rdp", "pld"}
        ``dp_accounting``'s Rényi-DP or privacy-loss-distribution accountant.
    tie : int array ``(num_params,)``, optional
        Parameter tying: the network's log-potentials are ``w[tie]`` for free parameters ``w``
        (e.g. a time-homogeneous chain shares one pairwise table across steps).
    init : array, optional
        Starting free parameters (default zero).

    Returns
    -------
    Result
        ``model`` at the final iterate; ``loss_trace`` is empty (the private objective is never
        evaluated on the data); ``iterations = T``; ``converged`` is ``True`` (a fixed budget of
        steps). ``extras``: ``epsilon``, ``delta``, ``noise_multiplier``, ``sampling_rate``,
        ``steps``, ``lot_size``, ``clip_norm``, ``learning_rate``, ``accountant``, ``free_params``
        (the tied parameters ``w``), ``lot_overflow`` (steps whose lot exceeded the fixed buffer
        and lost records; 0 in practice).

    Raises
    ------
    UnreachableEpsilonError
        if the target ε needs σ above ``max_noise_multiplier``.
    BudgetExceededError
        if ``ledger`` cannot pay the run; nothing is drawn.
    ValueError, TypeError
        for bad records, a bad budget or hyper-parameters.
    """
    start = time.perf_counter()
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    if isinstance(data, Dataset):
        if data.domain != network.domain:
            raise ValueError("the Dataset's domain differs from the network's domain")
        data = data.to_array()
    x = np.asarray(data)
    d = len(network.domain)
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"records must have shape (N, {d}), one column per attribute; got "
                         f"{x.shape}")
    if x.shape[0] < 1:
        raise ValueError("psgd needs at least one record")
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"records must be integer codes, got dtype {x.dtype}")
    sizes = np.asarray(network.domain.shape)
    if np.any(x < 0) or np.any(x >= sizes):
        bad = int(np.argmax(np.any((x < 0) | (x >= sizes), axis=1)))
        raise ValueError(f"record {bad} has a code outside the domain {dict(network.domain)}")
    n = x.shape[0]
    target = approx_budget(budget, delta, "psgd", default_delta=1.0 / n)
    delta = target.delta if target is not None else 1.0 / n if delta is None else float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    key = stochastic_key(rng_key, "psgd")
    key = jax.random.key(int(key)) if isinstance(key, int | np.integer) else key
    _check_positive(epochs=epochs, learning_rate=learning_rate,
                    max_noise_multiplier=max_noise_multiplier)
    if not math.isfinite(l2) or l2 < 0:
        raise ValueError(f"l2 must be finite and non-negative, got {l2}")
    lot = math.ceil(math.sqrt(n)) if lot_size is None else lot_size
    if int(lot) != lot or not 1 <= lot <= n:
        raise ValueError(f"lot_size must be an integer in [1, N = {n}], got {lot_size}")
    lot = int(lot)
    tie_idx, num_free = check_tie(network, tie)
    clip = math.sqrt(len(network.cliques)) if clip_norm is None else float(clip_norm)
    if not clip > 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    rate = lot / n
    steps = max(1, math.ceil(epochs * n / lot))

    if noise_multiplier is not None:
        sigma = float(noise_multiplier)
        if not math.isfinite(sigma) or sigma < 0:
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {sigma}")
        if target is not None:
            raise ValueError("give either budget (σ is calibrated) or noise_multiplier")
    elif target is None:
        sigma = 0.0
    else:
        sigma = calibrate_noise_multiplier(target.epsilon, delta, rate, steps,
                                           accountant=accountant,
                                           max_noise_multiplier=max_noise_multiplier)
    if sigma > 0 and not math.isfinite(clip):
        raise ValueError("a private run needs a finite clip_norm")
    spent = (accounted_epsilon(sigma, rate, steps, delta, accountant) if sigma > 0
             else math.inf)
    if ledger is not None:
        if sigma == 0:
            raise ValueError("a non-private run (budget=None, no noise) must not be given a "
                             "ledger")
        ledger.debit(ApproxDP(spent, delta), "psgd: DP-SGD on the MRF log-likelihood",
                     {"mechanism": "Poisson-subsampled Gaussian (Abadi et al. 2016)",
                      "noise_multiplier": sigma, "sampling_rate": rate, "steps": steps,
                      "clip_norm": clip, "accountant": accountant,
                      "neighbours": "add_remove", "sampler": "jax (simulation)"})

    dtype = jnp.result_type(float)
    if dtype == jnp.float32:
        warn_if_float32("psgd")
    w0 = jnp.zeros(num_free, dtype) if init is None else jnp.asarray(init, dtype)
    if w0.shape != (num_free,):
        raise ValueError(f"init has shape {w0.shape}; expected ({num_free},)")
    cells = np.asarray(tie_idx)[np.asarray(network.cell_indices(x))]
    # ‖Jᵀφ(x_i)‖² = number of clique pairs whose cells share a free parameter
    sq = np.sum(cells[:, :, None] == cells[:, None, :], axis=(1, 2)).astype(float)
    max_lot = n if lot == n else min(n, int(lot + 8 * math.sqrt(lot) + 16))
    w, overflow = _run(network, jnp.asarray(tie_idx), num_free,
                       _Data(jnp.asarray(cells), jnp.asarray(sq, dtype)), key, w0, steps,
                       max_lot, jnp.asarray(rate, dtype), jnp.asarray(lot, dtype),
                       jnp.asarray(sigma, dtype), jnp.asarray(clip, dtype),
                       jnp.asarray(learning_rate, dtype), jnp.asarray(l2, dtype))
    w = jax.block_until_ready(w)
    theta = w[jnp.asarray(tie_idx)]
    return Result(
        model=MarkovRandomField(network, theta),
        loss_trace=np.zeros(0),
        iterations=steps,
        converged=True,
        elapsed=time.perf_counter() - start,
        extras={"epsilon": spent, "delta": delta, "noise_multiplier": sigma,
                "sampling_rate": rate, "steps": steps, "lot_size": lot, "clip_norm": clip,
                "learning_rate": float(learning_rate), "accountant": accountant,
                "free_params": w, "lot_overflow": int(overflow)},
    )
