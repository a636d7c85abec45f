"""Private releases of parity means ``Q̂(S) ≈ (1/n) Σ_m z^m_S`` (seed 001, Alg. 5 step 2).

Private multiplicative weights (:func:`pmw_parities`; Hardt & Rothblum 2010; seed 001,
Lemma 4.5), and the Gaussian mechanism on all parity means as a simple alternative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...privacy.guarantees import ZCDP, ApproxDP
from ...privacy.ledger import PrivacyLedger
from ..frank_wolfe import resolve_privacy
from .conversions import Monomial

__all__ = ["PMWResult", "pmw_parities"]

Array = Any


def parity_columns(spins: np.ndarray, sets: Sequence[Monomial]) -> np.ndarray:
    """``z_S`` for every row and every set ``S`` (``z_∅ = 1``), shape ``(m, |sets|)``."""
    z = spins.astype(float)
    out = np.ones((z.shape[0], len(sets)))
    for q, S in enumerate(sets):
        if S:
            out[:, q] = np.prod(z[:, list(S)], axis=1)
    return out


class PMWResult(NamedTuple):
    """What :func:`pmw_parities` returns.

    Attributes
    ----------
    parities : dict
        ``Q̂(S) = 2·answer − 1`` (±1 scale) for every query set ``S``.
    hard_rounds : int
        Number of rounds that measured the data (≤ ``max_hard_rounds``).
    max_hard_rounds : int
        ``K``, fixed before seeing the data.
    epsilon0 : float
        ``ε_0 = √(ρ/(8K))``.
    noise_scale : float
        ``b = 1/(n ε_0)``.
    hard : bool array
        Which queries were hard (non-private diagnostic).
    """

    parities: dict
    hard_rounds: int
    max_hard_rounds: int
    epsilon0: float
    noise_scale: float
    hard: np.ndarray


def _all_spin_states(p: int) -> np.ndarray:
    codes = (np.arange(2**p)[:, None] >> np.arange(p)[None, ::-1]) & 1
    return (1 - 2 * codes).astype(np.int8)


@jax.jit
def _pmw_scan(
    data_answers: Array, state_answers: Array, alpha: Array, scale: Array, cap: Array, key: Array
) -> tuple[Array, Array, Array]:
    num_states = state_answers.shape[1]
    dtype = state_answers.dtype
    k0, kq = jax.random.split(key)
    keys = jax.random.split(kq, data_answers.shape[0])

    def lap(k: Array) -> Array:
        return scale * jax.random.laplace(k, (), dtype=dtype)

    def step(carry: tuple[Array, Array, Array], inp: tuple[Array, Array, Array]):
        log_h, tau, hard_count = carry
        qd, qz, k = inp
        k1, k2, k3 = jax.random.split(k, 3)
        qh = jnp.dot(jax.nn.softmax(log_h), qz)
        e = jnp.abs(qd - qh) + lap(k1)
        hard = (hard_count < cap) & (e >= tau)
        a = qd + lap(k2)
        answer = jnp.where(hard, a, qh)
        sign = jnp.where(a > qh, 1.0, -1.0)
        log_h = jnp.where(hard, log_h + sign * (alpha / 8.0) * qz, log_h)
        log_h = log_h - jax.nn.logsumexp(log_h)
        tau = jnp.where(hard, alpha / 2.0 + lap(k3), tau)
        return (log_h, tau, hard_count + hard.astype(jnp.int32)), (answer, hard)

    init = (
        jnp.full(num_states, -jnp.log(num_states), dtype),
        alpha / 2.0 + lap(k0),
        jnp.asarray(0, jnp.int32),
    )
    (_, _, count), (answers, hard) = jax.lax.scan(
        step, init, (data_answers, state_answers, keys)
    )
    return answers, hard, count


def _check_queries(queries: Sequence[Sequence[int]], p: int) -> list[Monomial]:
    out = []
    for S in queries:
        S = tuple(sorted(int(j) for j in S))
        if not S or len(set(S)) != len(S) or S[0] < 0 or S[-1] >= p:
            raise ValueError(f"parity query {S} must be a non-empty set of column indices < {p}")
        out.append(S)
    if len(set(out)) != len(out):
        raise ValueError("parity queries must be distinct")
    return out


def pmw_parities(
    spins: Any,
    queries: Sequence[Sequence[int]],
    privacy: float | ZCDP,
    *,
    alpha: float = 0.05,
    rng_key: jax.Array,
    max_hard_rounds: int | None = None,
    ledger: PrivacyLedger | None = None,
) -> PMWResult:
    """Private multiplicative weights for parity queries (Hardt & Rothblum 2010; seed 001,
    Lemma 4.5, the zCDP version of Vadhan 2017, Thm 4.3) [spec §6.3].

    The counting queries ``q_S(z) = (1 + z_S)/2`` (sensitivity ``1/n``) are answered in the given
    order against a distribution ``h`` over all ``2^p`` spin vectors, starting uniform. A
    sparse-vector test with threshold ``α/2 + Lap(b)`` and query noise ``Lap(b)`` decides whether
    ``|q_S(D) − q_S(h)|`` is large; if so (a hard round, at most ``K``) the query is measured,
    ``a = q_S(D) + Lap(b)``, answered with ``a``, ``h`` is updated by
    ``h(z) ∝ h(z) exp(±(α/8) q_S(z))`` (sign of ``a − q_S(h)``) and the threshold is redrawn;
    otherwise ``q_S(h)`` is the answer. ``K = min(⌈35 p ln 2 / α²⌉, |Q|)``,
    ``ε_0 = √(ρ/(8K))``, ``b = 1/(n ε_0)``: a hard round costs ``4ε_0``-DP (3ε_0 sparse vector,
    ε_0 measurement), i.e. ``8ε_0²``-zCDP, and at most ``K`` sparse-vector instances run, so the
    release is ρ-zCDP.

    Parameters
    ----------
    spins : array ``(n, p)`` of ±1
    queries : sequence of index sets
        Non-empty, distinct sets ``S`` (``Q̂(∅) = 1`` needs no release).
    privacy : float or ZCDP
        ρ.
    alpha : float
        Accuracy target ``α`` on the 0/1 scale (``α/2`` on the ±1 scale is ``α``).
    rng_key : jax.Array
        PRNG key (simulation noise).
    max_hard_rounds : int, optional
        ``K``; default ``min(⌈35 p ln 2/α²⌉, |Q|)``.
    ledger : PrivacyLedger, optional
        Charged ``ZCDP(ρ)`` before the data are read.

    Returns
    -------
    PMWResult
    """
    z = np.asarray(spins)
    if z.ndim != 2 or not np.all(np.isin(z, (-1, 1))):
        raise ValueError("spins must be a 2-d array of ±1")
    n, p = z.shape
    if p > 20:
        raise ValueError(f"PMW keeps a distribution over 2^p states; p = {p} is too large (≤ 20)")
    qs = _check_queries(queries, p)
    if not qs:
        raise ValueError("no parity queries given")
    rho, _ = resolve_privacy(privacy)
    if rho is None or isinstance(privacy, ApproxDP):
        raise ValueError("pmw_parities needs a zCDP budget ρ (a float or ZCDP)")
    a = float(alpha)
    if not 0 < a < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if max_hard_rounds is None:
        K = min(math.ceil(35.0 * p * math.log(2.0) / (a * a)), len(qs))
    else:
        K = int(max_hard_rounds)
        if K < 1:
            raise ValueError(f"max_hard_rounds must be ≥ 1, got {max_hard_rounds!r}")
    eps0 = math.sqrt(rho / (8.0 * K))
    b = 1.0 / (n * eps0)
    if ledger is not None:
        ledger.debit(
            ZCDP(rho),
            "pmw_parities: parity queries (private multiplicative weights)",
            {
                "mechanism": "private multiplicative weights (Hardt & Rothblum 2010)",
                "queries": len(qs),
                "max_hard_rounds": K,
                "epsilon0": eps0,
                "noise_scale": b,
                "alpha": a,
                "neighbours": "replace_one",
                "sampler": "jax (simulation)",
            },
        )
    data_par = parity_columns(z, qs).mean(axis=0)
    state_par = parity_columns(_all_spin_states(p), qs).T  # (|Q|, 2^p)
    dtype = jnp.result_type(float)
    answers, hard, count = _pmw_scan(
        jnp.asarray((1.0 + data_par) / 2.0, dtype),
        jnp.asarray((1.0 + state_par) / 2.0, dtype),
        jnp.asarray(a, dtype),
        jnp.asarray(b, dtype),
        jnp.asarray(K, jnp.int32),
        rng_key,
    )
    answers = np.asarray(answers)
    return PMWResult(
        parities={S: float(2.0 * v - 1.0) for S, v in zip(qs, answers, strict=True)},
        hard_rounds=int(count),
        max_hard_rounds=K,
        epsilon0=eps0,
        noise_scale=b,
        hard=np.asarray(hard),
    )


def gaussian_parities(
    spins: np.ndarray, queries: Sequence[Monomial], rho: float, key: Any
) -> tuple[dict, float]:
    """Gaussian mechanism on all parity means: ℓ2-sensitivity ``2√|Q|/n`` (replace-one),
    ``σ = 2√|Q|/(n √(2ρ))`` (Bun & Steinke 2016, Prop. 1.6) [spec §6.3, alternative]."""
    n = spins.shape[0]
    sigma = 2.0 * math.sqrt(len(queries)) / (n * math.sqrt(2.0 * rho))
    means = parity_columns(spins, queries).mean(axis=0)
    noise = np.asarray(jax.random.normal(key, (len(queries),), jnp.result_type(float)))
    return {S: float(v) for S, v in zip(queries, means + sigma * noise, strict=True)}, sigma
