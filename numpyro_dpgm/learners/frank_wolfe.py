"""Private Frank–Wolfe for ℓ1-constrained logistic regression (seed 001, Alg. 1).

The problem (seed 001, §3.1): given records ``(x^m, y^m)``, ``m = 1..n``, with ``‖x^m‖_∞ ≤ 1`` and
``y^m ∈ {−1, +1}``, minimise the empirical logistic loss

.. math:: L(w; D) = \\frac1n \\sum_m \\log\\big(1 + e^{-y^m⟨w, x^m⟩}\\big)

over the ℓ1 ball ``C = {‖w‖_1 ≤ r} = conv{±r e_j}`` under ρ-zCDP. Algorithm 1 (Talwar, Thakurta &
Zhang 2014, Thm 5.5, in its zCDP form) is Frank–Wolfe whose linear minimisation over the ``2d``
vertices is replaced by Laplace report-noisy-min::

    w_1 = 0
    for t = 1 .. T−1:
        g   = ∇L(w_t; D)
        α_s = ⟨s, g⟩ + Lap(b)        for every vertex s ∈ {±r e_j}
        s_t = argmin_s α_s
        w_{t+1} = (1 − μ_t) w_t + μ_t s_t,     μ_t = 2/(t+2)
    return w_T                        (the last iterate; no averaging)

with noise scale ``b = c · L1 ‖C‖_1 √T / (n √ρ)`` (spec zhang2020 §3 [review]); ``L1 = 1`` is the
ℓ1-Lipschitz constant of the logistic loss when ``‖x‖_∞ ≤ 1`` and ``‖C‖_1 = r``. The iterate never
leaves ``C`` and has at most ``T − 1`` non-zeros.

Number of iterations (Lemma 3.3 / Corollary 3.4): ``T = (Γ n √ρ / (L1 ‖C‖_1))^{2/3}`` with curvature
``Γ ≤ r²`` (Lemma 3.5) gives ``T = (r n √ρ)^{2/3}``; the default is
``T = max(2, round((r n √ρ)^{2/3}))`` computed from the *public* record count ``n`` (spec §3).
With it, the excess empirical risk is ``O(r^{4/3} log(n d / β) / (n √ρ)^{2/3})`` w.p. ``1 − β``
(Corollary 3.4).

Privacy constant (spec §3 "privacy accounting", §10.1). A score ``⟨s, ∇L⟩`` changes by at most
``Δ = 2 L1 ‖C‖_1 / n`` when one record is replaced, and the scores are not monotone, so one noisy
selection is ``ε_0 = 2Δ/b``-DP (Dwork & Roth 2014, Claim 3.9), i.e. ``ε_0²/2``-zCDP
(Bun & Steinke 2016, Prop. 1.4), and ``T − 1`` selections compose to at most
``8 ρ / c²``-zCDP. Hence

* ``noise_multiplier="rigorous"`` (the default): ``c = 2√2``, which makes the run ρ-zCDP under
  replace-one neighbours;
* ``noise_multiplier="paper"``: ``c = 1``, the paper's printed constant, which is only
  ``8ρ``-zCDP by this analysis. The ledger is charged the guarantee the run really has
  (``8ρ/c²``) and records the constant used.

Simulation noise. The Laplace draws come from a JAX PRNG key, so runs are reproducible; this is
meant for simulation studies. JAX's sampler is not a vetted floating-point-safe DP sampler.

Diagnostics. ``loss_trace`` and ``gap`` are computed from the raw data and are not privatised;
they are for simulations and must not be released alongside ``weights``.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..privacy.conversions import approx_to_zcdp
from ..privacy.guarantees import ZCDP, ApproxDP, PureDP
from ..privacy.ledger import PrivacyLedger

__all__ = [
    "DEFAULT_NONPRIVATE_ITERATIONS",
    "NOISE_MULTIPLIERS",
    "FrankWolfeResult",
    "default_iterations",
    "fw_noise_scale",
    "fw_zcdp_cost",
    "logistic_loss",
    "private_frank_wolfe",
    "resolve_noise_multiplier",
    "resolve_privacy",
]

Array = Any
NoiseMultiplier = float | Literal["paper", "rigorous"]

#: The named noise multipliers ``c`` of ``b = c·L1‖C‖_1√T/(n√ρ)`` (spec zhang2020 §3).
NOISE_MULTIPLIERS: dict[str, float] = {"paper": 1.0, "rigorous": 2.0 * math.sqrt(2.0)}

#: ``T`` of a non-private run (``privacy=None``) when ``iterations`` is not given.
DEFAULT_NONPRIVATE_ITERATIONS = 1000


class FrankWolfeResult(NamedTuple):
    """What :func:`private_frank_wolfe` returns.

    Attributes
    ----------
    weights : array ``(d,)``
        ``w_T``, the private output.
    loss_trace : array ``(T,)``
        ``L(w_t; D)`` for ``t = 1..T`` (non-private diagnostic).
    gap : float
        Frank–Wolfe duality gap ``⟨w_T, g⟩ + r‖g‖_∞`` at ``w_T`` (non-private diagnostic; an
        upper bound on ``L(w_T) − min_C L``).
    selections : int array ``(T − 1,)``
        Index ``k`` of the chosen vertex at every step: ``+r e_k`` for ``k < d``, ``−r e_{k−d}``
        otherwise.
    iterations : int
        ``T``, the parameter of Alg. 1 (``T − 1`` noisy selections are made).
    noise_scale : float
        Laplace scale ``b`` (0 for a non-private run).
    noise_multiplier : float
        The constant ``c`` in ``b``.
    rho : float or None
        The ρ the noise was calibrated for (``None``: non-private).
    rho_spent : float
        The zCDP guarantee of the run under replace-one neighbours, ``8ρ/c²`` (0 if non-private).
    radius : float
        ``r``.
    num_records : int
        The public ``n`` used for the loss normalisation, ``T`` and ``b``.
    elapsed : float
        Wall-clock seconds, compilation included.
    """

    weights: Array
    loss_trace: Array
    gap: float
    selections: Array
    iterations: int
    noise_scale: float
    noise_multiplier: float
    rho: float | None
    rho_spent: float
    radius: float
    num_records: int
    elapsed: float


# ------------------------------------------------------------------------------------------------
# calibration
# ------------------------------------------------------------------------------------------------
def resolve_noise_multiplier(noise_multiplier: NoiseMultiplier) -> float:
    """The constant ``c`` of a named or numeric ``noise_multiplier`` (``"paper"``: 1,
    ``"rigorous"``: 2√2, or a positive float)."""
    if isinstance(noise_multiplier, str):
        try:
            return NOISE_MULTIPLIERS[noise_multiplier]
        except KeyError:
            raise ValueError(
                f"unknown noise_multiplier {noise_multiplier!r}; choose 'rigorous' (c = 2√2, "
                "ρ-zCDP under replace-one), 'paper' (c = 1, seed 001's constant) or a positive "
                "number"
            ) from None
    c = float(noise_multiplier)
    if not math.isfinite(c) or c <= 0:
        raise ValueError(f"noise_multiplier must be a positive number, got {noise_multiplier!r}")
    return c


def resolve_privacy(privacy: Any) -> tuple[float | None, ZCDP | ApproxDP | None]:
    """The ρ to calibrate for, from a privacy target.

    Parameters
    ----------
    privacy : float, ZCDP, ApproxDP or None
        A float is ρ (these mechanisms are zCDP mechanisms); ``ApproxDP(ε, δ)`` is turned into the
        largest ρ whose ρ-zCDP implies (ε, δ)-DP, ``√ρ = √(ln(1/δ)+ε) − √(ln(1/δ))``
        (Lemma 2.13, Bun & Steinke 2016, Prop. 1.3); ``None`` means a non-private run.

    Returns
    -------
    (rho, target)
        ``(None, None)`` for a non-private run.

    Raises
    ------
    ValueError
        for ρ ≤ 0, ε ≤ 0, δ ∉ (0, 1), or a pure ε-DP target (a zCDP mechanism is not ε-DP).
    """
    if privacy is None:
        return None, None
    if isinstance(privacy, PureDP):
        raise ValueError(
            "these learners are ρ-zCDP mechanisms (Laplace report-noisy-min composed over many "
            "steps) and cannot meet a pure ε-DP target; pass ZCDP(rho), a float rho, or "
            "ApproxDP(epsilon, delta)"
        )
    if isinstance(privacy, ZCDP):
        return privacy.rho, privacy
    if isinstance(privacy, ApproxDP):
        return approx_to_zcdp(privacy.epsilon, privacy.delta), privacy
    if isinstance(privacy, bool) or not isinstance(privacy, int | float | np.floating):
        raise TypeError(
            f"privacy must be a float rho, ZCDP(rho), ApproxDP(epsilon, delta) or None, got "
            f"{privacy!r}"
        )
    target = ZCDP(float(privacy))  # validates ρ > 0 and finite
    return target.rho, target


def default_iterations(radius: float, num_records: int, rho: float) -> int:
    """``T = max(2, round((r n √ρ)^{2/3}))``: Corollary 3.4 with ``Γ = r²`` and ``L1 = 1``."""
    return max(2, int(round((radius * num_records * math.sqrt(rho)) ** (2.0 / 3.0))))


def fw_noise_scale(
    radius: float, num_records: int, rho: float, iterations: int, noise_multiplier: float
) -> float:
    """``b = c · L1 ‖C‖_1 √T / (n √ρ)`` with ``L1 = 1``, ``‖C‖_1 = r`` (Alg. 1)."""
    return noise_multiplier * radius * math.sqrt(iterations) / (num_records * math.sqrt(rho))


def fw_zcdp_cost(rho: float, noise_multiplier: float) -> float:
    """zCDP guarantee of Alg. 1 run with ``b`` calibrated for ρ and constant ``c``: ``8ρ/c²``.

    Each of the ``T − 1`` selections is ``ε_0 = 2Δ/b = 4√ρ/(c√T)``-DP (report-noisy-min of
    non-monotone scores with replace-one sensitivity ``Δ = 2r/n``), i.e. ``8ρ/(c²T)``-zCDP, and
    ``T − 1`` of them compose to less than ``8ρ/c²``.
    """
    return 8.0 * rho / (noise_multiplier * noise_multiplier)


# ------------------------------------------------------------------------------------------------
# the core (jitted)
# ------------------------------------------------------------------------------------------------
def logistic_loss(
    w: Array, features: Array, labels: Array, weights: Array, num_records: Any
) -> Array:
    """``(1/n) Σ_m ω_m log(1 + exp(−y_m ⟨w, x_m⟩))`` (``ω``: row multiplicities or a 0/1 mask)."""
    margins = labels * (features @ w)
    return jnp.sum(weights * jax.nn.softplus(-margins)) / num_records


def _trace_capacity(iterations: int, batch: int) -> int:
    """Static length of the trace buffers: the next power of two ≥ ``T``, raised to 2048 when the
    batch's buffers stay under 64 MB (``T`` itself is traced, so runs whose ``T`` share a bucket
    share a compilation)."""
    cap = 1 << (int(iterations) - 1).bit_length()
    return max(cap, 2048) if batch * 2048 * 12 <= 64 * 2**20 else max(cap, 16)


def _fw_single(
    features: Array,
    labels: Array,
    weights: Array,
    inv_n: Array,
    radius: Array,
    scale: Array,
    key: Array,
    iterations: Array,
    capacity: int,
    with_trace: bool = True,
) -> tuple[Array, Array, Array, Array]:
    """One run of Alg. 1; ``features`` ``(m, d)``, ``labels``/``weights`` ``(m,)``.

    ``iterations`` (``T``) is a traced integer; the loss trace and the selections are written into
    buffers of static length ``capacity ≥ T`` (the trace stays NaN unless ``with_trace``). Step
    ``t`` draws its noise with the key ``fold_in(key, t)``; a zero ``scale`` draws nothing.
    """
    d = features.shape[1]
    dtype = features.dtype

    def loss_and_grad(w: Array, trace: bool = True) -> tuple[Array, Array]:
        margins = labels * (features @ w)
        loss = (
            jnp.sum(weights * jax.nn.softplus(-margins)) * inv_n
            if trace
            else jnp.asarray(jnp.nan, dtype)
        )
        # ∇L = −(1/n) Xᵀ(ω · y · σ(−y·Xw))
        grad = -(features.T @ (weights * labels * jax.nn.sigmoid(-margins))) * inv_n
        return loss, grad

    def noise(t: Array) -> Array:
        return scale * jax.random.laplace(jax.random.fold_in(key, t), (2 * d,), dtype=dtype)

    def step(t: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        w, losses, picks = carry
        loss, g = loss_and_grad(w, with_trace)
        scores = jnp.concatenate([radius * g, -radius * g])
        scores = jax.lax.cond(scale > 0, lambda: scores + noise(t), lambda: scores)
        idx = jnp.argmin(scores)
        sign = jnp.where(idx < d, 1.0, -1.0).astype(dtype)
        vertex = sign * radius * jax.nn.one_hot(idx % d, d, dtype=dtype)
        mu = 2.0 / (t + 2.0)
        w = (1.0 - mu) * w + mu * vertex
        return w, losses.at[t - 1].set(loss), picks.at[t - 1].set(idx.astype(jnp.int32))

    init = (
        jnp.zeros(d, dtype),
        jnp.full(capacity, jnp.nan, dtype),
        jnp.full(capacity, -1, jnp.int32),
    )
    w_final, losses, picks = jax.lax.fori_loop(1, iterations, step, init)
    loss_t, g_t = loss_and_grad(w_final)
    gap = jnp.dot(w_final, g_t) + radius * jnp.max(jnp.abs(g_t))
    return w_final, losses.at[iterations - 1].set(loss_t), gap, picks


@functools.partial(jax.jit, static_argnames=("capacity", "shared_features", "with_trace"))
def _fw_batch(
    features: Array,
    labels: Array,
    weights: Array,
    inv_n: Array,
    radius: Array,
    scale: Array,
    keys: Array,
    iterations: Array,
    capacity: int,
    shared_features: bool,
    with_trace: bool,
) -> tuple[Array, Array, Array, Array]:
    """Alg. 1 on a batch of problems (``labels``, ``weights``, ``keys`` batched on axis 0;
    ``features`` too unless ``shared_features``)."""
    run = functools.partial(_fw_single, capacity=capacity, with_trace=with_trace)
    in_axes = (None if shared_features else 0, 0, 0, None, None, None, 0, None)
    return jax.vmap(run, in_axes=in_axes)(
        features, labels, weights, inv_n, radius, scale, keys, iterations
    )


def run_frank_wolfe_batch(
    features: Array,
    labels: Array,
    weights: Array,
    *,
    radius: float,
    num_records: int,
    noise_scale: float,
    iterations: int,
    keys: Array,
    shared_features: bool = False,
    with_trace: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run Alg. 1 on many problems at once with a given noise scale (no accounting).

    The learners of seed 001 call this after they have validated inputs, calibrated ``b`` and
    debited their ledger. Returns numpy ``(weights (B, d), loss traces (B, T), gaps (B,),
    selections (B, T − 1))``; without ``with_trace`` the traces are NaN (and the run is about
    twice as fast).
    """
    dtype = jnp.result_type(float)
    T = int(iterations)
    out = _fw_batch(
        jnp.asarray(features, dtype),
        jnp.asarray(labels, dtype),
        jnp.asarray(weights, dtype),
        jnp.asarray(1.0 / num_records, dtype),
        jnp.asarray(radius, dtype),
        jnp.asarray(noise_scale, dtype),
        keys,
        jnp.asarray(T, jnp.int32),
        _trace_capacity(T, int(np.shape(labels)[0])),
        shared_features,
        with_trace,
    )
    w, losses, gaps, picks = (np.asarray(o) for o in out)
    return w, losses[:, :T], gaps, picks[:, : T - 1]


