"""Private learning of pairwise (k-ary) models under ρ-zCDP (seed 001, Alg. 3; Lemma 3.10,
Eq. (1), Thm 3.11).

``P(z) ∝ exp(Σ_{i<j} W_ij(z_i, z_j) + Σ_i θ_i(z_i))`` on ``[k]^p`` with centred ``W_ij``: one
private logistic regression per node and pair of its values.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax
import numpy as np

from ..._precision import warn_if_float32
from ...domain import Domain
from ...infer.result import Result
from ...privacy.guarantees import ZCDP, ApproxDP
from ...privacy.ledger import PrivacyLedger
from ..frank_wolfe import (
    NoiseMultiplier,
    check_iterations,
    default_iterations,
    fw_noise_scale,
    fw_zcdp_cost,
    resolve_noise_multiplier,
    resolve_privacy,
    run_frank_wolfe_batch,
)
from ._charges import Charge, debit_all
from ._inputs import check_width, codes_from_data, need_key
from ._regressions import compress_rows
from .conversions import pairwise_to_mrf

__all__ = ["BudgetSplit", "learn_pairwise"]


BudgetSplit = Literal["paper", "parallel"]


def _pairwise_budget(rho: float, k_i: int, p: int, split: BudgetSplit) -> tuple[float, int]:
    """Per-regression ρ' and the number of regressions of node ``i`` a record can affect.

    ``"paper"``: ``ρ' = ρ/(k² p)`` (plain composition; valid even over ordered pairs);
    ``"parallel"``: ``ρ' = ρ/((2k − 3) p)``: a replaced record changes only the ``≤ 2k − 3``
    pair regressions that meet its old or new value of ``z_i`` [spec §5].
    """
    pairs = k_i * (k_i - 1) // 2
    if split == "paper":
        return rho / (k_i * k_i * p), pairs
    if split == "parallel":
        return rho / ((2 * k_i - 3) * p), 2 * k_i - 3
    raise ValueError(f"budget_split must be 'paper' or 'parallel', got {split!r}")


def onehot_features(codes: np.ndarray, i: int, K: int) -> np.ndarray:
    """``onehot([z_{−i}, 1])`` of Alg. 3, flattened ``(m, p·K)``: row ``r`` is ``e_{z_{j_r}}``
    for the ``r``-th other variable (increasing ``j``), the last row is ``e_0`` (bias)."""
    m, p = codes.shape
    feats = np.zeros((m, p, K))
    others = np.delete(codes, i, axis=1)
    feats[np.arange(m)[:, None], np.arange(p - 1)[None, :], others] = 1.0
    feats[:, p - 1, 0] = 1.0
    return feats.reshape(m, p * K)


def pairwise_node_estimate(
    w: np.ndarray, pairs: Sequence[tuple[int, int]], k_i: int, k_others: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray]:
    """Centre every ``w^{u,v}`` (Eq. (1)) and average over ``v`` (Alg. 3).

    Returns ``Ŵ_i`` of shape ``(k_i, p − 1, K)`` (``Ŵ_ij(u, b)`` at ``[u, j̃, b]``) and
    ``θ̂_i`` of shape ``(k_i,)`` (centred).
    """
    p = k_others.shape[0] + 1
    w = w.reshape(len(pairs), p, K)
    valid = np.arange(K)[None, :] < k_others[:, None]  # (p − 1, K)
    rows = w[:, : p - 1, :] * valid
    row_mean = rows.sum(axis=-1) / k_others  # (P, p − 1)
    U_rows = (rows - row_mean[..., None]) * valid
    U_bias = w[:, p - 1, 0] + row_mean.sum(axis=-1)  # keeps ⟨U, X⟩ = ⟨w, X⟩
    full = np.zeros((k_i, k_i, p - 1, K))
    bias = np.zeros((k_i, k_i))
    for q, (u, v) in enumerate(pairs):
        full[u, v], full[v, u] = U_rows[q], -U_rows[q]
        bias[u, v], bias[v, u] = U_bias[q], -U_bias[q]
    return full.mean(axis=1), bias.mean(axis=1)


def _pairwise_regressions(
    codes: np.ndarray,
    ks: Sequence[int],
    *,
    radius: float,
    num_records: int,
    scales: Sequence[float],
    iterations: Sequence[int],
    key: Any,
    compress: bool = True,
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """All regressions of Alg. 3. Returns ``Ŵ`` ``(p, p, K, K)``, ``θ̂`` ``(p, K)``, and per node
    the loss traces ``(pairs, T_i)`` and gaps."""
    p = codes.shape[1]
    K = max(ks)
    ks_arr = np.asarray(ks)
    rows, counts = compress_rows(codes) if compress else (codes, np.ones(codes.shape[0]))
    W = np.zeros((p, p, K, K))
    theta = np.zeros((p, K))
    traces, gaps_all = [], []
    node_keys = jax.random.split(key, p)
    for i in range(p):
        k_i = ks[i]
        pairs = list(itertools.combinations(range(k_i), 2))
        feats = onehot_features(rows, i, K)
        zi = rows[:, i]
        labels = np.stack([np.where(zi == u, 1.0, -1.0) for u, _ in pairs])
        masks = np.stack([((zi == u) | (zi == v)) * counts for u, v in pairs])
        w, losses, gaps, _ = run_frank_wolfe_batch(
            feats,
            labels,
            masks,
            radius=radius,
            num_records=num_records,
            noise_scale=scales[i],
            iterations=iterations[i],
            keys=jax.random.split(node_keys[i], len(pairs)),
            shared_features=True,
        )
        W_i, theta_i = pairwise_node_estimate(w, pairs, k_i, np.delete(ks_arr, i), K)
        others = [j for j in range(p) if j != i]
        for jt, j in enumerate(others):
            W[i, j, :k_i, :] = W_i[:, jt, :]
        theta[i, :k_i] = theta_i
        traces.append(losses)
        gaps_all.append(gaps)
    return W, theta, traces, gaps_all


def learn_pairwise(
    data: Any,
    domain: Domain | int | None = None,
    *,
    budget: float | ZCDP | ApproxDP | None,
    rng_key: jax.Array | None = None,
    ledger: PrivacyLedger | None = None,
    width: float,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    budget_split: BudgetSplit = "paper",
    edge_threshold: float = 0.0,
) -> Result:
    """Learn a pairwise (k-ary) model's parameters under ρ-zCDP (seed 001, Alg. 3, Thm 3.11).

    For every node ``i`` and unordered pair ``u < v`` of its values, restrict to the records with
    ``z_i ∈ {u, v}`` (a 0/1 mask; the loss is still normalised by the public ``n``, so that ``T``
    and ``b`` do not depend on the private subset size [spec §5]), set ``y = ±1`` for
    ``z_i = u / v`` and ``X = onehot([z_{−i}, 1]) ∈ {0,1}^{p×K}``, and run Alg. 1 over the ℓ1
    ball of radius ``2λK`` (``K = max_j k_j``; Lemma 3.10 gives
    ``w*(j̃, ·) = W_ij(u, ·) − W_ij(v, ·)``). Centre every output by Eq. (1), set
    ``U^{v,u} = −U^{u,v}``, ``U^{u,u} = 0``, and average: ``Ŵ_ij(u, b) = (1/k_i) Σ_v U^{u,v}(j̃, b)``
    (exact for column-centred ``W``).

    Parameters
    ----------
    data : array ``(n, p)`` of codes, or Dataset
    budget : float, ZCDP, ApproxDP or None
        As in :func:`learn_ising`.
    width : float
        ``λ ≥ max_{i,a} Σ_{j≠i} max_b |W_ij(a, b)| + |θ_i(a)|`` (public).
    domain : Domain or int
        The alphabet (required for arrays; an int ``k`` means ``k`` values for every attribute).
    rng_key, iterations, noise_multiplier, edge_threshold
        As in :func:`learn_ising`; the default ``T`` of node ``i`` is
        ``round((2λK n √ρ'_i)^{2/3})`` with the public ``n``.
    budget_split : {"paper", "parallel"}
        ``ρ'_i = ρ/(k_i² p)`` (seed 001) or ``ρ/((2k_i − 3) p)`` (parallel composition over the
        pairs a replaced record can affect; equal to Alg. 2's ``ρ/p`` for ``k = 2``) [spec §5].
    ledger : PrivacyLedger, optional
        Charged one entry per node: its ``C(k_i, 2)`` regressions of ``8ρ'_i/c²`` composed
        (``"paper"``; at most ρ/p) or ``(2k_i − 3)·8ρ'_i/c²`` (``"parallel"``). Refused before
        any computation if the total does not fit.

    Returns
    -------
    Result
        ``model``: :func:`pairwise_to_mrf` of ``((Ŵ_ij + Ŵ_jiᵀ)/2, θ̂)``; ``extras["W"]`` the raw
        ``(p, p, K, K)`` per-node estimates (``Ŵ_ij(u, b)`` at ``[i, j, u, b]``, row block ``i``
        from node ``i``), ``"theta"`` ``(p, K)`` (centred fields), ``"T"`` (per node),
        ``"rho_per_regression"``, ``"noise_scale"``, ``"rho_spent"``, and non-private
        diagnostics ``"loss_traces"``, ``"gaps"``. ``loss_trace`` is the mean loss over all
        regressions (padded with the last value where ``T_i`` differ).
    """
    privacy, key = budget, rng_key
    start = time.perf_counter()
    warn_if_float32("learn_pairwise")
    codes, domain = codes_from_data(data, domain)
    n, p = codes.shape
    ks = list(domain.shape)
    K = max(ks)
    lam = check_width(width)
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = need_key(key, rho)
    if budget_split not in ("paper", "parallel"):
        raise ValueError(f"budget_split must be 'paper' or 'parallel', got {budget_split!r}")
    radius = 2.0 * lam * K
    rhos, Ts, scales, charges = [], [], [], []
    for i in range(p):
        if rho is None:
            rho_i, T = None, 1000 if iterations is None else check_iterations(iterations)
            b = 0.0
        else:
            rho_i, affected = _pairwise_budget(rho, ks[i], p, budget_split)
            T = (
                default_iterations(radius, n, rho_i)
                if iterations is None
                else check_iterations(iterations)
            )
            b = fw_noise_scale(radius, n, rho_i, T, c)
            charges.append(
                Charge(
                    affected * fw_zcdp_cost(rho_i, c),
                    f"learn_pairwise: node {domain.attrs[i]}",
                    {
                        "mechanism": "private Frank-Wolfe logistic regressions "
                        "(seed 001, Alg. 1 in Alg. 3)",
                        "target": target,
                        "regressions": ks[i] * (ks[i] - 1) // 2,
                        "composition": budget_split,
                        "rho_per_regression": rho_i,
                        "noise_multiplier": c,
                        "noise_scale": b,
                        "iterations": T,
                        "radius": radius,
                        "num_records": n,
                        "neighbours": "replace_one",
                        "sampler": "jax (simulation)",
                    },
                )
            )
        rhos.append(rho_i)
        Ts.append(T)
        scales.append(b)
    if rho is None and ledger is not None:
        raise ValueError("a non-private run (budget=None) must not be given a ledger")
    debit_all(ledger, charges)
    W, theta, traces, gaps = _pairwise_regressions(
        codes, ks, radius=radius, num_records=n, scales=scales, iterations=Ts, key=key
    )
    W_model = np.zeros_like(W)
    for i, j in itertools.combinations(range(p), 2):
        W_model[i, j] = 0.5 * (W[i, j] + W[j, i].T)
    model = pairwise_to_mrf(W_model, theta, domain, edge_threshold=edge_threshold)
    T_max = max(Ts)
    padded = np.concatenate(
        [np.pad(t, ((0, 0), (0, T_max - t.shape[1])), mode="edge") for t in traces]
    )
    return Result(
        model=model,
        loss_trace=padded.mean(axis=0),
        iterations=T_max - 1,
        converged=True,
        elapsed=time.perf_counter() - start,
        extras={
            "W": W,
            "theta": theta,
            "T": Ts,
            "radius": radius,
            "noise_scale": scales,
            "noise_multiplier": c,
            "budget_split": budget_split,
            "rho": rho,
            "rho_per_regression": rhos,
            "rho_spent": math.fsum(ch.rho for ch in charges),
            "loss_traces": traces,
            "gaps": gaps,
        },
    )
