"""Approximate marginal oracle: region graphs and Convex-GBP (seed 003, §4 and Appendix A).

A *region graph* ``G = (V, E)`` (seed 003, Definition 2) is a directed graph whose vertices are
attribute sets ("regions") and whose edges ``p → t`` satisfy ``t ⊂ p``. Its *local polytope*
(Definition 3, Eq. (2)) is

.. math:: \\mathcal{L}(G) = \\{τ ≥ 0 : 1^⊤τ_r = 1 \\;∀ r ∈ V,\\;
          P_{p→t}\\,τ_p = τ_t \\;∀ p→t ∈ E\\},

an outer relaxation of the marginal polytope. Two constructions from a network's cliques
(Figure 1 of seed 003) are provided:

``kind="factor"``
    the factor graph: one region per network clique plus one single-attribute region per
    attribute; every clique of two or more attributes is a parent of its attributes' regions.
    Only one-way marginals are forced to agree.
``kind="saturated"``
    the saturated region graph: the cliques closed under non-empty intersection (Koller &
    Friedman, Alg. 11.3), with an edge ``p → t`` whenever no region lies strictly between them
    (the Hasse diagram of ``⊂``), optionally pruned to the *minimal* edges (below). It enforces
    every consistency between overlapping cliques that the relaxation can express; this is the
    default of seed 003.

Counting numbers weight the region entropies of the free energy (Problem 3)

.. math:: F_κ(τ) = -θ^⊤τ - H_κ(τ), \\qquad H_κ(τ) = \\sum_{r∈V} κ_r H(τ_r).

``counting="convex"`` sets ``κ_r = 1`` for every region: the choice seed 003 uses inside
Prox-PGM (Appendix B.2), for which ``F_κ`` is strictly convex on ``L(G)`` and Convex-GBP provably
solves Problem 3 (Theorem 1); by Theorem 2 any positive ``κ`` gives the same Prox-PGM estimate.
Note that ``κ ≡ 1`` over-counts entropy, so its pseudo-marginals differ from the exact
marginals even on a tree: it is the right oracle for Prox-PGM, not an approximation of ``p_θ``'s
marginals. ``counting="kikuchi"`` (alias ``"bethe"``) uses the Möbius numbers
``c_r = 1 − Σ_{a ∈ anc(r)} c_a`` (Yedidia, Freeman & Weiss 2005), which on the factor graph are the
Bethe numbers ``c_i = 1 − deg(i)``; they make ``F_κ`` exact (and its minimiser the exact
marginals) when the region graph is a tree of regions, e.g. a pairwise tree or a junction tree's
cliques and separators, but are negative on intersections, so the free energy is then not convex
in general and the message passing below is loopy generalised belief propagation. Algorithm 2's
updates are defined when ``κ_r > 0`` on every region with children and
``κ_t + Σ_{p∈P(t)} κ_p > 0`` on every region with parents (the conditions of norm-product belief
propagation); the Bethe numbers of any factor graph satisfy them, and a saturated graph whose
negative-numbered intersections have children is rejected.

Convex-GBP (Algorithm 2, after Hazan, Peng & Shashua 2012) minimises the Lagrangian dual of
Problem 3,

.. math:: g(λ) = \\sum_{r∈V} κ_r \\log \\sum_{x_r} \\exp\\big(ψ_r(x_r)/κ_r\\big), \\qquad
          ψ_r = θ_r + \\sum_{t ∈ Ch(r)} λ_{t→r} - \\sum_{p ∈ P(r)} λ_{r→p},

by exact block-coordinate steps: the block of a region ``t`` is the set of its upward messages
``{λ_{t→p}: p ∈ P(t)}``, and its minimiser given the other blocks is Algorithm 2's update

.. math:: m_{p→t} = κ_p \\log \\sum_{x_p ∖ x_t} \\exp\\Big(\\big(ψ_p - λ_{t→p}\\big)/κ_p\\Big),

.. math:: λ_{t→p} = κ_{p,t}\\Big(θ_t + \\sum_{c∈Ch(t)} λ_{c→t}
          + \\sum_{p'∈P(t)} m_{p'→t}\\Big) - m_{p→t},

with ``κ_{p,t} = κ_p / (κ_t + Σ_{p'∈P(t)} κ_{p'})``; the beliefs are
``τ_r ∝ exp(ψ_r / κ_r)``. (In the listing of Algorithm 2 the sum over children in ``m_{p→t}``
excludes the receiving child ``t``, and the subtracted term of the ``λ`` update is the down
message ``m_{p→t}`` of the same edge; both follow from minimising ``g`` over the block.) Every
quantity is a log-table, reductions are log-sum-exps, and each message is shifted to a fixed
gauge after every update. Two schedules are offered:

``schedule="sequential"``
    the blocks are greedily coloured so that blocks of one colour touch disjoint regions; the
    colours are visited in turn and each colour's blocks are updated together. Every step is an
    exact block minimisation, so with ``κ > 0`` the dual ``g`` never increases, for any damping.
``schedule="parallel"`` (default)
    every block is updated from the same messages (Jacobi), as in the reference implementation
    of seed 003; one sweep costs one pass over the graph (a sequential sweep costs one per
    colour). With ``K`` colours, damping ``ρ ≥ 1 − 1/K`` keeps ``g`` non-increasing (the damped
    step is then a convex combination of colour-wise exact steps); the default ``ρ = 0.5`` is
    the reference implementation's, guaranteed monotone when ``K ≤ 2`` and convergent in
    practice, while ``ρ = 0`` can oscillate.

Damping ``ρ`` replaces each block by ``ρ·old + (1 − ρ)·new`` (seed 003, §6). With ``κ > 0`` the
minimum of ``g`` equals the maximum of ``θ^⊤τ + H_κ(τ)`` over ``L(G)``: :func:`log_partition`
returns ``g(λ)``, an upper bound of that optimum at every iterate and equal to it at
convergence; with ``κ ≡ 1`` it also bounds the exact ``log Z`` from above (Shearer's
inequality), and with the Möbius numbers on a tree it equals ``log Z``.

The messages are the oracle's state (:class:`GBPState`), a pytree that is threaded through
mirror-descent steps (warm start, seed 003 §6), so everything that touches ``θ`` is a pure
function of ``(θ, state)``, ``jit``-able and ``vmap``-able with the (hashable, cached) region
graph static. All region tables and messages live in two flat vectors, and every projection and
neighbour sum is a gather with precomputed indices followed by a dense reduction; one compiled
program serves every call on a region graph (number of sweeps, damping, tolerance and schedule
are traced values), and its size does not grow with the number of regions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._precision import warn_if_float32
from ..domain import Clique, Domain
from ..network import MarkovNetwork
from ..tables import CliqueTables

__all__ = [
    "RegionGraph",
    "GBPState",
    "ConvexGBPOracle",
    "build_region_graph",
    "init_state",
    "convex_gbp",
    "region_beliefs",
    "log_partition",
    "dual_objective",
    "free_energy",
    "local_inconsistency",
]

Array = Any

KINDS = ("factor", "saturated")
SCHEDULES = ("sequential", "parallel")


# ------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class RegionGraph:
    """Static structure of a region graph over a network's cliques, with counting numbers.

    Built (and cached) by :func:`build_region_graph`; immutable and hashable, so it can be a
    static argument of jitted functions. Equality and hashing use the construction key
    ``(network, kind, minimal, counting)``, from which every other field is derived.

    Attributes
    ----------
    network : MarkovNetwork
        The network whose cliques the graph supports (Definition 2 of seed 003).
    kind : {"factor", "saturated"}
    minimal : bool
        Whether redundant edges were pruned (saturated graphs only).
    regions : tuple of cliques
        Attributes in domain order. Sorted by decreasing size, then by the domain positions of
        the attributes, so every parent precedes its children.
    edges : tuple of (int, int)
        ``(p, t)`` region indices of every edge ``p → t`` (``regions[t] ⊂ regions[p]``), sorted.
    parents, children : tuple of tuple of int
        Region indices of each region's parents and children under :attr:`edges`.
    parent_edges, child_edges : tuple of tuple of int
        Edge indices ``e`` with ``edges[e][1] == t`` (resp. ``edges[e][0] == p``).
    ancestors : tuple of tuple of int
        Ancestors of each region in the unpruned graph (for the saturated graph: every region
        that strictly contains it).
    kappa : tuple of float
        The counting numbers ``κ_r`` used by Convex-GBP (Problem 3; Algorithm 2's input).
    moebius : tuple of float
        The Möbius (Kikuchi; Bethe on factor graphs) counting numbers
        ``c_r = 1 − Σ_{a∈anc(r)} c_a``, whatever :attr:`kappa` is.
    clique_region : tuple of int
        Index of the region equal (as a set) to each network clique, in the network's order.
    colors : tuple of tuple of int
        A partition of the regions that have parents into groups whose blocks
        ``{t} ∪ P(t)`` are pairwise disjoint (the sequential schedule's stages).
    uncovered : tuple of str
        Domain attributes in no clique (independent and uniform under ``p_θ``).
    """

    network: MarkovNetwork
    kind: str
    minimal: bool
    regions: tuple[Clique, ...]
    edges: tuple[tuple[int, int], ...]
    parents: tuple[tuple[int, ...], ...]
    children: tuple[tuple[int, ...], ...]
    parent_edges: tuple[tuple[int, ...], ...]
    child_edges: tuple[tuple[int, ...], ...]
    ancestors: tuple[tuple[int, ...], ...]
    kappa: tuple[float, ...]
    moebius: tuple[float, ...]
    clique_region: tuple[int, ...]
    colors: tuple[tuple[int, ...], ...]
    uncovered: tuple[str, ...]

    # -- identity ------------------------------------------------------------------------------
    @property
    def key(self) -> tuple[Any, ...]:
        """The construction key that determines the graph."""
        return (self.network, self.kind, self.minimal, self.kappa)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RegionGraph):
            return NotImplemented
        return self is other or self.key == other.key

    def __repr__(self) -> str:
        return (
            f"RegionGraph(kind={self.kind!r}, regions={len(self.regions)}, "
            f"edges={len(self.edges)}, colors={self.num_colors})"
        )

    # -- derived structure ---------------------------------------------------------------------
    @property
    def domain(self) -> Domain:
        return self.network.domain

    @property
    def num_colors(self) -> int:
        """Number of stages of the sequential schedule (``K`` in the damping bound)."""
        return len(self.colors)

    @property
    def convex(self) -> bool:
        """True when every counting number is positive (``F_κ`` strictly convex on ``L(G)``)."""
        return all(k > 0 for k in self.kappa)

    @functools.cached_property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Table shape of every region."""
        return tuple(self.domain.shape_of(r) for r in self.regions)

    @functools.cached_property
    def num_cells(self) -> int:
        """Total number of cells of all region tables."""
        return sum(math.prod(s) for s in self.shapes)

    @functools.cached_property
    def _index(self) -> dict[frozenset[str], int]:
        return {frozenset(r): i for i, r in enumerate(self.regions)}

    def region_index(self, attrs: Iterable[str]) -> int:
        """Index of the region whose attribute set is ``attrs`` (any order)."""
        try:
            return self._index[frozenset(attrs)]
        except KeyError:
            raise KeyError(f"{tuple(attrs)} is not a region of {self!r}") from None

    def containing(self, attrs: Iterable[str]) -> int | None:
        """Index of the smallest region that contains ``attrs`` (``None`` if none does)."""
        s = set(attrs)
        best = [i for i, r in enumerate(self.regions) if s <= set(r)]
        return min(best, key=lambda i: (math.prod(self.shapes[i]), i)) if best else None

    @functools.cached_property
    def cell_order(self) -> tuple[int, ...]:
        """Order of the regions' tables in the flat cell vector (by neighbour count bucket)."""
        deg = [len(self.children[r]) + len(self.parents[r]) for r in range(len(self.regions))]
        return tuple(sorted(range(len(self.regions)), key=lambda r: (_bucket(deg[r]), r)))

    @functools.cached_property
    def region_offsets(self) -> tuple[int, ...]:
        """Start of each region's table in the flat cell vector, for every region."""
        out, pos = [0] * len(self.regions), 0
        for r in self.cell_order:
            out[r] = pos
            pos += math.prod(self.shapes[r])
        return tuple(out)

    @functools.cached_property
    def stage_edges(self) -> tuple[tuple[int, ...], ...]:
        """Edges of each colour's blocks (the stages of the sequential schedule), sorted."""
        return tuple(
            tuple(sorted(e for t in group for e in self.parent_edges[t])) for group in self.colors
        )

    @functools.cached_property
    def edge_order(self) -> tuple[int, ...]:
        """Order of the edges' messages in :attr:`GBPState.messages` (by projection fan-in)."""
        def fan(e: int) -> int:
            p, t = self.edges[e]
            return math.prod(self.shapes[p]) // math.prod(self.shapes[t])
        return tuple(sorted(range(len(self.edges)), key=lambda e: (_bucket(fan(e)), e)))

    @functools.cached_property
    def message_offsets(self) -> tuple[int, ...]:
        """Start of edge ``e``'s message in :attr:`GBPState.messages`, for every edge ``e``."""
        out = [0] * len(self.edges)
        pos = 0
        for e in self.edge_order:
            out[e] = pos
            pos += math.prod(self.shapes[self.edges[e][1]])
        return tuple(out)

    @functools.cached_property
    def num_message_cells(self) -> int:
        """Length of the flat message vector."""
        return sum(math.prod(self.shapes[t]) for _, t in self.edges)

    @functools.cached_property
    def edge_weights(self) -> tuple[float, ...]:
        """``κ_{p,t} = κ_p / (κ_t + Σ_{p'∈P(t)} κ_{p'})`` of each edge (Algorithm 2)."""
        k = self.kappa
        return tuple(
            k[p] / (k[t] + sum(k[q] for q in self.parents[t])) for p, t in self.edges
        )

    @functools.cached_property
    def log_uncovered(self) -> float:
        """``Σ log k_a`` over attributes in no clique (their contribution to ``log Z``)."""
        return float(sum(math.log(self.domain[a]) for a in self.uncovered))

    def ancestor_pairs(self) -> tuple[tuple[int, int], ...]:
        """Every pair ``(a, r)`` with ``a`` an ancestor of ``r`` (all implied constraints)."""
        return tuple(sorted((a, r) for r in range(len(self.regions)) for a in self.ancestors[r]))


def _sort_key(domain: Domain) -> Any:
    return lambda r: (-len(r), [domain.index(a) for a in r])


def _closure(sets: Iterable[frozenset[str]]) -> set[frozenset[str]]:
    """Close a family of sets under non-empty pairwise intersection."""
    regions = set(sets)
    frontier = set(regions)
    while frontier:
        new: set[frozenset[str]] = set()
        for a in frontier:
            for b in regions:
                z = a & b
                if z and z not in regions:
                    new.add(z)
        regions |= new
        frontier = new
    return regions


def _hasse_parents(regions: Sequence[frozenset[str]]) -> list[list[int]]:
    """Parents of each region in the Hasse diagram of ``⊂`` (no region strictly between)."""
    holders: dict[str, set[int]] = {}
    for i, r in enumerate(regions):
        for a in r:
            holders.setdefault(a, set()).add(i)
    out = []
    for i, r in enumerate(regions):
        sup = set.intersection(*(holders[a] for a in r)) - {i}
        sup = {j for j in sup if regions[j] != r}
        out.append(sorted(j for j in sup if not any(regions[k] < regions[j] for k in sup)))
    return out


def _ancestors(parents: Sequence[Sequence[int]]) -> list[list[int]]:
    """Transitive closure of the parent relation (regions sorted parents-first)."""
    anc: list[set[int]] = []
    for i, ps in enumerate(parents):
        s: set[int] = set()
        for p in ps:
            if p >= i:  # pragma: no cover - the sort order guarantees parents come first
                raise RuntimeError("region order is not topological")
            s.add(p)
            s |= anc[p]
        anc.append(s)
    return [sorted(s) for s in anc]


def _minimal_parents(
    parents: Sequence[Sequence[int]], ancestors: Sequence[Sequence[int]]
) -> list[list[int]]:
    """Drop edges whose constraints are implied through a common ancestor.

    For each region, its parents are merged into classes whenever two of them share an ancestor
    (union–find); one edge per class is kept, from the class member with the smallest index. If
    parents ``u, v`` share an ancestor ``a`` then ``P_{u→t}τ_u = P_{a→t}τ_a = P_{v→t}τ_v`` on
    ``L(G)``, so by induction down the graph the pruned local polytope equals the unpruned one.
    """
    out = []
    for ps in parents:
        root = {p: p for p in ps}
        for i, u in enumerate(ps):
            for v in ps[i + 1:]:
                if set(ancestors[u]) & set(ancestors[v]):
                    ru, rv = _find(root, u), _find(root, v)
                    if ru != rv:
                        root[max(ru, rv)] = min(ru, rv)
        out.append(sorted({_find(root, p) for p in ps}))
    return out


def _find(root: dict[int, int], x: int) -> int:
    """Union–find representative of ``x`` (with path halving)."""
    while root[x] != x:
        root[x] = root[root[x]]
        x = root[x]
    return x


def _moebius(ancestors: Sequence[Sequence[int]]) -> list[float]:
    """Möbius counting numbers ``c_r = 1 − Σ_{a∈anc(r)} c_a`` (regions sorted parents-first)."""
    c: list[float] = []
    for anc in ancestors:
        c.append(1.0 - sum(c[a] for a in anc))
    return c


def _colors(
    num_regions: int, parents: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """Greedy colouring of the blocks ``{t} ∪ P(t)`` (regions with parents) by disjointness."""
    groups: list[list[int]] = []
    used: list[set[int]] = []
    for t in range(num_regions):
        if not parents[t]:
            continue
        touched = {t, *parents[t]}
        for g, u in zip(groups, used, strict=True):
            if not (u & touched):
                g.append(t)
                u |= touched
                break
        else:
            groups.append([t])
            used.append(set(touched))
    return tuple(tuple(g) for g in groups)


def _resolve_counting(
    counting: str | Sequence[float] | Mapping[Any, float],
    regions: Sequence[Clique],
    moebius: Sequence[float],
) -> tuple[float, ...]:
    if isinstance(counting, str):
        if counting == "convex":
            return tuple(1.0 for _ in regions)
        if counting in ("kikuchi", "bethe", "moebius"):
            return tuple(float(c) for c in moebius)
        raise ValueError(
            f"unknown counting numbers {counting!r}; use 'convex', 'kikuchi' (alias 'bethe') "
            "or one number per region"
        )
    if isinstance(counting, Mapping):
        by_set = {frozenset(k if not isinstance(k, str) else (k,)): float(v)
                  for k, v in counting.items()}
        missing = [r for r in regions if frozenset(r) not in by_set]
        if missing:
            raise ValueError(f"counting numbers are missing for region(s) {missing}")
        extra = set(by_set) - {frozenset(r) for r in regions}
        if extra:
            raise ValueError(
                f"counting numbers given for non-region(s) {sorted(map(sorted, extra))}"
            )
        return tuple(by_set[frozenset(r)] for r in regions)
    values = tuple(float(v) for v in counting)
    if len(values) != len(regions):
        raise ValueError(
            f"{len(values)} counting numbers for {len(regions)} regions; "
            f"regions are {list(regions)}"
        )
    return values


def _check_counting(
    kappa: Sequence[float],
    regions: Sequence[Clique],
    parents: Sequence[Sequence[int]],
    children: Sequence[Sequence[int]],
) -> None:
    """Check the conditions under which Algorithm 2's updates are defined.

    ``κ_r > 0`` for every region with children or without parents (its messages and belief
    divide by ``κ_r``) and ``κ_t + Σ_{p∈P(t)} κ_p > 0`` for every region with parents (the
    denominator of ``κ_{p,t}``), as in Hazan & Shashua's norm-product belief propagation.
    Regions with parents and no children may have ``κ_r ≤ 0`` (e.g. the Bethe numbers of a
    factor graph's single-attribute regions).
    """
    if any(not math.isfinite(k) for k in kappa):
        raise ValueError("counting numbers must be finite")
    bad_outer = [regions[r] for r in range(len(regions))
                 if (children[r] or not parents[r]) and kappa[r] <= 0]
    bad_sum = [regions[t] for t in range(len(regions))
               if parents[t] and kappa[t] + sum(kappa[p] for p in parents[t]) <= 0]
    if bad_outer or bad_sum:
        parts = []
        if bad_outer:
            parts.append(f"κ_r ≤ 0 at region(s) with children or without parents {bad_outer}")
        if bad_sum:
            parts.append(f"κ_t + Σ_parents κ_p ≤ 0 at region(s) {bad_sum}")
        raise ValueError(
            "Convex-GBP (Algorithm 2) needs κ_r > 0 on every region with children or without "
            "parents and κ_t + Σ_parents κ_p > 0 on every region with parents; "
            + "; ".join(parts)
            + ". Use counting='convex', or the Kikuchi numbers on a factor graph."
        )


@functools.lru_cache(maxsize=256)
def _build(
    network: MarkovNetwork, kind: str, minimal: bool, counting: Any
) -> RegionGraph:
    domain = network.domain
    key = _sort_key(domain)
    clique_sets = [frozenset(c) for c in network.cliques]
    covered = set().union(*clique_sets) if clique_sets else set()
    if kind == "factor":
        sets = set(clique_sets) | {frozenset((a,)) for a in covered}
        regions = sorted((domain.sorted(s) for s in sets), key=key)
        index = {frozenset(r): i for i, r in enumerate(regions)}
        full_parents: list[list[int]] = [[] for _ in regions]
        for s in set(clique_sets):
            if len(s) >= 2:
                for a in s:
                    full_parents[index[frozenset((a,))]].append(index[s])
        full_parents = [sorted(ps) for ps in full_parents]
        parents = full_parents
    elif kind == "saturated":
        regions = sorted((domain.sorted(s) for s in _closure(clique_sets)), key=key)
        index = {frozenset(r): i for i, r in enumerate(regions)}
        full_parents = _hasse_parents([frozenset(r) for r in regions])
        parents = full_parents
    else:
        raise ValueError(f"unknown region graph kind {kind!r}; use one of {KINDS}")
    ancestors = _ancestors(full_parents)
    if minimal and kind == "saturated":
        parents = _minimal_parents(full_parents, ancestors)
    edges = sorted((p, t) for t, ps in enumerate(parents) for p in ps)
    n = len(regions)
    children: list[list[int]] = [[] for _ in range(n)]
    parent_edges: list[list[int]] = [[] for _ in range(n)]
    child_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (p, t) in enumerate(edges):  # edges sorted by (p, t): lists come out sorted
        children[p].append(t)
        child_edges[p].append(e)
        parent_edges[t].append(e)
    moebius = _moebius(ancestors)
    kappa = _resolve_counting(counting, regions, moebius)
    _check_counting(kappa, regions, parents, children)
    return RegionGraph(
        network=network,
        kind=kind,
        minimal=bool(minimal and kind == "saturated"),
        regions=tuple(regions),
        edges=tuple(edges),
        parents=tuple(tuple(p) for p in parents),
        children=tuple(tuple(c) for c in children),
        parent_edges=tuple(tuple(e) for e in parent_edges),
        child_edges=tuple(tuple(e) for e in child_edges),
        ancestors=tuple(tuple(a) for a in ancestors),
        kappa=kappa,
        moebius=tuple(moebius),
        clique_region=tuple(index[s] for s in clique_sets),
        colors=_colors(n, parents),
        uncovered=tuple(a for a in domain.attrs if a not in covered),
    )


def build_region_graph(
    network: MarkovNetwork,
    kind: str = "saturated",
    counting: str | Sequence[float] | Mapping[Any, float] = "convex",
    minimal: bool = True,
) -> RegionGraph:
    """Build (once, then from a cache) the region graph of ``network``'s cliques.

    Parameters
    ----------
    network : MarkovNetwork
    kind : {"saturated", "factor"}
        ``"saturated"``: the cliques closed under intersection with Hasse-diagram edges
        (Figure 1(c) of seed 003). ``"factor"``: the cliques plus single-attribute regions
        (Figure 1(b)).
    counting : "convex", "kikuchi" (alias "bethe"), or one number per region
        Counting numbers ``κ`` of the free energy (Problem 3): ``κ_r = 1`` for every region
        (the convex choice of seed 003's Prox-PGM), the Möbius numbers
        ``c_r = 1 − Σ_{a∈anc(r)} c_a``, or explicit values (a sequence in region order, or a
        mapping region -> value).
    minimal : bool
        Prune the saturated graph's redundant edges (parents sharing an ancestor); the local
        polytope (Eq. (2)) is unchanged and message passing is cheaper. Ignored for factor
        graphs, which have no redundant edges.

    Returns
    -------
    RegionGraph

    Raises
    ------
    TypeError
        if ``network`` is not a :class:`MarkovNetwork`.
    ValueError
        on an unknown kind or counting scheme, a wrong number of counting numbers, or counting
        numbers for which Algorithm 2 is undefined (see :class:`RegionGraph`).
    """
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown region graph kind {kind!r}; use one of {KINDS}")
    if isinstance(counting, Mapping):
        regions = _build(network, kind, bool(minimal), "convex").regions
        counting = _resolve_counting(counting, regions, ())
    elif not isinstance(counting, str):
        counting = tuple(float(v) for v in counting)
    return _build(network, kind, bool(minimal), counting)


# ------------------------------------------------------------------------------------------------
# Flat layout: every region table and every message lives in one vector
# ------------------------------------------------------------------------------------------------
# Region ``r``'s table (C order over its attributes in domain order) occupies cells
# ``region_offsets[r] : region_offsets[r] + size_r`` of a vector of length ``num_cells``; the
# message of edge ``e = (p, t)`` (a table over ``t``) occupies ``message_offsets[e] : ... + size_t``
# of the message vector. Every sum over neighbours and every projection is a dense reduction of a
# gathered index matrix padded with a neutral element. For the two big reductions (ψ and the
# projections' log-sum-exps) rows are ordered so that rows of similar width are contiguous
# ("buckets", each padded to its largest width), so each reduction is one gather per bucket and no
# scatter or permutation is needed. A sweep is therefore a small, fixed number of array operations
# whatever the graph: XLA's compile time does not grow with the number of regions.


class _Plan(NamedTuple):
    """A bucketed reduction over contiguous rows: ``out = concat_b(reduce(x[index[b]]))``.

    ``index[b]`` is the ``(n_b, w_b)`` index matrix of bucket ``b`` (padding points past the
    end of ``x``, where a neutral element is appended); ``sign[b]`` (sums only) multiplies the
    entries; ``scale[b]`` (log-sum-exp only) holds per-row counting numbers ``κ`` for
    ``κ log Σ exp(·/κ)``.
    """

    index: tuple[Array, ...]
    sign: tuple[Array, ...]
    scale: tuple[Array, ...]


class _Layout(NamedTuple):
    """Device-resident index arrays of a region graph (see :func:`_host_layout`)."""

    theta_src: Array
    param_dst: Array
    psi: _Plan
    fan: _Plan
    par: _Plan
    region: _Plan
    child: Array
    weight: Array
    first: Array
    msg_stage: Array
    cell_region: Array
    cell_kappa: Array
    cell_denom: Array
    cell_msg: Array
    region_kappa: Array


def _projection_index(domain: Domain, parent: Clique, child: Clique) -> np.ndarray:
    """For each cell of ``parent``'s table (C order), the cell of ``child``'s table it sums into."""
    shape = domain.shape_of(parent)
    coords = np.indices(shape).reshape(len(shape), -1)
    rows = [parent.index(a) for a in child]
    return np.ravel_multi_index(tuple(coords[rows]), domain.shape_of(child))


def _bucket(width: int) -> int:
    """Bucket of a row width: widths within a factor of two share a bucket."""
    return 0 if width == 0 else int(width - 1).bit_length() + 1


def _pad_rows(blocks: Sequence[np.ndarray], fill: float) -> np.ndarray:
    """Stack row blocks ``(n_j, w_j)`` into one ``(Σ n_j, max w_j)`` matrix padded with ``fill``."""
    width = max((b.shape[1] for b in blocks), default=0)
    out = [np.pad(b, ((0, 0), (0, width - b.shape[1])), constant_values=fill) for b in blocks]
    return np.concatenate(out) if out else np.zeros((0, 0))


#: Padding budget: adjacent width buckets are merged while the merged index matrix stays below
#: this many entries or below ``_PAD_RATIO`` times the entries of the separate ones. Small graphs
#: thus get one gather per reduction (fast to compile); large ones avoid padding waste.
_PAD_ENTRIES = 1 << 16
_PAD_RATIO = 1.5


def _plan(
    blocks: Sequence[np.ndarray],
    pad: int,
    signs: Sequence[np.ndarray] | None = None,
    scales: Sequence[np.ndarray] | None = None,
) -> dict[str, Any]:
    """Group consecutive row blocks of similar width into padded index matrices.

    ``blocks`` must already be ordered by width bucket (the layout orders rows that way).
    """
    runs: list[list[int]] = []
    for j, blk in enumerate(blocks):
        if runs and _bucket(blocks[runs[-1][0]].shape[1]) == _bucket(blk.shape[1]):
            runs[-1].append(j)
        else:
            runs.append([j])

    def padded(run: list[int]) -> int:
        return sum(blocks[j].shape[0] for j in run) * max(blocks[j].shape[1] for j in run)

    merged: list[list[int]] = []
    for run in runs:
        if merged:
            joint = padded(merged[-1] + run)
            if joint <= _PAD_ENTRIES or joint <= _PAD_RATIO * (padded(merged[-1]) + padded(run)):
                merged[-1] = merged[-1] + run
                continue
        merged.append(run)
    index, sign, scale = [], [], []
    for run in merged:
        index.append(_pad_rows([blocks[j] for j in run], pad).astype(np.int32))
        if signs is not None:
            sign.append(_pad_rows([signs[j] for j in run], 0.0).astype(np.float64))
        if scales is not None:
            scale.append(np.concatenate([scales[j] for j in run]).astype(np.float64))
    return dict(index=tuple(index), sign=tuple(sign), scale=tuple(scale))


@functools.lru_cache(maxsize=64)
def _host_layout(rg: RegionGraph) -> dict[str, Any]:
    """Index arrays of ``rg`` in numpy (built once per region graph)."""
    net, domain = rg.network, rg.domain
    n_regions = len(rg.regions)
    sizes = [math.prod(s) for s in rg.shapes]
    cell_off, msg_off = rg.region_offsets, rg.message_offsets
    num_cells, num_msg = rg.num_cells, rg.num_message_cells
    # -- potentials in and marginals out
    theta_src = np.full(num_cells, net.num_params, dtype=np.int64)
    param_dst = np.zeros(net.num_params, dtype=np.int64)
    for c, off, i in zip(net.cliques, net.offsets, rg.clique_region, strict=True):
        region = rg.regions[i]
        shape = domain.shape_of(region)
        coords = np.indices(shape).reshape(len(shape), -1)
        params = off + np.ravel_multi_index(tuple(coords[[region.index(a) for a in c]]),
                                            domain.shape_of(c))
        cells = cell_off[i] + np.arange(sizes[i])
        theta_src[cells] = params
        param_dst[params] = cells
    # -- ψ_r = θ_r + Σ_children λ − Σ_parents λ, rows = region cells in layout order
    psi_idx, psi_sign = [], []
    cell_msg = np.zeros(num_cells, dtype=np.int64)
    for r in rg.cell_order:
        cols = [msg_off[e] + _projection_index(domain, rg.regions[r], rg.regions[rg.edges[e][1]])
                for e in rg.child_edges[r]]
        cols += [msg_off[e] + np.arange(sizes[r]) for e in rg.parent_edges[r]]
        sign = [1.0] * len(rg.child_edges[r]) + [-1.0] * len(rg.parent_edges[r])
        mat = np.stack(cols, axis=1) if cols else np.zeros((sizes[r], 0), np.int64)
        psi_idx.append(mat)
        psi_sign.append(np.broadcast_to(np.asarray(sign), mat.shape))
        if rg.parent_edges[r]:
            cell_msg[cell_off[r]:cell_off[r] + sizes[r]] = (
                msg_off[rg.parent_edges[r][0]] + np.arange(sizes[r]))
    # -- per message cell of edge (p, t): the fan of p's cells, the siblings over P(t), ...
    fan, fan_scale, par, child, weight, first, stage = [], [], [], [], [], [], []
    stage_of = {e: k for k, edges in enumerate(rg.stage_edges) for e in edges}
    for e in rg.edge_order:
        p, t = rg.edges[e]
        n_t = sizes[t]
        proj = _projection_index(domain, rg.regions[p], rg.regions[t])
        fan.append(np.argsort(proj, kind="stable").reshape(n_t, -1) + cell_off[p])
        fan_scale.append(np.full(n_t, rg.kappa[p]))
        par.append(np.stack([msg_off[f] + np.arange(n_t) for f in rg.parent_edges[t]], axis=1))
        child.append(cell_off[t] + np.arange(n_t))
        weight.append(np.full(n_t, rg.edge_weights[e]))
        first.append(np.full(n_t, msg_off[e]))
        stage.append(np.full(n_t, stage_of[e]))

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    region_cells = [np.arange(cell_off[r], cell_off[r] + sizes[r])[None, :]
                    for r in range(n_regions)]
    denom = [rg.kappa[t] + sum(rg.kappa[p] for p in rg.parents[t]) if rg.parents[t] else 1.0
             for t in range(n_regions)]
    cell_region = np.zeros(num_cells, dtype=np.int64)
    for r in range(n_regions):
        cell_region[cell_off[r]:cell_off[r] + sizes[r]] = r
    kappa = np.asarray(rg.kappa, dtype=np.float64)
    return dict(
        theta_src=theta_src.astype(np.int32), param_dst=param_dst.astype(np.int32),
        psi=_plan(psi_idx, num_msg, signs=psi_sign),
        fan=_plan(fan, num_cells, scales=fan_scale),
        par=dict(index=(_pad_rows(par, num_msg).astype(np.int32),), sign=(), scale=()),
        region=dict(index=(_pad_rows(region_cells, num_cells).astype(np.int32),), sign=(),
                    scale=()),
        child=cat(child, np.int32), weight=cat(weight, np.float64), first=cat(first, np.int32),
        msg_stage=cat(stage, np.int32), cell_region=cell_region.astype(np.int32),
        cell_kappa=kappa[cell_region], cell_denom=np.asarray(denom)[cell_region],
        cell_msg=cell_msg.astype(np.int32), region_kappa=kappa,
    )


@functools.lru_cache(maxsize=64)
def _layout(rg: RegionGraph, x64: bool) -> _Layout:
    """Device copies of :func:`_host_layout` (cached per precision mode)."""
    host = _host_layout(rg)

    def dev(x: Any) -> Any:
        if isinstance(x, dict):
            return _Plan(**{k: dev(v) for k, v in x.items()})
        if isinstance(x, tuple):
            return tuple(dev(v) for v in x)
        return jnp.asarray(x)

    # concrete device arrays even when first requested inside a trace (they are cached)
    with jax.ensure_compile_time_eval():
        return _Layout(**{k: dev(v) for k, v in host.items()})


def _device_layout(rg: RegionGraph) -> _Layout:
    return _layout(rg, bool(jax.config.jax_enable_x64))


# ------------------------------------------------------------------------------------------------
# Message passing (pure JAX)
# ------------------------------------------------------------------------------------------------
class GBPState(NamedTuple):
    """Warm-startable state of Convex-GBP.

    Attributes
    ----------
    messages : array of shape ``(rg.num_message_cells,)``
        The dual variables ``λ_{t→p}`` of every edge ``e = (p, t)`` of
        :attr:`RegionGraph.edges`, concatenated: edge ``e``'s log-table over region ``t`` (C order,
        attributes in domain order) starts at ``rg.message_offsets[e]``; each is shifted so that
        its first cell is 0 (the dual is invariant to such shifts).
    iterations : int array
        Sweeps run so far (over every call that threaded this state).
    residual : float array
        Largest absolute change of a message in the last sweep (``inf`` before the first).
    """

    messages: Array
    iterations: Array
    residual: Array


def init_state(rg: RegionGraph, dtype: Any = None) -> GBPState:
    """All-zero messages (uniform in log space), Algorithm 2's initialisation."""
    dtype = jnp.zeros(()).dtype if dtype is None else dtype
    return GBPState(
        jnp.zeros(rg.num_message_cells, dtype=dtype),
        jnp.zeros((), dtype=jnp.int32),
        jnp.full((), jnp.inf, dtype=dtype),
    )


def _take(x: Array, index: Array) -> Array:
    """``x[index]`` for indices known to be in bounds (no wrap-around handling)."""
    return x.at[index].get(mode="promise_in_bounds")


def _reduce_sum(x: Array, plan: _Plan) -> Array:
    """``out_i = Σ_j sign_ij x[index_ij]`` over the plan's rows (padding adds 0)."""
    x = jnp.concatenate([x, jnp.zeros(1, x.dtype)])
    outs = []
    for b, index in enumerate(plan.index):
        if index.shape[0] == 0 or index.shape[1] == 0:
            outs.append(jnp.zeros(index.shape[0], x.dtype))
            continue
        vals = _take(x, index)
        if plan.sign:
            vals = vals * plan.sign[b].astype(x.dtype)
        outs.append(jnp.sum(vals, axis=1))
    return _concat(outs, x.dtype)


def _concat(outs: list[Array], dtype: Any) -> Array:
    if not outs:
        return jnp.zeros(0, dtype)
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _lse_rows(vals: Array) -> Array:
    """Row-wise log-sum-exp of a matrix (rows of ``-inf`` give ``-inf``)."""
    top = jnp.max(vals, axis=1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return jnp.log(jnp.sum(jnp.exp(vals - top[:, None]), axis=1)) + top


def _reduce_logsumexp(x: Array, plan: _Plan, scaled: bool = False) -> Array:
    """``out_i = log Σ_j exp(x[index_ij])`` (``κ_i log Σ_j exp(x[index_ij]/κ_i)`` if scaled)."""
    x = jnp.concatenate([x, jnp.full(1, -jnp.inf, x.dtype)])
    outs = []
    for b, index in enumerate(plan.index):
        if index.shape[0] == 0 or index.shape[1] == 0:  # no rows, or empty sums
            outs.append(jnp.full(index.shape[0], -jnp.inf, x.dtype))
            continue
        vals = _take(x, index)
        if scaled:
            k = plan.scale[b].astype(x.dtype)
            outs.append(k * _lse_rows(vals / k[:, None]))
        else:
            outs.append(_lse_rows(vals))
    return _concat(outs, x.dtype)


def _theta_cells(rg: RegionGraph, lay: _Layout, log_potentials: Array | CliqueTables) -> Array:
    """Region log-potentials as one vector: each clique's table in its region, 0 elsewhere."""
    net = rg.network
    if isinstance(log_potentials, CliqueTables):
        theta = net.flatten(log_potentials)
    else:
        theta = jnp.asarray(log_potentials)
    if theta.shape != (net.num_params,):
        raise ValueError(
            f"log-potentials have shape {theta.shape}; the network expects "
            f"({net.num_params},). Use jax.vmap for a batch of parameter vectors."
        )
    if not jnp.issubdtype(theta.dtype, jnp.floating):
        theta = theta.astype(jnp.zeros(()).dtype)
    return _take(jnp.concatenate([theta, jnp.zeros(1, theta.dtype)]), lay.theta_src)


def _psi(lay: _Layout, theta: Array, lam: Array) -> Array:
    """Reparameterised potentials ``ψ_r = θ_r + Σ_{t∈Ch(r)} λ_{t→r} − Σ_{p∈P(r)} λ_{r→p}``."""
    return theta + _reduce_sum(lam, lay.psi)


def _targets(rg: RegionGraph, lay: _Layout, theta: Array, lam: Array) -> tuple[Array, Array]:
    """Algorithm 2's update of every message from the messages ``lam`` (exact block minimisers).

    With ``L_{p→t} = κ_p log Σ_{x_p∖x_t} exp(ψ_p/κ_p)``, Algorithm 2's down message is
    ``m_{p→t} = L_{p→t} − λ_{t→p}`` and ``S_t = θ_t + Σ_c λ_{c→t} + Σ_p m_{p→t}
    = ψ_t + Σ_p L_{p→t}``, so the new up message is ``λ_{t→p} + κ_{p,t} S_t − L_{p→t}``.
    Returns the new messages and ``S`` per message cell.
    """
    psi = _psi(lay, theta, lam)
    scaled = any(rg.kappa[p] != 1.0 for p, _ in rg.edges)
    big_l = _reduce_logsumexp(psi, lay.fan, scaled=scaled)
    s = _take(psi, lay.child) + _reduce_sum(big_l, lay.par)
    return lam + lay.weight.astype(psi.dtype) * s - big_l, s


def _sweep(
    rg: RegionGraph, lay: _Layout, theta: Array, lam: Array, damping: Array, parallel: Array
) -> tuple[Array, Array]:
    """One Convex-GBP iteration: every block updated once. Returns messages and max change.

    Sequential schedule: for each colour ``k`` in turn, the blocks of colour ``k`` take their
    exact minimisers given the current messages (the others are recomputed but discarded, so one
    loop body serves every colour). Parallel schedule: one step updates every block.
    """

    def stage(k: Array, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        lam, change = carry
        new = _targets(rg, lay, theta, lam)[0]
        mixed = damping * lam + (1.0 - damping) * new
        mixed = mixed - _take(mixed, lay.first)  # first cell 0: a gauge of the dual
        mixed = jnp.where(parallel | (lay.msg_stage == k), mixed, lam)
        return mixed, jnp.maximum(change, jnp.max(jnp.abs(mixed - lam)))

    stages = jnp.where(parallel, 1, rg.num_colors)
    return jax.lax.fori_loop(0, stages, stage, (lam, jnp.zeros((), theta.dtype)))


def _log_beliefs(
    rg: RegionGraph, lay: _Layout, theta: Array, lam: Array, psi: Array
) -> Array:
    """Normalised log-beliefs of every region cell.

    ``log τ_r = ψ_r/κ_r − log Σ exp(ψ_r/κ_r)`` (the last line of Algorithm 2) where ``κ_r > 0``;
    regions with ``κ_r ≤ 0`` (childless, e.g. Bethe single-attribute regions) take the block
    belief ``S_r / (κ_r + Σ_{p∈P(r)} κ_p)`` (see :func:`_targets`), which equals it at a fixed
    point whenever both are defined.
    """
    kappa = lay.cell_kappa.astype(psi.dtype)
    x = psi if all(k == 1.0 for k in rg.kappa) else psi / jnp.where(kappa > 0, kappa, 1.0)
    if any(k <= 0 for k in rg.kappa):
        s = _targets(rg, lay, theta, lam)[1]
        block = _take(s, lay.cell_msg) / lay.cell_denom.astype(psi.dtype)
        x = jnp.where(kappa > 0, x, block)
    return x - _take(_reduce_logsumexp(x, lay.region), lay.cell_region)


def _dual(rg: RegionGraph, lay: _Layout, psi: Array) -> Array:
    """``g(λ) = Σ_r κ_r log Σ exp(ψ_r/κ_r)`` (``max ψ_r`` where ``κ_r = 0``) plus uncovered."""
    kappa = lay.region_kappa.astype(psi.dtype)
    safe = jnp.where(kappa != 0, kappa, 1.0)
    terms = kappa * _reduce_logsumexp(psi / _take(safe, lay.cell_region), lay.region)
    if any(k == 0 for k in rg.kappa):  # then some region exists, so the plan has rows
        x = jnp.concatenate([psi, jnp.full(1, -jnp.inf, psi.dtype)])
        top = jnp.max(_take(x, lay.region.index[0]), axis=1)
        terms = jnp.where(kappa != 0, terms, top)
    return jnp.sum(terms) + rg.log_uncovered


def _check_state(rg: RegionGraph, state: GBPState) -> None:
    if not isinstance(state, GBPState):
        raise TypeError(f"state must be a GBPState (see init_state), got {type(state).__name__}")
    shape = tuple(np.shape(state.messages))
    if shape != (rg.num_message_cells,):
        raise ValueError(
            f"state messages have shape {shape}; the region graph needs "
            f"({rg.num_message_cells},). Use jax.vmap for a batch of states."
        )


def _run(
    rg: RegionGraph,
    lay: _Layout,
    theta: Array,
    state: GBPState,
    iters: Array,
    damping: Array,
    parallel: Array,
    tol: Array,
) -> GBPState:
    """Sweeps until ``iters`` more have run or the largest message change is ``≤ tol``."""
    dtype = theta.dtype
    start = GBPState(jnp.asarray(state.messages, dtype), jnp.asarray(state.iterations, jnp.int32),
                     jnp.full((), jnp.inf, dtype))
    if rg.num_message_cells == 0:
        return start
    damping = damping.astype(dtype)
    limit = start.iterations + iters

    def cond(s: GBPState) -> Array:
        return (s.iterations < limit) & ~(s.residual <= tol)

    def body(s: GBPState) -> GBPState:
        new, change = _sweep(rg, lay, theta, s.messages, damping, parallel)
        return GBPState(new, s.iterations + 1, change)

    out = jax.lax.while_loop(cond, body, start)
    # no sweep ran: keep the residual the state came with
    return out._replace(residual=jnp.where(out.iterations == start.iterations,
                                           jnp.asarray(state.residual, dtype), out.residual))


def _validate_run_args(iters: int, damping: Any, schedule: str) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative integer, got {iters!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
    if isinstance(damping, (int, float)) and not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping!r}")


def _tables(rg: RegionGraph, flat: Array, regions: bool) -> CliqueTables:
    if not regions:
        return rg.network.unflatten(flat)
    off = rg.region_offsets
    return CliqueTables({
        r: jnp.reshape(flat[off[i]:off[i] + math.prod(rg.shapes[i])], rg.shapes[i])
        for i, r in enumerate(rg.regions)
    })


class _Solved(NamedTuple):
    regions: Array  # beliefs of every region cell (flat layout), scaled to ``total``
    cliques: Array  # the network cliques' tables, flat in the network's parameter layout
    log_z: Array  # the dual value g(λ) (log-partition estimate)
    state: GBPState


@functools.partial(jax.jit, static_argnames=("rg",))
def _solve(
    rg: RegionGraph,
    lay: _Layout,
    log_potentials: Array | CliqueTables,
    state: GBPState,
    iters: Array,
    damping: Array,
    total: Array,
    parallel: Array,
    tol: Array,
) -> _Solved:
    """Sweeps, then beliefs and dual value: the single compiled entry point per region graph."""
    theta = _theta_cells(rg, lay, log_potentials)
    state = _run(rg, lay, theta, state, iters, damping, parallel, tol)
    psi = _psi(lay, theta, state.messages)
    beliefs = total * jnp.exp(_log_beliefs(rg, lay, theta, state.messages, psi))
    return _Solved(beliefs, _take(beliefs, lay.param_dst), _dual(rg, lay, psi), state)


def _call(
    rg: RegionGraph,
    log_potentials: Array | CliqueTables,
    state: GBPState | None,
    iters: int,
    damping: Any,
    total: Any,
    schedule: str,
    tol: Any,
) -> _Solved:
    _prepare(rg, state, iters, damping, schedule)
    dtype = _float_dtype(log_potentials)
    if state is None:
        state = init_state(rg, dtype)
    return _solve(
        rg, _device_layout(rg), log_potentials, state, jnp.asarray(iters, jnp.int32),
        jnp.asarray(damping, dtype), jnp.asarray(total, dtype),
        jnp.asarray(schedule == "parallel"),
        jnp.asarray(-jnp.inf if tol is None else tol, dtype))


def _float_dtype(log_potentials: Array | CliqueTables) -> Any:
    leaves = jax.tree.leaves(log_potentials)
    dtype = jnp.result_type(*leaves) if leaves else jnp.zeros(()).dtype
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.zeros(()).dtype


def _prepare(
    rg: RegionGraph, state: GBPState | None, iters: int, damping: Any, schedule: str
) -> None:
    _validate_run_args(iters, damping, schedule)
    if not isinstance(rg, RegionGraph):
        raise TypeError(
            f"rg must be a RegionGraph (see build_region_graph), got {type(rg).__name__}"
        )
    if state is not None:
        _check_state(rg, state)
    if not jax.config.jax_enable_x64:
        warn_if_float32("Convex-GBP oracle")


def convex_gbp(
    rg: RegionGraph,
    log_potentials: Array | CliqueTables,
    state: GBPState | None = None,
    iters: int = 1000,
    damping: float | Array = 0.5,
    total: float | Array = 1.0,
    schedule: str = "parallel",
    tol: float | Array | None = 1e-10,
    regions: bool = False,
) -> tuple[CliqueTables, GBPState]:
    """Convex generalized belief propagation (Algorithm 2 of seed 003), warm-startable.

    Solves the approximate free-energy minimisation of Problem 3,
    ``min_{τ∈L(G)} −θ^⊤τ − H_κ(τ)``, by block-coordinate descent on its dual (see the module
    docstring), in log space with damping.

    Parameters
    ----------
    rg : RegionGraph
        Static structure and counting numbers (from :func:`build_region_graph`).
    log_potentials : array of shape ``(num_params,)`` or CliqueTables
        ``θ`` in the network's parameter layout (or as tables over its cliques); each clique's
        table is the potential of the region equal to it, other regions have ``θ_r = 0``.
    state : GBPState, optional
        Messages to start from (warm start); :func:`init_state` when ``None``.
    iters : int
        Maximum number of sweeps (each updates every block once); 1 for a warm-started step
        inside mirror descent (seed 003, §6).
    damping : float in [0, 1)
        ``ρ``: each block becomes ``ρ·old + (1 − ρ)·new``. 0.5 is the reference
        implementation's; with the sequential schedule and ``κ > 0`` any value converges and 0
        needs the fewest sweeps.
    total : float
        Beliefs are scaled to sum to ``total`` (1 for probabilities, ``N`` for counts).
    schedule : {"parallel", "sequential"}
        All blocks from the same messages (the reference implementation's Jacobi schedule), or
        colour-by-colour exact block steps (the dual never increases when ``κ > 0``).
    tol : float or None
        Stop once no message changes by more than ``tol`` in a sweep (at least one sweep is run,
        so a converged state is confirmed by one more); ``None`` runs all ``iters`` sweeps.
    regions : bool
        Return the beliefs of every region instead of the network's cliques.

    Returns
    -------
    beliefs : CliqueTables
        Pseudo-marginals ``τ`` of the network's cliques (attributes in the clique's order), or of
        every region (domain order) with ``regions=True``; each sums to ``total``.
    state : GBPState
        The messages after the last sweep, to warm-start the next call.

    Raises
    ------
    TypeError, ValueError
        on a wrong region graph, state, parameter shape, ``iters``, ``damping`` or schedule.
    """
    out = _call(rg, log_potentials, state, iters, damping, total, schedule, tol)
    return _tables(rg, out.regions if regions else out.cliques, regions), out.state


def region_beliefs(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState,
    total: float | Array = 1.0,
) -> CliqueTables:
    """Beliefs ``τ_r`` of every region for the given messages (no message update)."""
    _check_state(rg, state)
    out = _call(rg, log_potentials, state, 0, 0.5, total, "sequential", None)
    return _tables(rg, out.regions, True)


def dual_objective(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState
) -> Array:
    """The objective Convex-GBP minimises: the dual ``g(λ)`` of Problem 3 (module docstring).

    With ``κ > 0`` it is convex in the messages, never increases under the sequential schedule,
    and is at every iterate an upper bound of ``max_{τ∈L(G)} θ^⊤τ + H_κ(τ)``, reached at
    convergence. ``Σ_{uncovered} log k_a`` is included, so it estimates ``log Z``.
    """
    _check_state(rg, state)
    return _call(rg, log_potentials, state, 0, 0.5, 1.0, "sequential", None).log_z


def log_partition(
    rg: RegionGraph, log_potentials: Array | CliqueTables, state: GBPState
) -> Array:
    """Estimate of ``log Z = A(θ)`` from the messages: the dual value :func:`dual_objective`.

    At a fixed point it equals ``−F_κ(τ)`` (Problem 3's optimal value, negated). With the
    Möbius numbers on a tree-structured region graph that is the exact ``log Z``; with
    ``κ ≡ 1`` it is an upper bound of ``log Z``.
    """
    return dual_objective(rg, log_potentials, state)


def free_energy(
    rg: RegionGraph, log_potentials: Array | CliqueTables, beliefs: CliqueTables
) -> Array:
    """Approximate free energy ``F_κ(τ) = −θ^⊤τ − Σ_r κ_r H(τ_r)`` of Problem 3.

    Parameters
    ----------
    beliefs : CliqueTables
        A table over every region (as returned with ``regions=True``), each summing to 1.

    Returns
    -------
    scalar
        ``F_κ(τ) − Σ_{uncovered} log k_a``, so that ``−F`` estimates ``log Z``. With the Möbius
        numbers this is the Kikuchi (Bethe on factor graphs) free energy.
    """
    lay = _device_layout(rg)
    theta = _theta_cells(rg, lay, log_potentials)
    missing = [r for r in rg.regions if r not in beliefs]
    if missing:
        raise KeyError(f"beliefs are missing region(s) {missing}; pass regions=True output")
    tau = jnp.concatenate([jnp.ravel(beliefs[rg.regions[r]]) for r in rg.cell_order])
    safe = jnp.where(tau > 0, tau, 1.0)
    plogp = jnp.where(tau > 0, tau * jnp.log(safe), 0.0)
    kappa = lay.cell_kappa.astype(theta.dtype)
    return -jnp.dot(theta, tau) + jnp.dot(kappa, plogp) - rg.log_uncovered


def local_inconsistency(
    rg: RegionGraph, beliefs: CliqueTables, pairs: Sequence[tuple[int, int]] | None = None
) -> Array:
    """Largest ``‖P_{p→t}τ_p − τ_t‖_∞`` over the edges (Eq. (2)'s consistency constraints).

    Parameters
    ----------
    beliefs : CliqueTables
        Tables over every region (``regions=True`` output or :func:`region_beliefs`).
    pairs : sequence of (int, int), optional
        ``(p, t)`` region pairs to check; :attr:`RegionGraph.edges` by default, and
        :meth:`RegionGraph.ancestor_pairs` checks every ancestor–descendant pair.
    """
    pairs = rg.edges if pairs is None else pairs
    worst = jnp.zeros(())
    for p, t in pairs:
        rp, rt = rg.regions[p], rg.regions[t]
        keep = set(rt)
        axes = tuple(k for k, a in enumerate(rp) if a not in keep)
        proj = jnp.sum(beliefs[rp], axis=axes) if axes else beliefs[rp]
        worst = jnp.maximum(worst, jnp.max(jnp.abs(proj - beliefs[rt])))
    return worst


# ------------------------------------------------------------------------------------------------
# Oracle for Prox-PGM / APPGM
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConvexGBPOracle:
    """Approximate marginal oracle for Prox-PGM (APPGM: seed 003, Algorithm 1 with Algorithm 2).

    ``oracle(theta, state) -> (mu, log_z, state)``: ``theta`` is a flat log-potential vector in
    the network's layout; ``mu`` the pseudo-marginals of every network clique, flat in the same
    layout, each table summing to 1 (``network.unflatten(mu)`` gives them as
    :class:`CliqueTables`); ``log_z`` the estimate :func:`log_partition`; ``state`` the messages
    to warm-start the next call with. Pure and ``jit``-able; the oracle is hashable, so it can be
    static data of a jitted loop. By Theorem 2 of seed 003, mirror descent with this oracle
    solves the relaxed problem over the local polytope (Problem 2).

    Parameters
    ----------
    network : MarkovNetwork
    kind : {"saturated", "factor"}
    counting : "convex", "kikuchi", or explicit numbers (see :func:`build_region_graph`)
    iters : int
        Sweeps per call; 1 with warm-started messages is seed 003's practice (§6).
    damping : float
        Message damping (0.5 by default, as in the reference implementation).
    schedule : {"parallel", "sequential"}
        See :func:`convex_gbp`.
    minimal : bool
        Prune redundant edges of the saturated graph.
    """

    network: MarkovNetwork
    kind: str = "saturated"
    counting: Any = "convex"
    iters: int = 1
    damping: float = 0.5
    schedule: str = "parallel"
    minimal: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(self.network).__name__}")
        _validate_run_args(self.iters, self.damping, self.schedule)
        # build now, so construction errors surface here; explicit numbers become hashable
        rg = build_region_graph(self.network, self.kind, self.counting, self.minimal)
        if not isinstance(self.counting, str):
            object.__setattr__(self, "counting", rg.kappa)

    @property
    def region_graph(self) -> RegionGraph:
        """The (cached) region graph the oracle passes messages on."""
        return build_region_graph(self.network, self.kind, self.counting, self.minimal)

    def init_state(self) -> GBPState:
        """Algorithm 2's zero messages."""
        return init_state(self.region_graph)

    def __call__(
        self, theta: Array, state: GBPState | None = None
    ) -> tuple[Array, Array, GBPState]:
        """One oracle call: ``iters`` warm-started sweeps from ``state`` (zero messages if None)."""
        out = _call(self.region_graph, jnp.asarray(theta), state, self.iters, self.damping, 1.0,
                    self.schedule, None)
        return out.cliques, out.log_z, out.state
