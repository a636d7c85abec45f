"""Known models and exact samplers for the seed-001 tests (spec zhang2020 §9).

Everything here enumerates the whole state space in plain numpy (never the library's inference
or conversions), so it is an independent reference: spins ``{±1}^p`` for Ising / t-wise models
(p ≤ 12) and codes ``[k]^p`` for pairwise models (k^p ≤ 10^4).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

Monomial = tuple[int, ...]


def all_spins(p: int) -> np.ndarray:
    """All ``2^p`` spin vectors, shape ``(2^p, p)``."""
    codes = (np.arange(2**p)[:, None] >> np.arange(p)[None, ::-1]) & 1
    return (1 - 2 * codes).astype(np.int64)


def ising_energy(states: np.ndarray, A: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``½ zᵀAz + θᵀz`` (Def. 2.1, each edge once)."""
    z = states.astype(float)
    return 0.5 * np.einsum("si,ij,sj->s", z, A, z) + z @ theta


def _sample(states: np.ndarray, energy: np.ndarray, n: int, seed: int) -> np.ndarray:
    prob = np.exp(energy - energy.max())
    prob /= prob.sum()
    rng = np.random.default_rng(seed)
    return states[rng.choice(len(states), size=n, p=prob)]


def sample_ising(A: np.ndarray, theta: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` exact i.i.d. spin records of ``D(A, θ)``."""
    states = all_spins(A.shape[0])
    return _sample(states, ising_energy(states, A, theta), n, seed)


def cycle_ising(p: int = 8, weight: float = 0.5, seed: int = 0) -> np.ndarray:
    """Spec §9 B: a p-cycle with ``|A_ij| = weight`` and random signs (width ``2·weight``)."""
    rng = np.random.default_rng(seed)
    A = np.zeros((p, p))
    for i in range(p):
        j = (i + 1) % p
        A[i, j] = A[j, i] = weight * rng.choice([-1.0, 1.0])
    return A


def ising_edges(A: np.ndarray) -> frozenset:
    p = A.shape[0]
    return frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if A[i, j] != 0)


def ising_error(A_hat: np.ndarray, A: np.ndarray) -> float:
    """``max_{i≠j} |Â_ij − A_ij|`` (Def. 2.10)."""
    off = ~np.eye(A.shape[0], dtype=bool)
    return float(np.max(np.abs(A_hat - A)[off]))


def double_centre(M: np.ndarray) -> np.ndarray:
    return M - M.mean(0, keepdims=True) - M.mean(1, keepdims=True) + M.mean()


def cycle_pairwise(p: int = 5, k: int = 3, scale: float = 0.6, seed: int = 0) -> np.ndarray:
    """Spec §9 C: a p-cycle of random double-centred ``k×k`` matrices scaled to max 0.6.

    Returns the dense ``(p, p, k, k)`` array with ``W[j, i] = W[i, j]ᵀ``.
    """
    rng = np.random.default_rng(seed)
    W = np.zeros((p, p, k, k))
    for i in range(p):
        j = (i + 1) % p
        M = double_centre(rng.normal(size=(k, k)))
        M *= scale / np.abs(M).max()
        W[i, j], W[j, i] = M, M.T
    return W


def pairwise_width(W: np.ndarray, theta: np.ndarray) -> float:
    """``max_{i,a} Σ_{j≠i} max_b |W_ij(a, b)| + |θ_i(a)|`` (Def. 2.2)."""
    return float(np.max(np.abs(W).max(axis=3).sum(axis=1) + np.abs(theta)))


def sample_pairwise(W: np.ndarray, theta: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` exact i.i.d. code records of ``D(W, Θ)`` (common alphabet ``k``)."""
    p, k = theta.shape
    states = np.array(list(itertools.product(range(k), repeat=p)))
    energy = sum(theta[i][states[:, i]] for i in range(p))
    for i, j in itertools.combinations(range(p), 2):
        energy = energy + W[i, j][states[:, i], states[:, j]]
    return _sample(states, energy, n, seed)


def pairwise_error(W_hat: np.ndarray, W: np.ndarray) -> float:
    """``max_{i≠j,u,b} |Ŵ_ij(u, b) − W_ij(u, b)|``."""
    p = W.shape[0]
    return max(
        float(np.max(np.abs(W_hat[i, j] - W[i, j]))) for i in range(p) for j in range(p) if i != j
    )


def twise_energy(states: np.ndarray, h: Mapping[Monomial, float]) -> np.ndarray:
    z = states.astype(float)
    out = np.zeros(len(z))
    for I, v in h.items():
        out += v * np.prod(z[:, list(I)], axis=1)
    return out


def sample_twise(h: Mapping[Monomial, float], p: int, n: int, seed: int) -> np.ndarray:
    states = all_spins(p)
    return _sample(states, twise_energy(states, h), n, seed)


def parity_means(z: np.ndarray, sets) -> dict:
    return {S: float(np.prod(z[:, list(S)], axis=1).mean()) for S in sets}
