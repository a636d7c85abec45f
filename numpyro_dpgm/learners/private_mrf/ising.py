"""Private learning of Ising models under ρ-zCDP (seed 001, Alg. 2; Lemma 3.7, Thm 3.8).

``P(z) ∝ exp(Σ_{i<j} A_ij z_i z_j + Σ_i θ_i z_i)`` on ``{±1}^p``: one private sparse logistic
regression per node (the private Frank–Wolfe of :mod:`~numpyro_dpgm.learners.frank_wolfe`,
Alg. 1).
"""

from __future__ import annotations

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
)
from ._charges import Charge, debit_all
from ._inputs import check_width, need_key, spins_from_data
from ._regressions import compress_rows, solve_problems
from .conversions import ising_to_mrf

__all__ = ["learn_ising"]


def ising_node_problem(z: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ``i``'s regression data of Alg. 2: ``x = (z_{−i}, 1)`` (increasing ``j``, bias last),
    ``y = z_i``."""
    x = np.empty(z.shape)
    x[:, :-1] = np.delete(z, i, axis=1)
    x[:, -1] = 1.0
    return x, z[:, i].astype(float)


def ising_from_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Â_ij = w_i[j̃]/2`` with ``j̃ = j − 1[j > i]``, ``θ̂_i = w_i[p−1]/2`` (Alg. 2)."""
    p = w.shape[0]
    A = np.zeros((p, p))
    for i in range(p):
        A[i, np.arange(p) != i] = w[i, : p - 1] / 2.0
    return A, w[:, p - 1] / 2.0


def _ising_regressions(
    spins: np.ndarray,
    *,
    radius: float,
    num_records: int,
    noise_scale: float,
    iterations: int,
    key: Any,
    compress: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the p regressions of Alg. 2; returns weights ``(p, p)``, loss traces, gaps."""
    p = spins.shape[1]
    rows, counts = compress_rows(spins) if compress else (spins, np.ones(spins.shape[0]))
    z = rows.astype(float)

    def build(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (*ising_node_problem(z, i), counts)

    return solve_problems(
        build,
        p,
        jax.random.split(key, p),
        radius=radius,
        num_records=num_records,
        noise_scale=noise_scale,
        iterations=iterations,
    )


def learn_ising(
    data: Any,
    domain: Domain | Sequence[str] | None = None,
    *,
    budget: float | ZCDP | ApproxDP | None,
    rng_key: jax.Array | None = None,
    ledger: PrivacyLedger | None = None,
    width: float,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    coding: Literal["spin", "code"] = "spin",
    symmetrize: bool = False,
    edge_threshold: float = 0.0,
) -> Result:
    """Learn an Ising model's parameters under ρ-zCDP (seed 001, Alg. 2, Thm 3.8).

    For every node ``i`` (Lemma 3.7: ``P(z_i = +1 | z_{−i}) = σ(2Σ_j A_ij z_j + 2θ_i)``) run the
    private Frank–Wolfe (Alg. 1) on ``x = (z_{−i}, 1)``, ``y = z_i`` with budget ``ρ/p`` over the
    ℓ1 ball of radius ``2λ`` (``‖w*‖_1 = 2(Σ_j |A_ij| + |θ_i|) ≤ 2λ``), and read
    ``Â_ij = w_{j̃}/2``, ``θ̂_i = w_p/2`` [spec §4]. The ``p`` regressions compose to ρ-zCDP
    (Lemma 2.14).

    Parameters
    ----------
    data : array ``(n, p)`` or Dataset
        Spins ``±1`` (``coding="spin"``) or codes ``0/1`` (``coding="code"``; a Dataset is read
        as codes). Code ``a`` is the spin ``1 − 2a``.
    budget : float, ZCDP, ApproxDP or None
        Total budget: ρ (a float or ``ZCDP``), or ``ApproxDP(ε, δ)``, which is converted to the
        largest ρ implying it (Lemma 2.13; approximate-DP parameter learning, [spec §4]).
        ``None``: non-private (``b = 0``).
    width : float
        A public upper bound ``λ ≥ λ(A, θ) = max_i Σ_j |A_ij| + |θ_i|``.
    rng_key : jax.Array
        PRNG key of the noise (simulation; see the module notes).
    iterations : int, optional
        ``T`` of every regression; default ``max(2, round((2λ n √(ρ/p))^{2/3}))``
        (Cor. 3.4 with the public ``n``), or 1000 when non-private.
    noise_multiplier : {"rigorous", "paper"} or float
        ``c`` of Alg. 1's noise scale; ``"rigorous"`` (2√2) makes the run ρ-zCDP, ``"paper"``
        (1) is seed 001's constant and is charged ``8ρ`` (see :mod:`.frank_wolfe`).
    coding : {"spin", "code"}
    domain : Domain or list of names, optional
        Attribute names of the returned model (default ``x0, …``).
    symmetrize : bool
        Report ``(Â + Âᵀ)/2`` in ``extras["A"]`` (default: the raw per-node estimates).
    edge_threshold : float
        The model gets a pair clique for every ``|(Â_ij + Â_ji)/2| > edge_threshold``.
    ledger : PrivacyLedger, optional
        Charged ``p`` entries of ``ZCDP(8(ρ/p)/c²)`` (``ρ/p`` each with the rigorous constant);
        refused before any computation if the total does not fit.

    Returns
    -------
    Result
        ``model``: :func:`ising_to_mrf` of ``((Â + Âᵀ)/2, θ̂)``; ``loss_trace``: the mean over
        nodes of the regressions' losses ``L_i(w_t)``, ``t = 1..T``; ``iterations``: ``T − 1``
        Frank–Wolfe steps; ``converged``: True (Alg. 1 runs its prescribed ``T``; a
        data-dependent stopping rule would cost privacy). ``extras``: ``"A"`` (``p × p``),
        ``"theta"``, ``"weights"`` (the ``p`` regression outputs), ``"T"``, ``"radius"``,
        ``"noise_scale"``, ``"noise_multiplier"``, ``"rho"`` (target), ``"rho_per_node"``,
        ``"rho_spent"`` (guarantee of the run), and the non-private diagnostics ``"gaps"``,
        ``"loss_traces"``.
    """
    privacy, key = budget, rng_key
    start = time.perf_counter()
    warn_if_float32("learn_ising")
    spins, domain = spins_from_data(data, coding, domain)
    n, p = spins.shape
    lam = check_width(width)
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = need_key(key, rho)
    radius = 2.0 * lam
    rho_node = None if rho is None else rho / p
    if iterations is None:
        T = 1000 if rho_node is None else default_iterations(radius, n, rho_node)
    else:
        T = check_iterations(iterations)
    if rho_node is None:
        if ledger is not None:
            raise ValueError("a non-private run (budget=None) must not be given a ledger")
        b, spent = 0.0, 0.0
    else:
        b = fw_noise_scale(radius, n, rho_node, T, c)
        spent = p * fw_zcdp_cost(rho_node, c)
        details = {
            "mechanism": "private Frank-Wolfe logistic regression (seed 001, Alg. 1 in Alg. 2)",
            "target": target,
            "rho_calibrated": rho_node,
            "noise_multiplier": c,
            "noise_scale": b,
            "iterations": T,
            "radius": radius,
            "num_records": n,
            "neighbours": "replace_one",
            "sampler": "jax (simulation)",
        }
        debit_all(
            ledger,
            [
                Charge(fw_zcdp_cost(rho_node, c), f"learn_ising: node {domain.attrs[i]}", details)
                for i in range(p)
            ],
        )
    w, losses, gaps = _ising_regressions(
        spins, radius=radius, num_records=n, noise_scale=b, iterations=T, key=key
    )
    A_hat, theta_hat = ising_from_weights(w)
    A_sym = 0.5 * (A_hat + A_hat.T)
    model = ising_to_mrf(A_sym, theta_hat, domain, edge_threshold=edge_threshold)
    return Result(
        model=model,
        loss_trace=losses.mean(axis=0),
        iterations=T - 1,
        converged=True,
        elapsed=time.perf_counter() - start,
        extras={
            "A": A_sym if symmetrize else A_hat,
            "theta": theta_hat,
            "weights": w,
            "T": T,
            "radius": radius,
            "noise_scale": b,
            "noise_multiplier": c,
            "rho": rho,
            "rho_per_node": rho_node,
            "rho_spent": spent,
            "gaps": gaps,
            "loss_traces": losses,
        },
    )
