"""Privately learning Markov random fields (seed 001: Zhang, Kamath, Kulkarni & Wu 2020).

Parameter learning under ρ-zCDP by per-node private sparse logistic regression, the private
Frank–Wolfe of :mod:`.frank_wolfe` (Alg. 1) inside:

* :func:`learn_ising` — Ising models ``P(z) ∝ exp(Σ_{i<j} A_ij z_i z_j + Σ_i θ_i z_i)`` on
  ``{±1}^p`` (Alg. 2; Lemma 3.7, Thm 3.8);
* :func:`learn_pairwise` — pairwise models ``P(z) ∝ exp(Σ_{i<j} W_ij(z_i, z_j) + Σ_i θ_i(z_i))`` on
  ``[k]^p`` with centred ``W_ij`` (Alg. 3; Lemma 3.10, Eq. (1), Thm 3.11);
* :func:`learn_twise` — binary t-wise MRFs ``P(z) ∝ exp(h(z))``, ``h`` multilinear of degree
  ``≤ t`` (Alg. 4, §4.1; and Alg. 5, §4.2, with the parity queries released by private
  multiplicative weights, :func:`pmw_parities`, Lemma 4.5);

and structure learning under (ε, δ)-DP by sample-and-aggregate with a stability-based mode
(:func:`learn_structure`, :func:`stable_mode`; Lemma 6.1, Cor. 6.3).

The reconstruction of the algorithm boxes, constants and tests follows the spec
``notes/zhang2020.md``; its tags are cited as ``[spec §n]``.

Conventions
-----------
* Records. The Ising learners take spins ``±1`` (``coding="spin"``) or the library's codes
  ``0/1`` (``coding="code"``, or a :class:`~numpyro_dpgm.data.Dataset`); code ``a`` is the spin
  ``s_a = 1 − 2a`` (code 0 ↔ +1, code 1 ↔ −1). The pairwise learner takes codes in ``[k_i]``.
* Models. Every learner returns a :class:`~numpyro_dpgm.estimation.result.Result` whose model is
  a :class:`~numpyro_dpgm.distributions.mrf.MarkovRandomField` with one single-attribute clique
  per node (``θ``) and one pair clique per estimated edge, in the library's overcomplete
  layout: the Ising pair table is ``A_ij s_a s_b`` and the field table ``θ_i s_a``
  (:func:`ising_to_mrf`); the pairwise tables are ``W_ij(a, b)`` and ``θ_i(a)``
  (:func:`pairwise_to_mrf`); a t-wise monomial ``I`` has the table ``h̄(I) Π_{j∈I} s_{a_j}``
  (:func:`twise_to_mrf`). The per-node estimates are not symmetric (``Â_ij`` comes from node
  ``i``'s regression); the model uses the symmetric part ``(Â + Âᵀ)/2``.
* Privacy. Neighbouring datasets have the same public size ``n`` and differ in one record. A
  learner computes its whole charge first and raises
  :class:`~numpyro_dpgm.privacy.BudgetExceededError` before touching the data when the ledger
  cannot pay it; then it debits one entry per node (per regression family) and runs. The noise
  (Laplace in Alg. 1, Laplace in PMW and the stable histogram, Gaussian for the alternative
  parity release) is drawn from the given JAX key: reproducible, meant for simulation studies.
* Diagnostics. Loss traces, Frank–Wolfe gaps and block histograms in ``extras`` are computed on
  the raw data and are not private; do not release them.
* Computation. The logistic losses are sums over records, so they are evaluated on the distinct
  records with their multiplicities (exactly the same sums; typically far fewer rows).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from .._precision import warn_if_float32
from ..data import Dataset, records_to_array
from ..distributions.mrf import MarkovRandomField
from ..domain import Domain
from ..network import MarkovNetwork
from ..privacy.guarantees import ZCDP, ApproxDP
from ..privacy.ledger import PrivacyLedger
from .frank_wolfe import (
    NoiseMultiplier,
    check_iterations,
    default_iterations,
    fw_noise_scale,
    fw_zcdp_cost,
    resolve_noise_multiplier,
    resolve_privacy,
    run_frank_wolfe_batch,
)
from .result import Result

__all__ = [
    "PMWResult",
    "StructureResult",
    "ising_to_mrf",
    "learn_ising",
    "learn_pairwise",
    "learn_structure",
    "learn_twise",
    "monomial_estimates",
    "pairwise_to_mrf",
    "pmw_parities",
    "stable_mode",
    "twise_to_mrf",
]

Array = Any
Monomial = tuple[int, ...]


# ================================================================================================
# input handling
# ================================================================================================
def _default_domain(p: int, k: int | Sequence[int]) -> Domain:
    sizes = [k] * p if isinstance(k, int) else list(k)
    return Domain({f"x{i}": int(s) for i, s in enumerate(sizes)})


def _check_domain(domain: Any, p: int, binary: bool) -> Domain:
    if isinstance(domain, int) and not isinstance(domain, bool):
        domain = _default_domain(p, domain)
    elif isinstance(domain, Sequence) and not isinstance(domain, str):
        domain = Domain({str(a): 2 for a in domain}) if binary else None
        if domain is None:
            raise TypeError("give the pairwise learner a Domain (or an int k), not a name list")
    elif isinstance(domain, Mapping) and not isinstance(domain, Domain):
        domain = Domain(domain)
    if not isinstance(domain, Domain):
        raise TypeError(f"domain must be a Domain, got {type(domain).__name__}")
    if len(domain) != p:
        raise ValueError(f"the data have {p} columns but the domain has {len(domain)} attributes")
    if binary and any(k != 2 for k in domain.shape):
        raise ValueError(
            f"an Ising model needs binary attributes; the domain has sizes {domain.shape}"
        )
    return domain


def _spins_from_data(
    data: Any, coding: Literal["spin", "code"], domain: Any
) -> tuple[np.ndarray, Domain]:
    """Validated ``(n, p)`` int8 spins ``±1`` and the (binary) domain."""
    if isinstance(data, Dataset):
        domain = _check_domain(data.domain, len(data.domain), binary=True)
        codes = data.to_array()
        return (1 - 2 * codes).astype(np.int8), domain
    if coding not in ("spin", "code"):
        raise ValueError(f"coding must be 'spin' (±1) or 'code' (0/1), got {coding!r}")
    arr = np.asarray(data)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
        raise ValueError(
            f"data must be a 2-d array (num_records, p ≥ 2) of records, got shape {arr.shape}"
        )
    allowed = (-1, 1) if coding == "spin" else (0, 1)
    if not np.all(np.isin(arr, allowed)):
        bad = np.unique(arr[~np.isin(arr, allowed)])[:5]
        raise ValueError(
            f"Ising data must be binary: with coding={coding!r} every value must be in "
            f"{allowed}; found {bad.tolist()}"
            + (" (codes 0/1? pass coding='code')" if coding == "spin" else "")
        )
    spins = arr.astype(np.int8) if coding == "spin" else (1 - 2 * arr).astype(np.int8)
    p = arr.shape[1]
    domain = _default_domain(p, 2) if domain is None else _check_domain(domain, p, binary=True)
    return spins, domain


def _codes_from_data(data: Any, domain: Any) -> tuple[np.ndarray, Domain]:
    """Validated ``(n, p)`` integer codes and the domain of a pairwise model."""
    if isinstance(data, Dataset):
        domain = data.domain
        codes = data.to_array()
    else:
        arr = np.asarray(data)
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
            raise ValueError(
                f"data must be a 2-d array (num_records, p ≥ 2) of codes, got shape {arr.shape}"
            )
        if domain is None:
            raise ValueError(
                "learn_pairwise needs the domain (a Domain, or an int k for k values per "
                "attribute): inferring the alphabet from the data would leak it"
            )
        domain = _check_domain(domain, arr.shape[1], binary=False)
        codes = records_to_array(arr, domain)
    if any(k < 2 for k in domain.shape):
        raise ValueError(f"every attribute needs at least 2 values; sizes {domain.shape}")
    return codes.astype(np.int64), domain


def _check_width(width: Any) -> float:
    lam = float(width)
    if not math.isfinite(lam) or lam <= 0:
        raise ValueError(f"width (a bound λ on the model's width) must be > 0, got {width!r}")
    return lam


def _need_key(key: Any, rho: float | None) -> Any:
    if key is None:
        if rho is not None:
            raise ValueError("a private run needs a PRNG key for its noise (key=...)")
        return jax.random.key(0)
    return key


def _compress(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows with their multiplicities, padded (weight 0) to a bucketed length."""
    uniq, counts = np.unique(rows, axis=0, return_counts=True)
    m = uniq.shape[0]
    size = 64
    while size < m:  # 64, 96, 128, 192, 256, ...: at most a third of the rows are padding
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    pad = size - m
    if pad:
        uniq = np.concatenate([uniq, np.repeat(uniq[:1], pad, axis=0)])
        counts = np.concatenate([counts, np.zeros(pad, counts.dtype)])
    return uniq, counts.astype(float)


