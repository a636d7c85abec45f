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
in general and the message passing of :mod:`.gbp` is loopy generalised belief propagation.
Algorithm 2's updates are defined when ``κ_r > 0`` on every region with children and
``κ_t + Σ_{p∈P(t)} κ_p > 0`` on every region with parents (the conditions of norm-product belief
propagation); the Bethe numbers of any factor graph satisfy them, and a saturated graph whose
negative-numbered intersections have children is rejected.

The message passing on a region graph (Convex-GBP) and its marginal oracle are in :mod:`.gbp`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..domain import Clique, Domain
from ..network import MarkovNetwork

__all__ = ["KINDS", "RegionGraph", "build_region_graph"]

KINDS = ("factor", "saturated")


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
        return tuple(sorted(range(len(self.regions)), key=lambda r: (width_bucket(deg[r]), r)))

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
        return tuple(sorted(range(len(self.edges)), key=lambda e: (width_bucket(fan(e)), e)))

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


def width_bucket(width: int) -> int:
    """Bucket of a row width: widths within a factor of two share a bucket."""
    return 0 if width == 0 else int(width - 1).bit_length() + 1


def _sort_key(domain: Domain) -> Any:
    return lambda r: (-len(r), [domain.index(a) for a in r])


def _closure(sets: Iterable[frozenset[str]]) -> set[frozenset[str]]:
    """Close a family of sets under non-empty pairwise intersection.

    Each new set is intersected only with the sets that share an attribute with it (found
    through an index attribute -> sets), not with every set.
    """
    regions: set[frozenset[str]] = set()
    holders: dict[str, set[frozenset[str]]] = {}

    def add(group: Iterable[frozenset[str]]) -> None:
        for r in group:
            regions.add(r)
            for a in r:
                holders.setdefault(a, set()).add(r)

    frontier = set(sets)
    add(frontier)
    while frontier:
        new: set[frozenset[str]] = set()
        for a in frontier:
            for b in set().union(*(holders[x] for x in a)):
                z = a & b
                if z not in regions:
                    new.add(z)
        add(new)
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
