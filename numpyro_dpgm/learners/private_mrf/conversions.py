"""Learned MRF parameters as :class:`~numpyro_dpgm.distributions.mrf.MarkovRandomField` s.

The library's overcomplete layout has one single-attribute clique per node (``θ``) and one clique
per edge or monomial: the Ising pair table is ``A_ij s_a s_b`` and the field table ``θ_i s_a``
(:func:`ising_to_mrf`); the pairwise tables are ``W_ij(a, b)`` and ``θ_i(a)``
(:func:`pairwise_to_mrf`); a t-wise monomial ``I`` has the table ``h̄(I) Π_{j∈I} s_{a_j}``
(:func:`twise_to_mrf`). Code ``a`` is the spin ``s_a = 1 − 2a``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...distributions.mrf import MarkovRandomField
from ...domain import Domain
from ...network import MarkovNetwork
from ._inputs import check_domain, default_domain

__all__ = ["Monomial", "ising_to_mrf", "pairwise_to_mrf", "twise_to_mrf"]

Monomial = tuple[int, ...]

_SPIN = np.array([1.0, -1.0])  # s_a for code a


def ising_to_mrf(
    coupling: Any,
    field: Any = None,
    domain: Domain | None = None,
    *,
    edge_threshold: float = 0.0,
) -> MarkovRandomField:
    """The Ising model ``P(z) ∝ exp(Σ_{i<j} A_ij z_i z_j + Σ_i θ_i z_i)`` as a MarkovRandomField.

    Parameters
    ----------
    coupling : array ``(p, p)``
        ``A``; symmetric with zero diagonal (Def. 2.1; each edge counted once).
    field : array ``(p,)``, optional
        ``θ`` (default 0).
    domain : Domain, optional
        ``p`` binary attributes (default ``x0, …``); code ``a`` is the spin ``1 − 2a``.
    edge_threshold : float
        Pairs with ``|A_ij| ≤ edge_threshold`` get no clique.

    Returns
    -------
    MarkovRandomField
        Cliques ``(x_i,)`` for all ``i``, then ``(x_i, x_j)``, ``i < j``, for every edge; tables
        ``θ_i s_a`` and ``A_ij s_a s_b``.
    """
    A = np.asarray(coupling, dtype=float)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
        raise ValueError(f"coupling must be a square (p, p) matrix, got shape {A.shape}")
    p = A.shape[0]
    if not np.allclose(A, A.T, atol=1e-12) or np.any(np.diag(A) != 0):
        raise ValueError("coupling must be symmetric with a zero diagonal (Def. 2.1)")
    theta = np.zeros(p) if field is None else np.asarray(field, dtype=float)
    if theta.shape != (p,):
        raise ValueError(f"field must have shape ({p},), got {theta.shape}")
    domain = default_domain(p, 2) if domain is None else check_domain(domain, p, binary=True)
    names = domain.attrs
    tables: dict[tuple[str, ...], np.ndarray] = {(names[i],): theta[i] * _SPIN for i in range(p)}
    for i, j in itertools.combinations(range(p), 2):
        if abs(A[i, j]) > edge_threshold:
            tables[(names[i], names[j])] = A[i, j] * np.outer(_SPIN, _SPIN)
    net = MarkovNetwork(domain, list(tables))
    return MarkovRandomField(net, net.flatten(tables))


def pairwise_to_mrf(
    weights: Any,
    field: Any,
    domain: Domain,
    *,
    edge_threshold: float = 0.0,
) -> MarkovRandomField:
    """The pairwise model ``P(z) ∝ exp(Σ_{i<j} W_ij(z_i, z_j) + Σ_i θ_i(z_i))`` (Def. 2.2).

    Parameters
    ----------
    weights : array ``(p, p, K, K)``
        ``W[i, j, a, b] = W_ij(a, b)`` for ``a < k_i``, ``b < k_j`` (``K = max k``; the rest is
        padding). Only ``i < j`` is read.
    field : array ``(p, K)``
        ``θ_i(a)``.
    domain : Domain
        ``p`` attributes with ``k_i ≥ 2`` values.
    edge_threshold : float
        Pairs with ``max_{a,b} |W_ij(a, b)| ≤ edge_threshold`` get no clique.
    """
    W = np.asarray(weights, dtype=float)
    p = len(domain)
    K = max(domain.shape)
    if W.shape != (p, p, K, K):
        raise ValueError(f"weights must have shape {(p, p, K, K)}, got {W.shape}")
    theta = np.asarray(field, dtype=float)
    if theta.shape != (p, K):
        raise ValueError(f"field must have shape {(p, K)}, got {theta.shape}")
    names, ks = domain.attrs, domain.shape
    tables: dict[tuple[str, ...], np.ndarray] = {
        (names[i],): theta[i, : ks[i]] for i in range(p)
    }
    for i, j in itertools.combinations(range(p), 2):
        block = W[i, j, : ks[i], : ks[j]]
        if np.max(np.abs(block)) > edge_threshold:
            tables[(names[i], names[j])] = block
    net = MarkovNetwork(domain, list(tables))
    return MarkovRandomField(net, net.flatten(tables))


def twise_to_mrf(coefficients: Mapping[Monomial, float], domain: Domain) -> MarkovRandomField:
    """The binary t-wise MRF ``P(z) ∝ exp(Σ_I h̄(I) z_I)`` (Def. 2.4) as a MarkovRandomField.

    Parameters
    ----------
    coefficients : mapping ``I -> h̄(I)``
        ``I`` a non-empty tuple of distinct node indices (the constant term is irrelevant).
    domain : Domain
        ``p`` binary attributes; code ``a`` is the spin ``1 − 2a``.

    Returns
    -------
    MarkovRandomField
        One clique per monomial (sorted indices); its table is ``h̄(I) Π_{j∈I} s_{a_j}``.
        Every node also gets a single-attribute clique (zero table if ``{i}`` is absent).
    """
    p = len(domain)
    domain = check_domain(domain, p, binary=True)
    names = domain.attrs
    tables: dict[tuple[str, ...], np.ndarray] = {(names[i],): np.zeros(2) for i in range(p)}
    for I, value in coefficients.items():
        I = tuple(sorted(int(i) for i in I))
        if not I or len(set(I)) != len(I) or I[0] < 0 or I[-1] >= p:
            raise ValueError(f"monomial {I} is not a non-empty set of node indices < {p}")
        table = np.asarray(1.0)
        for _ in I:
            table = np.multiply.outer(table, _SPIN)
        clique = tuple(names[i] for i in I)
        tables[clique] = tables.get(clique, 0.0) + float(value) * table
    net = MarkovNetwork(domain, list(tables))
    return MarkovRandomField(net, net.flatten(tables))