#: Largest number of feature entries materialised for one batched Frank–Wolfe call.
_MAX_BATCH_ENTRIES = 2**24


def _solve_problems(
    build: Any,
    num: int,
    keys: Any,
    *,
    radius: float,
    num_records: int,
    noise_scale: float,
    iterations: int,
    with_trace: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run Alg. 1 on ``num`` regression problems, in batches of bounded memory.

    ``build(q)`` returns problem ``q``'s ``(features (m, d), labels (m,), weights (m,))`` (one
    ``(m, d)`` for all ``q``). Problems are built and run a batch at a time; the last batch is
    padded with copies of its first problem so that every batch has one compiled shape. Returns
    weights ``(num, d)``, loss traces ``(num, T)`` and gaps ``(num,)``.
    """
    first = build(0)
    m, d = first[0].shape
    size = max(1, min(num, _MAX_BATCH_ENTRIES // max(m * d, 1)))
    ws, losses, gaps = [], [], []
    for start in range(0, num, size):
        idx = list(range(start, min(start + size, num)))
        real = len(idx)
        idx += [idx[0]] * (size - real)
        parts = [first if q == 0 else build(q) for q in idx]
        w, loss, gap, _ = run_frank_wolfe_batch(
            np.stack([f for f, _, _ in parts]),
            np.stack([y for _, y, _ in parts]),
            np.stack([o for _, _, o in parts]),
            radius=radius,
            num_records=num_records,
            noise_scale=noise_scale,
            iterations=iterations,
            keys=keys[np.asarray(idx)],
            with_trace=with_trace,
        )
        ws.append(w[:real])
        losses.append(loss[:real])
        gaps.append(gap[:real])
    return np.concatenate(ws), np.concatenate(losses), np.concatenate(gaps)


# ================================================================================================
# accounting helpers
# ================================================================================================
class _Charge(NamedTuple):
    rho: float
    label: str
    details: dict


def _debit_all(ledger: PrivacyLedger | None, charges: Sequence[_Charge]) -> None:
    """Refuse the whole run up front if the ledger cannot pay all charges; then debit them."""
    if ledger is None or not charges:
        return
    ledger.check(ZCDP(math.fsum(c.rho for c in charges)), charges[0].label.split(":")[0])
    for c in charges:
        ledger.debit(ZCDP(c.rho), c.label, c.details)


# ================================================================================================
# parameter conversions into the library's overcomplete clique tables
# ================================================================================================
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
    domain = _default_domain(p, 2) if domain is None else _check_domain(domain, p, binary=True)
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
    domain = _check_domain(domain, p, binary=True)
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


# ================================================================================================
# Ising: Alg. 2
# ================================================================================================
def _ising_node_problem(z: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ``i``'s regression data of Alg. 2: ``x = (z_{−i}, 1)`` (increasing ``j``, bias last),
    ``y = z_i``."""
    x = np.empty(z.shape)
    x[:, :-1] = np.delete(z, i, axis=1)
    x[:, -1] = 1.0
    return x, z[:, i].astype(float)