# ------------------------------------------------------------------------------------------------
# the public entry point
# ------------------------------------------------------------------------------------------------
def _check_features_labels(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=float)
    y = np.asarray(labels, dtype=float)
    if x.ndim != 2:
        raise ValueError(f"features must be a 2-d array (n, d), got shape {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},), got {y.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"features must be non-empty, got shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.max(np.abs(x)) > 1.0 + 1e-12:
        raise ValueError(
            "Alg. 1 needs ‖x‖_∞ ≤ 1 for every record (its sensitivity and Lipschitz constant "
            "L1 = 1 rely on it); rescale the features"
        )
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise ValueError("labels must be −1 or +1")
    return x, y


def check_radius(radius: Any) -> float:
    """``r`` as a positive finite float, or a ``ValueError``."""
    r = float(radius)
    if not math.isfinite(r) or r <= 0:
        raise ValueError(f"radius of the ℓ1 ball must be positive and finite, got {radius!r}")
    return r


def check_iterations(iterations: Any) -> int:
    """``T`` as an int ≥ 2, or an error."""
    if isinstance(iterations, bool) or not isinstance(iterations, int | np.integer):
        raise TypeError(f"iterations must be an integer ≥ 2, got {iterations!r}")
    if iterations < 2:
        raise ValueError(
            f"iterations (T) must be at least 2 (one Frank–Wolfe step), got {iterations}"
        )
    return int(iterations)


def private_frank_wolfe(
    features: Any,
    labels: Any,
    privacy: float | ZCDP | ApproxDP | None,
    *,
    radius: float,
    rng_key: jax.Array | None = None,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    sample_weights: Any = None,
    num_records: int | None = None,
    ledger: PrivacyLedger | None = None,
    label: str = "private Frank-Wolfe (seed 001, Alg. 1)",
) -> FrankWolfeResult:
    """Private Frank–Wolfe for ℓ1-constrained logistic regression (seed 001, Alg. 1).

    Parameters
    ----------
    features : array ``(n, d)``
        Feature vectors with ``‖x‖_∞ ≤ 1``.
    labels : array ``(n,)``
        Labels in ``{−1, +1}``.
    privacy : float, ZCDP, ApproxDP or None
        The zCDP budget ρ of this regression (an ``ApproxDP(ε, δ)`` target is converted to ρ by
        Lemma 2.13); ``None`` runs the non-private Frank–Wolfe (``b = 0``).
    radius : float
        ``r`` of the constraint ``‖w‖_1 ≤ r``.
    rng_key : jax.Array
        PRNG key of the Laplace draws (required unless ``privacy`` is ``None``); see the module
        notes on simulation noise.
    iterations : int, optional
        ``T`` (``T − 1`` noisy steps). Default: ``max(2, round((r n √ρ)^{2/3}))`` (Cor. 3.4), or
        :data:`DEFAULT_NONPRIVATE_ITERATIONS` when non-private. The noise always uses the ``T``
        actually run.
    noise_multiplier : {"rigorous", "paper"} or float
        ``c`` in ``b = c r √T/(n √ρ)``; see the module notes (spec zhang2020 §3, §10.1).
    sample_weights : array ``(n,)``, optional
        Non-negative row multiplicities (or a 0/1 mask selecting a subset of the rows, as in
        Alg. 3). The loss is ``(1/n) Σ_m ω_m ℓ_m`` with the public ``n`` below.
    num_records : int, optional
        The public record count ``n`` (normalisation, ``T`` and ``b``). Default: the number of
        rows, or ``Σ ω`` when ``sample_weights`` are given.
    ledger : PrivacyLedger, optional
        Debited ``ZCDP(8ρ/c²)`` (the run's guarantee) before any noise is drawn; a run that
        would overspend raises :class:`~numpyro_dpgm.privacy.BudgetExceededError` and computes
        nothing.
    label : str
        The ledger entry's label.

    Returns
    -------
    FrankWolfeResult

    Raises
    ------
    ValueError
        for features outside ``[−1, 1]``, labels outside ``{−1, +1}``, a non-positive radius,
        ``T < 2``, ρ ≤ 0, ε ≤ 0, δ ∉ (0, 1), or a missing key.
    """
    start = time.perf_counter()
    warn_if_float32("private_frank_wolfe")
    x, y = _check_features_labels(features, labels)
    r = check_radius(radius)
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    if sample_weights is None:
        omega = np.ones(x.shape[0])
    else:
        omega = np.asarray(sample_weights, dtype=float)
        if omega.shape != y.shape or not np.all(np.isfinite(omega)) or np.any(omega < 0):
            raise ValueError("sample_weights must be finite, non-negative and one per row")
    if num_records is None:
        n = x.shape[0] if sample_weights is None else int(round(float(omega.sum())))
    else:
        n = int(num_records)
    if n < 1:
        raise ValueError(f"num_records must be a positive integer, got {num_records!r}")
    if iterations is None:
        T = DEFAULT_NONPRIVATE_ITERATIONS if rho is None else default_iterations(r, n, rho)
    else:
        T = check_iterations(iterations)
    if rho is None:
        if ledger is not None:
            raise ValueError("a non-private run (privacy=None) must not be given a ledger")
        b, spent = 0.0, 0.0
        key = jax.random.key(0) if rng_key is None else rng_key
    else:
        if rng_key is None:
            raise ValueError("a private run needs a PRNG key for its noise (rng_key=...)")
        key = rng_key
        b = fw_noise_scale(r, n, rho, T, c)
        spent = fw_zcdp_cost(rho, c)
        if ledger is not None:
            ledger.debit(
                ZCDP(spent),
                label,
                {
                    "mechanism": "Laplace report-noisy-min Frank-Wolfe (seed 001, Alg. 1)",
                    "target": target,
                    "rho_calibrated": rho,
                    "noise_multiplier": c,
                    "noise_scale": b,
                    "iterations": T,
                    "radius": r,
                    "num_records": n,
                    "neighbours": "replace_one",
                    "sampler": "jax (simulation)",
                },
            )
    w, losses, gaps, picks = run_frank_wolfe_batch(
        x,
        y[None],
        omega[None],
        radius=r,
        num_records=n,
        noise_scale=b,
        iterations=T,
        keys=key[None] if jnp.ndim(key) == 0 else jnp.asarray(key)[None],
        shared_features=True,
    )
    return FrankWolfeResult(
        weights=w[0],
        loss_trace=losses[0],
        gap=float(gaps[0]),
        selections=picks[0],
        iterations=T,
        noise_scale=b,
        noise_multiplier=c,
        rho=rho,
        rho_spent=spent,
        radius=r,
        num_records=n,
        elapsed=time.perf_counter() - start,
    )
