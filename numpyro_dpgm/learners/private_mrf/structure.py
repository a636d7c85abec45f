"""Private structure learning of Ising and pairwise models under (ε, δ)-DP (seed 001, §6).

Sample-and-aggregate with a stability-based mode (:func:`learn_structure`, :func:`stable_mode`;
Lemma 6.1, Cor. 6.3): the non-private learners of :mod:`.ising` and :mod:`.pairwise` run on
disjoint blocks of records, and the most frequent block graph is released if it is stable.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from ...domain import Domain
from ...estimation.contract import approx_budget
from ...privacy.guarantees import ApproxDP
from ...privacy.ledger import PrivacyLedger
from ..frank_wolfe import check_iterations
from ._inputs import check_width, codes_from_data, spins_from_data
from ._regressions import compress_rows, solve_problems
from .ising import ising_from_weights, ising_node_problem
from .pairwise import onehot_features, pairwise_node_estimate

__all__ = ["StructureResult", "learn_structure", "stable_mode"]


def stable_mode(
    outputs: Sequence[Hashable],
    epsilon: float,
    delta: float,
    *,
    rng_key: jax.Array,
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
    noise = np.asarray(jax.random.laplace(rng_key, (len(bins),), jnp.result_type(float)))
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
    compressed = [compress_rows(blk) for blk in spins[: B * m].reshape(B, m, p)]
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
        return (*ising_node_problem(z, q % p), counts)

    w, _, _ = solve_problems(
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
        A, _ = ising_from_weights(w[b])
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
    compressed = [compress_rows(codes[b * m : (b + 1) * m]) for b in range(B)]
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
        feats = [onehot_features(rows, i, K) for rows, _ in padded]

        def build(
            q: int, i: int = i, pairs: list = pairs, feats: list = feats
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            b, (u, v) = q // len(pairs), pairs[q % len(pairs)]
            zi, counts = padded[b][0][:, i], padded[b][1]
            return feats[b], np.where(zi == u, 1.0, -1.0), ((zi == u) | (zi == v)) * counts

        w, _, _ = solve_problems(
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
            W_i, _ = pairwise_node_estimate(w[b], pairs, ks[i], np.delete(ks_arr, i), K)
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
    domain: Domain | int | Sequence[str] | None = None,
    *,
    budget: ApproxDP | float,
    rng_key: jax.Array | None = None,
    ledger: PrivacyLedger | None = None,
    delta: float | None = None,
    min_edge_weight: float,
    width: float,
    model: Literal["ising", "pairwise"] = "ising",
    blocks: int | None = None,
    iterations: int = 300,
    threshold: float | None = None,
    coding: Literal["spin", "code"] = "spin",
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
    domain : Domain, int or sequence of str, optional
        As in :func:`learn_ising` / :func:`learn_pairwise` (a Dataset carries its own).
    budget : ApproxDP or float
        The (ε, δ)-DP target, ``ApproxDP(ε, δ)``, or a bare ``ε`` with ``delta=``.
    rng_key : jax.Array
        PRNG key of the histogram noise (simulation); required.
    ledger : PrivacyLedger, optional
        Charged ``ApproxDP(ε, δ)`` before any computation (an ``"approx"`` ledger; a zCDP ledger
        cannot pay an (ε, δ) guarantee and refuses).
    delta : float, optional
        δ when ``budget`` is a bare ε.
    min_edge_weight : float
        ``η``, a public lower bound on the edge strengths (Def. 2.1, 2.2).
    width : float
        ``λ`` (sets the ℓ1 radius ``2λ`` or ``2λK`` of the block regressions).
    model : {"ising", "pairwise"}
    blocks : int, optional
        ``B`` (public); default ``⌈2τ⌉``.
    iterations : int
        ``T`` of the non-private block regressions.
    threshold : float, optional
        Edge threshold; default ``η/2``.
    coding
        As in :func:`learn_ising`.

    Returns
    -------
    StructureResult
    """
    start = time.perf_counter()
    if budget is None:
        raise ValueError("learn_structure() is private only: pass budget=ApproxDP(epsilon, "
                         "delta)")
    target = approx_budget(budget, delta, "learn_structure")
    assert target is not None
    if rng_key is None:
        raise ValueError("learn_structure() draws noise: pass rng_key=jax.random.key(seed)")
    eta = float(min_edge_weight)
    if not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"min_edge_weight η must be > 0, got {min_edge_weight!r}")
    lam = check_width(width)
    T = check_iterations(iterations)
    thr = eta / 2.0 if threshold is None else float(threshold)
    if thr < 0:
        raise ValueError(f"threshold must be ≥ 0, got {threshold!r}")
    if model == "ising":
        rows, dom = spins_from_data(data, coding, domain)
        radius = 2.0 * lam
        ks: list[int] = [2] * rows.shape[1]
    elif model == "pairwise":
        rows, dom = codes_from_data(data, domain)
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
    winner, noisy, tau, _ = stable_mode(graphs, target.epsilon, target.delta, rng_key=rng_key)
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