def _ising_from_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    rows, counts = _compress(spins) if compress else (spins, np.ones(spins.shape[0]))
    z = rows.astype(float)

    def build(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (*_ising_node_problem(z, i), counts)

    return _solve_problems(
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
    privacy: float | ZCDP | ApproxDP | None,
    *,
    width: float,
    key: jax.Array | None = None,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    coding: Literal["spin", "code"] = "spin",
    domain: Domain | Sequence[str] | None = None,
    symmetrize: bool = False,
    edge_threshold: float = 0.0,
    ledger: PrivacyLedger | None = None,
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
    privacy : float, ZCDP, ApproxDP or None
        Total budget: ρ (a float or ``ZCDP``), or ``ApproxDP(ε, δ)``, which is converted to the
        largest ρ implying it (Lemma 2.13; approximate-DP parameter learning, [spec §4]).
        ``None``: non-private (``b = 0``).
    width : float
        A public upper bound ``λ ≥ λ(A, θ) = max_i Σ_j |A_ij| + |θ_i|``.
    key : jax.Array
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
    start = time.perf_counter()
    warn_if_float32("learn_ising")
    spins, domain = _spins_from_data(data, coding, domain)
    n, p = spins.shape
    lam = _check_width(width)
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = _need_key(key, rho)
    radius = 2.0 * lam
    rho_node = None if rho is None else rho / p
    if iterations is None:
        T = 1000 if rho_node is None else default_iterations(radius, n, rho_node)
    else:
        T = check_iterations(iterations)
    if rho_node is None:
        if ledger is not None:
            raise ValueError("a non-private run (privacy=None) must not be given a ledger")
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
        _debit_all(
            ledger,
            [
                _Charge(fw_zcdp_cost(rho_node, c), f"learn_ising: node {domain.attrs[i]}", details)
                for i in range(p)
            ],
        )
    w, losses, gaps = _ising_regressions(
        spins, radius=radius, num_records=n, noise_scale=b, iterations=T, key=key
    )
    A_hat, theta_hat = _ising_from_weights(w)
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


# ================================================================================================
# pairwise: Alg. 3
# ================================================================================================
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


def _onehot_features(codes: np.ndarray, i: int, K: int) -> np.ndarray:
    """``onehot([z_{−i}, 1])`` of Alg. 3, flattened ``(m, p·K)``: row ``r`` is ``e_{z_{j_r}}``
    for the ``r``-th other variable (increasing ``j``), the last row is ``e_0`` (bias)."""
    m, p = codes.shape
    feats = np.zeros((m, p, K))
    others = np.delete(codes, i, axis=1)
    feats[np.arange(m)[:, None], np.arange(p - 1)[None, :], others] = 1.0
    feats[:, p - 1, 0] = 1.0
    return feats.reshape(m, p * K)


def _pairwise_node_estimate(
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
    rows, counts = _compress(codes) if compress else (codes, np.ones(codes.shape[0]))
    W = np.zeros((p, p, K, K))
    theta = np.zeros((p, K))
    traces, gaps_all = [], []
    node_keys = jax.random.split(key, p)
    for i in range(p):
        k_i = ks[i]
        pairs = list(itertools.combinations(range(k_i), 2))
        feats = _onehot_features(rows, i, K)
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
        W_i, theta_i = _pairwise_node_estimate(w, pairs, k_i, np.delete(ks_arr, i), K)
        others = [j for j in range(p) if j != i]
        for jt, j in enumerate(others):
            W[i, j, :k_i, :] = W_i[:, jt, :]
        theta[i, :k_i] = theta_i
        traces.append(losses)
        gaps_all.append(gaps)
    return W, theta, traces, gaps_all


def learn_pairwise(
    data: Any,
    privacy: float | ZCDP | ApproxDP | None,
    *,
    width: float,
    domain: Domain | int | None = None,
    key: jax.Array | None = None,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    budget_split: BudgetSplit = "paper",
    edge_threshold: float = 0.0,
    ledger: PrivacyLedger | None = None,
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
    privacy : float, ZCDP, ApproxDP or None
        As in :func:`learn_ising`.
    width : float
        ``λ ≥ max_{i,a} Σ_{j≠i} max_b |W_ij(a, b)| + |θ_i(a)|`` (public).
    domain : Domain or int
        The alphabet (required for arrays; an int ``k`` means ``k`` values for every attribute).
    key, iterations, noise_multiplier, edge_threshold
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
    start = time.perf_counter()
    warn_if_float32("learn_pairwise")
    codes, domain = _codes_from_data(data, domain)
    n, p = codes.shape
    ks = list(domain.shape)
    K = max(ks)
    lam = _check_width(width)
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = _need_key(key, rho)
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
                _Charge(
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
        raise ValueError("a non-private run (privacy=None) must not be given a ledger")
    _debit_all(ledger, charges)
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


# ================================================================================================
# binary t-wise MRFs: Alg. 4 and Alg. 5
# ================================================================================================
def _node_monomials(p: int, i: int, order: int) -> list[Monomial]:
    """``F_i``: the subsets of ``[p] \\ {i}`` of size ``1..t−1`` (by size, then
    lexicographically), then ``∅`` last, so that ``t = 2`` gives Alg. 2's ``(z_{−i}, 1)``."""
    others = [j for j in range(p) if j != i]
    out: list[Monomial] = []
    for s in range(1, order):
        out.extend(itertools.combinations(others, s))
    out.append(())
    return out


def _parity_columns(spins: np.ndarray, sets: Sequence[Monomial]) -> np.ndarray:
    """``z_S`` for every row and every set ``S`` (``z_∅ = 1``), shape ``(m, |sets|)``."""
    z = spins.astype(float)
    out = np.ones((z.shape[0], len(sets)))
    for q, S in enumerate(sets):
        if S:
            out[:, q] = np.prod(z[:, list(S)], axis=1)
    return out


def monomial_estimates(
    node_coefficients: Sequence[Mapping[Monomial, float]],
    parities: Mapping[Monomial, float],
    order: int,
) -> dict[Monomial, float]:
    """Step 3 of Alg. 5: ``ĥ(I) = Σ_{J ⊇ I} ū_i(J) Q̂(J \\ I)``, ``i = min I``, ``Q̂(∅) = 1``.

    This is the mean over the data of ``∂_I u_i``, written through parity means; for a maximal
    monomial ``I`` of ``h`` it estimates ``h̄(I)`` (KM17 Lemma 6.4; seed 001, Lemma 4.4) [spec §6.2].

    Parameters
    ----------
    node_coefficients : sequence of mappings
        ``node_coefficients[i][J] = ū_i(J)`` for monomials ``J ∋ i`` (sorted tuples), the
        polynomial of node ``i``'s regression.
    parities : mapping
        ``Q̂(S) ≈ (1/n) Σ_m z^m_S`` for the sets ``S`` the sum needs (sorted tuples).
    order : int
        ``t``: every ``I`` with ``1 ≤ |I| ≤ t`` is estimated.

    Returns
    -------
    dict
        ``ĥ(I)`` for every ``I`` with ``1 ≤ |I| ≤ t`` over the ``len(node_coefficients)`` nodes.
    """
    p = len(node_coefficients)
    coefs = [{tuple(sorted(J)): float(v) for J, v in nc.items()} for nc in node_coefficients]
    par = {tuple(sorted(S)): float(v) for S, v in parities.items()}
    par[()] = 1.0
    out: dict[Monomial, float] = {}
    for size in range(1, order + 1):
        for I in itertools.combinations(range(p), size):
            i, Iset = I[0], set(I)
            total = 0.0
            for J, u in coefs[i].items():
                if Iset <= set(J):
                    rest = tuple(j for j in J if j not in Iset)
                    if rest not in par:
                        raise KeyError(
                            f"parity estimate of {rest} is needed for monomial {I} but missing"
                        )
                    total += u * par[rest]
            out[I] = total
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
    key: jax.Array,
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
    key : jax.Array
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
    data_par = _parity_columns(z, qs).mean(axis=0)
    state_par = _parity_columns(_all_spin_states(p), qs).T  # (|Q|, 2^p)
    dtype = jnp.result_type(float)
    answers, hard, count = _pmw_scan(
        jnp.asarray((1.0 + data_par) / 2.0, dtype),
        jnp.asarray((1.0 + state_par) / 2.0, dtype),
        jnp.asarray(a, dtype),
        jnp.asarray(b, dtype),
        jnp.asarray(K, jnp.int32),
        key,
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


def _gaussian_parities(
    spins: np.ndarray, queries: Sequence[Monomial], rho: float, key: Any
) -> tuple[dict, float]:
    """Gaussian mechanism on all parity means: ℓ2-sensitivity ``2√|Q|/n`` (replace-one),
    ``σ = 2√|Q|/(n √(2ρ))`` (Bun & Steinke 2016, Prop. 1.6) [spec §6.3, alternative]."""
    n = spins.shape[0]
    sigma = 2.0 * math.sqrt(len(queries)) / (n * math.sqrt(2.0 * rho))
    means = _parity_columns(spins, queries).mean(axis=0)
    noise = np.asarray(jax.random.normal(key, (len(queries),), jnp.result_type(float)))
    return {S: float(v) for S, v in zip(queries, means + sigma * noise, strict=True)}, sigma


def learn_twise(
    data: Any,
    privacy: float | ZCDP | None,
    *,
    order: int,
    width: float,
    key: jax.Array | None = None,
    estimator: Literal["parity", "regression"] = "parity",
    parity_release: Literal["pmw", "gaussian"] = "pmw",
    pmw_alpha: float = 0.05,
    split: bool = False,
    regression_share: float = 0.5,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    coding: Literal["spin", "code"] = "spin",
    domain: Domain | Sequence[str] | None = None,
    ledger: PrivacyLedger | None = None,
) -> Result:
    """Learn a binary t-wise MRF ``P(z) ∝ exp(h(z))`` under ρ-zCDP (seed 001, Alg. 4 and 5).

    Alg. 4 (§4.1, Thm 4.2): for every node ``i``, Lemma 4.1 gives
    ``P(z_i = +1 | z_{−i}) = σ(2 ∂_i h(z))`` with ``∂_i h(z) = Σ_{J ∋ i} h̄(J) z_{J∖i}``, so
    Alg. 1 is run on the parity features ``x = (z_I)_{I ∈ F_i}`` (all ``I ⊆ [p]∖{i}`` with
    ``|I| ≤ t − 1``), ``y = z_i``, over the ℓ1 ball of radius ``2λ``
    (``‖w*‖_1 = 2‖∂_i h‖_1 ≤ 2λ``), with budget ``ρ_1/p``; ``ū_i(I ∪ {i}) = w_I / 2``. The
    combined polynomial is ``ū(J) = ū_{min J}(J)`` [spec §6.1].

    Alg. 5 (§4.2, Thm 4.7): additionally release the parity means ``Q̂(S)``, ``1 ≤ |S| ≤ t − 1``
    (all that step 3 needs), with :func:`pmw_parities` (budget ``ρ_2``) and estimate every
    monomial by :func:`monomial_estimates`; for maximal monomials of ``h`` this is an
    ℓ∞-accurate estimate of ``h̄(I)`` [spec §6.2].

    Parameters
    ----------
    data : array ``(n, p)`` or Dataset
        Spins or codes, as in :func:`learn_ising`.
    privacy : float, ZCDP or None
        Total ρ; ``None``: non-private (``b = 0``, exact parities).
    order : int
        ``t ≥ 2``.
    width : float
        ``λ ≥ max_i ‖∂_i h‖_1`` (public).
    key : jax.Array
        PRNG key (simulation noise).
    estimator : {"parity", "regression"}
        Alg. 5 (default) or Alg. 4 alone (all of ρ to the regressions).
    parity_release : {"pmw", "gaussian"}
        PMW (the paper's choice, Lemma 4.5) or the Gaussian mechanism on all parity means
        (simple and rigorous; not the paper's).
    pmw_alpha : float
        PMW's accuracy target α.
    split : bool
        Alg. 5 budget option (b) [spec §6.2]: the first ``⌊n/2⌋`` records go to the regressions
        and the rest to the parity release, each with the full ρ (parallel composition). Default
        (a): all records to both, ``ρ_1 = regression_share·ρ``, ``ρ_2 = ρ − ρ_1``.
    regression_share : float
        ``ρ_1/ρ`` when ``split`` is false (default 1/2).
    iterations, noise_multiplier, coding, domain
        As in :func:`learn_ising` (default ``T = round((2λ n_1 √(ρ_1/p))^{2/3})``).
    ledger : PrivacyLedger, optional
        Charged ``p`` regression entries and (unless ``split``, where the disjoint halves compose
        in parallel) one parity-release entry; refused before any computation if the total does
        not fit.

    Returns
    -------
    Result
        ``model``: :func:`twise_to_mrf` of the Alg. 4 polynomial ``ū`` (all monomials of size
        ``≤ t``); ``extras``: ``"coefficients"`` (``ū``), ``"node_coefficients"`` (``ū_i``),
        ``"monomials"`` (Alg. 5's ``ĥ``, when ``estimator="parity"``), ``"parities"``,
        ``"pmw"`` (a :class:`PMWResult`, when used), ``"T"``, ``"rho_regression"``,
        ``"rho_parities"``, ``"noise_scale"``, ``"rho_spent"``, and non-private diagnostics
        ``"loss_traces"``, ``"gaps"``.
    """
    start = time.perf_counter()
    warn_if_float32("learn_twise")
    spins, domain = _spins_from_data(data, coding, domain)
    n, p = spins.shape
    if isinstance(order, bool) or not isinstance(order, int | np.integer) or order < 2:
        raise ValueError(f"order t must be an integer ≥ 2, got {order!r}")
    if order > p:
        raise ValueError(f"order t = {order} exceeds the number of variables p = {p}")
    lam = _check_width(width)
    if isinstance(privacy, ApproxDP):
        raise ValueError("learn_twise is a zCDP mechanism; pass ρ (a float or ZCDP)")
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = _need_key(key, rho)
    if estimator not in ("parity", "regression"):
        raise ValueError(f"estimator must be 'parity' or 'regression', got {estimator!r}")
    if parity_release not in ("pmw", "gaussian"):
        raise ValueError(f"parity_release must be 'pmw' or 'gaussian', got {parity_release!r}")
    share = float(regression_share)
    if not 0 < share < 1 and estimator == "parity" and not split:
        raise ValueError(f"regression_share must lie in (0, 1), got {regression_share!r}")
    use_parities = estimator == "parity"
    if split and estimator == "parity":
        n1 = n // 2
        reg_rows, par_rows = spins[:n1], spins[n1:]
        if n1 < 1 or n - n1 < 1:
            raise ValueError("split=True needs at least 2 records")
    else:
        n1 = n
        reg_rows, par_rows = spins, spins
    if rho is None:
        rho1 = rho2 = None
    elif split or not use_parities:
        rho1, rho2 = rho, (rho if use_parities else None)
    else:
        rho1, rho2 = share * rho, (1.0 - share) * rho
    radius = 2.0 * lam
    rho_node = None if rho1 is None else rho1 / p
    if iterations is None:
        T = 1000 if rho_node is None else default_iterations(radius, n1, rho_node)
    else:
        T = check_iterations(iterations)
    b = 0.0 if rho_node is None else fw_noise_scale(radius, n1, rho_node, T, c)
    queries = [S for s in range(1, order) for S in itertools.combinations(range(p), s)]
    charges = []
    if rho is not None:
        details = {
            "mechanism": "private Frank-Wolfe on parity features (seed 001, Alg. 1 in Alg. 4)",
            "target": target,
            "rho_calibrated": rho_node,
            "noise_multiplier": c,
            "noise_scale": b,
            "iterations": T,
            "radius": radius,
            "num_records": n1,
            "rows": "first half" if split and use_parities else "all",
            "neighbours": "replace_one",
            "sampler": "jax (simulation)",
        }
        if split and use_parities:
            details["parallel_composition"] = (
                "the parity release on the disjoint second half (ρ) composes in parallel"
            )
        charges = [
            _Charge(fw_zcdp_cost(rho_node, c), f"learn_twise: node {domain.attrs[i]}", details)
            for i in range(p)
        ]
        if use_parities and not split:
            charges.append(
                _Charge(
                    rho2,  # type: ignore[arg-type]
                    f"learn_twise: parity queries ({parity_release})",
                    {"mechanism": parity_release, "queries": len(queries)},
                )
            )
    elif ledger is not None:
        raise ValueError("a non-private run (privacy=None) must not be given a ledger")
    if p > 20 and use_parities and parity_release == "pmw":
        raise ValueError(f"PMW keeps a distribution over 2^p states; p = {p} is too large")
    _debit_all(ledger, charges)

    # step 1: the p regressions (Alg. 4)
    k_reg, k_par = jax.random.split(key)
    node_sets = [_node_monomials(p, i, order) for i in range(p)]
    rows, counts = _compress(reg_rows)
    w, losses, gaps = _solve_problems(
        lambda i: (_parity_columns(rows, node_sets[i]), rows[:, i].astype(float), counts),
        p,
        jax.random.split(k_reg, p),
        radius=radius,
        num_records=n1,
        noise_scale=b,
        iterations=T,
    )
    node_coefs: list[dict[Monomial, float]] = []
    for i in range(p):
        node_coefs.append(
            {
                tuple(sorted(I + (i,))): float(w[i, q] / 2.0)
                for q, I in enumerate(node_sets[i])
            }
        )
    combined = {
        J: node_coefs[J[0]][J]
        for size in range(1, order + 1)
        for J in itertools.combinations(range(p), size)
    }
    extras: dict[str, Any] = {
        "coefficients": combined,
        "node_coefficients": node_coefs,
        "T": T,
        "radius": radius,
        "noise_scale": b,
        "noise_multiplier": c,
        "rho": rho,
        "rho_regression": rho1,
        "rho_parities": rho2,
        "rho_spent": math.fsum(ch.rho for ch in charges),
        "loss_traces": losses,
        "gaps": gaps,
    }

    # steps 2–3: parity release and monomial estimates (Alg. 5)
    if estimator == "parity":
        if rho2 is None:
            means = _parity_columns(par_rows, queries).mean(axis=0)
            parities: dict[Monomial, float] = {
                S: float(v) for S, v in zip(queries, means, strict=True)
            }
        elif parity_release == "pmw":
            pmw = pmw_parities(par_rows, queries, rho2, alpha=pmw_alpha, key=k_par)
            parities = pmw.parities
            extras["pmw"] = pmw
        else:
            parities, sigma = _gaussian_parities(par_rows, queries, rho2, k_par)
            extras["parity_sigma"] = sigma
        extras["parities"] = parities
        extras["monomials"] = monomial_estimates(node_coefs, parities, order)

    model = twise_to_mrf(combined, domain)
    return Result(
        model=model,
        loss_trace=losses.mean(axis=0),
        iterations=T - 1,
        converged=True,
        elapsed=time.perf_counter() - start,
        extras=extras,
    )


# ================================================================================================
# structure learning under (ε, δ)-DP: Lemma 6.1
# ================================================================================================
def stable_mode(
    outputs: Sequence[Hashable],
    epsilon: float,
    delta: float,
    *,
    key: jax.Array,
) -> tuple[Hashable | None, float, float, dict]:
    """Stability-based mode of block outputs (Lemma 6.1; Vadhan 2017, Prop. 3.4) [spec §7].

    Counts ``c_G`` of the values that occur (never of all possible values), adds ``Lap(2/ε)`` to
    each (replacing one record changes one block, hence two counts by one), and returns the value
    with the largest noisy count if that count reaches ``τ = 1 + 2 ln(2/δ)/ε``, else ``None``
    (⊥). A value that occurs on one side of a neighbouring pair only passes ``τ`` with
    probability ``≤ δ/4``, so the release is (ε, δ)-DP.

    Returns
    -------
    (winner or None, its noisy count, τ, noisy histogram)
    """
    eps = ApproxDP(epsilon, delta)  # validates ε > 0 and δ ∈ (0, 1)
    counts = Counter(outputs)
    if not counts:
        raise ValueError("no block outputs to aggregate")
    bins = list(counts)
    raw = np.array([counts[g] for g in bins], dtype=float)
    noise = np.asarray(jax.random.laplace(key, (len(bins),), jnp.result_type(float)))
    noisy = raw + (2.0 / eps.epsilon) * noise
    tau = 1.0 + 2.0 * math.log(2.0 / eps.delta) / eps.epsilon
    best = int(np.argmax(noisy))
    winner = bins[best] if noisy[best] >= tau else None
    return winner, float(noisy[best]), tau, dict(zip(bins, noisy.tolist(), strict=True))


class StructureResult(NamedTuple):
    """What :func:`learn_structure` returns.

    Attributes
    ----------
    edges : frozenset of (i, j) with i < j, or None
        The released edge set; ``None`` is ⊥ (no block graph was stable enough).
    graph : networkx.Graph or None
        The same edges over the attribute names.
    noisy_count : float
        The winning noisy count.
    threshold : float
        ``τ = 1 + 2 ln(2/δ)/ε``.
    blocks, block_size : int
        ``B`` and ``⌊n/B⌋``.
    elapsed : float
    extras : dict
        Non-private diagnostics (block histogram, per-block estimates); do not release them.
    """

    edges: frozenset | None
    graph: nx.Graph | None
    noisy_count: float
    threshold: float
    blocks: int
    block_size: int
    elapsed: float
    extras: dict

    @property
    def found(self) -> bool:
        """Whether a graph (not ⊥) was released."""
        return self.edges is not None


def _ising_block_graphs(
    spins: np.ndarray, B: int, m: int, radius: float, T: int, threshold: float
) -> tuple[list[frozenset], np.ndarray]:
    p = spins.shape[1]
    compressed = [_compress(blk) for blk in spins[: B * m].reshape(B, m, p)]
    size = max(rows.shape[0] for rows, _ in compressed)
    blocks = [
        (
            np.concatenate([rows, np.repeat(rows[:1], size - rows.shape[0], axis=0)]).astype(float),
            np.pad(counts, (0, size - rows.shape[0])),
        )
        for rows, counts in compressed
    ]

    def build(q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        z, counts = blocks[q // p]
        return (*_ising_node_problem(z, q % p), counts)

    w, _, _ = _solve_problems(
        build,
        B * p,
        jax.random.split(jax.random.key(0), B * p),
        radius=radius,
        num_records=m,
        noise_scale=0.0,
        iterations=T,
        with_trace=False,
    )
    w = w.reshape(B, p, p)
    strengths = np.empty((B, p, p))
    for b in range(B):
        A, _ = _ising_from_weights(w[b])
        strengths[b] = np.abs(0.5 * (A + A.T))
    graphs = [
        frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if s[i, j] > threshold)
        for s in strengths
    ]
    return graphs, strengths


def _pairwise_block_graphs(
    codes: np.ndarray, ks: Sequence[int], B: int, m: int, radius: float, T: int, threshold: float
) -> tuple[list[frozenset], np.ndarray]:
    p = codes.shape[1]
    K = max(ks)
    ks_arr = np.asarray(ks)
    compressed = [_compress(codes[b * m : (b + 1) * m]) for b in range(B)]
    size = max(rows.shape[0] for rows, _ in compressed)
    padded = [
        (
            np.concatenate([rows, np.repeat(rows[:1], size - rows.shape[0], axis=0)]),
            np.pad(counts, (0, size - rows.shape[0])),
        )
        for rows, counts in compressed
    ]
    W = np.zeros((B, p, p, K, K))
    for i in range(p):
        pairs = list(itertools.combinations(range(ks[i]), 2))
        feats = [_onehot_features(rows, i, K) for rows, _ in padded]

        def build(
            q: int, i: int = i, pairs: list = pairs, feats: list = feats
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            b, (u, v) = q // len(pairs), pairs[q % len(pairs)]
            zi, counts = padded[b][0][:, i], padded[b][1]
            return feats[b], np.where(zi == u, 1.0, -1.0), ((zi == u) | (zi == v)) * counts

        w, _, _ = _solve_problems(
            build,
            B * len(pairs),
            jax.random.split(jax.random.key(0), B * len(pairs)),
            radius=radius,
            num_records=m,
            noise_scale=0.0,
            iterations=T,
            with_trace=False,
        )
        w = w.reshape(B, len(pairs), -1)
        others = [j for j in range(p) if j != i]
        for b in range(B):
            W_i, _ = _pairwise_node_estimate(w[b], pairs, ks[i], np.delete(ks_arr, i), K)
            for jt, j in enumerate(others):
                W[b, i, j, : ks[i], :] = W_i[:, jt, :]
    strengths = np.zeros((B, p, p))
    for i, j in itertools.combinations(range(p), 2):
        sym = 0.5 * (W[:, i, j] + np.swapaxes(W[:, j, i], -1, -2))
        strengths[:, i, j] = strengths[:, j, i] = np.max(np.abs(sym), axis=(-1, -2))
    graphs = [
        frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if s[i, j] > threshold)
        for s in strengths
    ]
    return graphs, strengths


def learn_structure(
    data: Any,
    epsilon: float,
    delta: float,
    *,
    min_edge_weight: float,
    width: float,
    key: jax.Array,
    model: Literal["ising", "pairwise"] = "ising",
    blocks: int | None = None,
    iterations: int = 300,
    threshold: float | None = None,
    coding: Literal["spin", "code"] = "spin",
    domain: Domain | int | Sequence[str] | None = None,
    ledger: PrivacyLedger | None = None,
) -> StructureResult:
    """Learn the graph of an Ising or pairwise model under (ε, δ)-DP (seed 001, §6, Cor. 6.3).

    Sample-and-aggregate (Lemma 6.1): split the records by index into ``B`` disjoint blocks of
    ``⌊n/B⌋`` (leftover records are unused), learn a graph on every block with the non-private
    learner, and release the stable mode of the block graphs (:func:`stable_mode`). The block
    learner is Alg. 2 (Ising) or Alg. 3 (pairwise) without noise (``b = 0``, ``T`` fixed), i.e. the
    ℓ1-constrained logistic regressions of Wu, Sanghavi & Dimakis (2019) solved by Frank–Wolfe, with
    the edge rule ``{i, j} ∈ Ĝ`` iff ``|(Â_ij + Â_ji)/2| > η/2`` (Ising) or
    ``max_{a,b} |(Ŵ_ij(a, b) + Ŵ_ji(b, a))/2| > η/2`` (pairwise) [spec §7]. If every block
    recovers the true graph with probability ≥ 2/3, ``B = O(log(1/δ)/ε)`` blocks suffice, so
    ``n = O(m log(1/δ)/ε)`` for a non-private sample complexity ``m`` (Cor. 6.3:
    ``O(λ² k⁴ e^{14λ} log(pk) log(1/δ)/(ε η⁴))``).

    Parameters
    ----------
    data : array ``(n, p)`` or Dataset
        Spins/codes (Ising, see :func:`learn_ising`) or codes (pairwise).
    epsilon, delta : float
        The (ε, δ)-DP target; ``ε > 0``, ``δ ∈ (0, 1)``.
    min_edge_weight : float
        ``η``, a public lower bound on the edge strengths (Def. 2.1, 2.2).
    width : float
        ``λ`` (sets the ℓ1 radius ``2λ`` or ``2λK`` of the block regressions).
    key : jax.Array
        PRNG key of the histogram noise (simulation).
    model : {"ising", "pairwise"}
    blocks : int, optional
        ``B`` (public); default ``⌈2τ⌉``.
    iterations : int
        ``T`` of the non-private block regressions.
    threshold : float, optional
        Edge threshold; default ``η/2``.
    coding, domain
        As in :func:`learn_ising` / :func:`learn_pairwise`.
    ledger : PrivacyLedger, optional
        Charged ``ApproxDP(ε, δ)`` before any computation (an ``"approx"`` ledger; a zCDP ledger
        cannot pay an (ε, δ) guarantee and refuses).

    Returns
    -------
    StructureResult
    """
    start = time.perf_counter()
    target = ApproxDP(epsilon, delta)
    eta = float(min_edge_weight)
    if not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"min_edge_weight η must be > 0, got {min_edge_weight!r}")
    lam = _check_width(width)
    T = check_iterations(iterations)
    thr = eta / 2.0 if threshold is None else float(threshold)
    if thr < 0:
        raise ValueError(f"threshold must be ≥ 0, got {threshold!r}")
    if model == "ising":
        rows, dom = _spins_from_data(data, coding, domain)
        radius = 2.0 * lam
        ks: list[int] = [2] * rows.shape[1]
    elif model == "pairwise":
        rows, dom = _codes_from_data(data, domain)
        ks = list(dom.shape)
        radius = 2.0 * lam * max(ks)
    else:
        raise ValueError(f"model must be 'ising' or 'pairwise', got {model!r}")
    n, p = rows.shape
    tau = 1.0 + 2.0 * math.log(2.0 / target.delta) / target.epsilon
    B = math.ceil(2.0 * tau) if blocks is None else int(blocks)
    if B < 1:
        raise ValueError(f"blocks must be ≥ 1, got {blocks!r}")
    m = n // B
    if m < 1:
        raise ValueError(f"{n} records cannot fill {B} blocks")
    if ledger is not None:
        ledger.debit(
            target,
            f"learn_structure: {model} graph (stable mode over {B} blocks)",
            {
                "mechanism": "sample-and-aggregate + stability-based histogram (Lemma 6.1)",
                "blocks": B,
                "block_size": m,
                "laplace_scale": 2.0 / target.epsilon,
                "threshold": tau,
                "neighbours": "replace_one",
                "sampler": "jax (simulation)",
            },
        )
    if model == "ising":
        graphs, strengths = _ising_block_graphs(rows, B, m, radius, T, thr)
    else:
        graphs, strengths = _pairwise_block_graphs(rows, ks, B, m, radius, T, thr)
    winner, noisy, tau, _ = stable_mode(graphs, target.epsilon, target.delta, key=key)
    graph = None
    if winner is not None:
        graph = nx.Graph()
        graph.add_nodes_from(dom.attrs)
        graph.add_edges_from((dom.attrs[i], dom.attrs[j]) for i, j in sorted(winner))
    return StructureResult(
        edges=winner,  # type: ignore[arg-type]
        graph=graph,
        noisy_count=noisy,
        threshold=tau,
        blocks=B,
        block_size=m,
        elapsed=time.perf_counter() - start,
        extras={
            "block_histogram": Counter(graphs),
            "block_strengths": strengths,
            "edge_threshold": thr,
            "iterations": T,
            "radius": radius,
        },
    )
