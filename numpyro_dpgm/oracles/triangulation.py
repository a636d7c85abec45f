"""Junction tree structure: triangulation of a network's primal graph and the clique tree.

Construction follows the textbook recipe:

1. the primal graph of the cliques is triangulated by an elimination order (networkx's min-fill
   heuristic as ``method="min_fill"``, or the greedy "smallest new clique" order of Private-PGM
   as ``method="min_size"``);
2. the maximal cliques of the triangulated graph are joined by a maximum-weight spanning tree
   (weight ``|C_i ∩ C_j|``), which has the running-intersection property.

The default, ``method="auto"`` (:data:`DEFAULT_METHOD`), builds both trees and keeps the one
with fewer cells in all (:attr:`JunctionTree.num_cells`; min-fill on a tie). Neither heuristic
is always the cheaper: on Appendix C.4's 32 random pairs of Adult attributes min-fill makes a
clique of 7 attributes (5.9·10⁹ cells) and min-size a tree of 1.4·10⁷ cells.

The structure (:class:`JunctionTree`) is computed once per network and method and cached.
Building a tree (:func:`build_junction_tree`, e.g. to measure its size) is never refused; the
memory cap (:mod:`numpyro_dpgm.oracles.memory`) is applied by the oracle functions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.approximation import treewidth_min_fill_in

from ..domain import Clique, Domain
from ..network import MarkovNetwork

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "JunctionTree",
    "build_junction_tree",
    "check_method",
]

#: Triangulation methods: the cheaper tree of the two heuristics, or one heuristic.
METHODS = ("auto", "min_fill", "min_size")
#: Method of every exact-inference entry point unless one is named.
DEFAULT_METHOD = "auto"

# ------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JunctionTree:
    """Static structure of a junction tree over a domain.

    Attributes
    ----------
    domain : Domain
    cliques : tuple of cliques
        Maximal cliques of the triangulated graph, attributes in domain order. Clique 0 is the
        root.
    parent : tuple of int
        ``parent[i]`` is the index of clique ``i``'s parent (``-1`` for the root).
    order : tuple of int
        A topological order (root first, every parent before its children).
    separators : tuple of cliques
        ``separators[i] = cliques[i] ∩ cliques[parent[i]]`` in domain order (empty for the root
        and between disconnected parts).
    """

    domain: Domain
    cliques: tuple[Clique, ...]
    parent: tuple[int, ...]
    order: tuple[int, ...]
    separators: tuple[Clique, ...]

    @property
    def num_cells(self) -> int:
        """Total number of cells of all clique tables (the memory the oracle needs)."""
        return sum(self.domain.size(c) for c in self.cliques)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.cliques]
        for i in self.order:
            if self.parent[i] >= 0:
                kids[self.parent[i]].append(i)
        return tuple(tuple(k) for k in kids)

    def containing(self, attrs: Clique) -> int | None:
        """Index of the smallest clique that contains ``attrs`` (``None`` if none does)."""
        s = set(attrs)
        best = [i for i, c in enumerate(self.cliques) if s <= set(c)]
        return min(best, key=lambda i: self.domain.size(self.cliques[i])) if best else None

    def covering_subtree(self, attrs: Clique) -> tuple[int, ...]:
        """A smallest connected set of cliques whose union holds ``attrs``, in topological order.

        Starting from the whole tree, leaves are pruned (largest table first) while the
        attributes of ``attrs`` they hold are also held by their one remaining neighbour. The
        first clique of the result is its top (its parent, if any, is outside the subtree);
        every other clique's parent is inside it.

        Parameters
        ----------
        attrs : tuple of str
            Attributes of the domain.

        Returns
        -------
        tuple of int
            Clique indices; a single one when a clique holds all of ``attrs``.
        """
        query = set(attrs)
        nbrs: list[set[int]] = [set() for _ in self.cliques]
        for i, p in enumerate(self.parent):
            if p >= 0:
                nbrs[i].add(p)
                nbrs[p].add(i)
        alive = set(range(len(self.cliques)))
        by_size = sorted(alive, key=lambda i: (-self.domain.size(self.cliques[i]), i))
        changed = True
        while changed and len(alive) > 1:
            changed = False
            for i in by_size:
                if i not in alive or len(alive) == 1:
                    continue
                live = nbrs[i] & alive
                if len(live) == 1 and query & set(self.cliques[i]) <= set(
                    self.cliques[next(iter(live))]
                ):
                    alive.discard(i)
                    changed = True
        return tuple(i for i in self.order if i in alive)

    def new_attributes(self, i: int) -> Clique:
        """Attributes of clique ``i`` not in its separator (all of the root's), in clique order:
        those that clique ``i`` adds when records are generated root first."""
        sep = set(self.separators[i])
        return tuple(a for a in self.cliques[i] if a not in sep)

    def has_running_intersection(self) -> bool:
        """Check that for every attribute the cliques holding it form a connected subtree."""
        g = nx.Graph()
        g.add_nodes_from(range(len(self.cliques)))
        g.add_edges_from((i, p) for i, p in enumerate(self.parent) if p >= 0)
        for a in self.domain.attrs:
            holders = [i for i, c in enumerate(self.cliques) if a in c]
            if holders and not nx.is_connected(g.subgraph(holders)):
                return False
        return True

    # -- helpers for broadcasting sub-tables into a clique --------------------------------------
    def broadcast_shape(self, i: int, attrs: Clique) -> tuple[int, ...]:
        """Shape that lets a table over ``attrs`` (domain order) broadcast against clique ``i``."""
        s = set(attrs)
        return tuple(self.domain[a] if a in s else 1 for a in self.cliques[i])

    def reduce_axes(self, i: int, attrs: Clique) -> tuple[int, ...]:
        """Axes of clique ``i`` to sum out to keep ``attrs``."""
        s = set(attrs)
        return tuple(k for k, a in enumerate(self.cliques[i]) if a not in s)



def _elimination_cliques_min_size(graph: nx.Graph, domain: Domain) -> list[frozenset[str]]:
    """Greedy elimination choosing the variable whose new clique has the fewest cells.

    At each step the variable ``v`` minimising ``∏_{u ∈ {v} ∪ N(v)} |dom(u)|`` is eliminated
    (ties broken by domain order), its neighbourhood is made complete, and ``{v} ∪ N(v)`` is
    recorded. This is the default order of Private-PGM.
    """
    g = {v: set(graph.neighbors(v)) for v in graph.nodes}
    rank = {a: i for i, a in enumerate(domain.attrs)}
    cliques = []
    while g:
        v = min(g, key=lambda u: (math.prod(domain[w] for w in g[u] | {u}), rank[u]))
        nbrs = g.pop(v)
        cliques.append(frozenset(nbrs | {v}))
        for u in nbrs:
            g[u].discard(v)
            g[u] |= nbrs - {u}
    return cliques


def _elimination_cliques_min_fill(graph: nx.Graph) -> list[frozenset[str]]:
    """Bags of networkx's min-fill-in tree decomposition."""
    _, decomposition = treewidth_min_fill_in(graph)
    return list(decomposition.nodes)


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`, else a clear one-line error.

    Parameters
    ----------
    method : str

    Returns
    -------
    str
        ``method`` unchanged.

    Raises
    ------
    ValueError
        Naming the method and the three valid ones.

    Examples
    --------
    >>> check_method("auto")
    'auto'
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(
            f"unknown triangulation method {method!r}; use 'auto', 'min_fill' or 'min_size'")
    return method


def _cheaper(min_fill: JunctionTree, min_size: JunctionTree) -> JunctionTree:
    """The tree with fewer cells in all; ``min_fill`` on a tie."""
    return min_size if min_size.num_cells < min_fill.num_cells else min_fill


def build_junction_tree(network: MarkovNetwork, method: str = DEFAULT_METHOD) -> JunctionTree:
    """Triangulate ``network`` and join its maximal cliques into a junction tree (cached).

    Parameters
    ----------
    network : MarkovNetwork
    method : {"auto", "min_fill", "min_size"}
        Elimination heuristic: networkx's min-fill-in, the greedy smallest-new-clique order, or
        (``"auto"``, the default) whichever of the two gives the fewer cells in all (min-fill on
        a tie).

    Returns
    -------
    JunctionTree
        The same object for equal networks and the same ``method``; with ``"auto"``, the very
        tree that the chosen heuristic's own call returns.

    Examples
    --------
    >>> net = MarkovNetwork({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("b", "c")])
    >>> tree = build_junction_tree(net)
    >>> tree.cliques, tree.num_cells
    ((('b', 'c'), ('a', 'b')), 18)
    """
    return _build_junction_tree(network, check_method(method))


@functools.lru_cache(maxsize=768)  # 3 entries a network: "auto" and the two it compares
def _build_junction_tree(network: MarkovNetwork, method: str) -> JunctionTree:
    if method == "auto":
        return _cheaper(_build_junction_tree(network, "min_fill"),
                        _build_junction_tree(network, "min_size"))
    domain = network.domain
    graph = network.graph
    if method == "min_fill":
        bags = _elimination_cliques_min_fill(graph)
    else:
        bags = _elimination_cliques_min_size(graph, domain)
    # keep the maximal bags, attributes in domain order, deterministic clique order
    bags = list(dict.fromkeys(bags))
    maximal = [b for b in bags if not any(b < o for o in bags)]
    cliques = sorted((domain.sorted(b) for b in maximal),
                     key=lambda c: (-domain.size(c), [domain.index(a) for a in c]))
    # maximum-weight spanning tree of the clique graph; zero weights join disconnected parts
    cg = nx.Graph()
    cg.add_nodes_from(range(len(cliques)))
    for i in range(len(cliques)):
        for j in range(i + 1, len(cliques)):
            cg.add_edge(i, j, weight=len(set(cliques[i]) & set(cliques[j])))
    tree = nx.maximum_spanning_tree(cg, algorithm="kruskal")
    order = [0] + [v for _, v in nx.bfs_edges(tree, 0)]
    parent = [-1] * len(cliques)
    for u, v in nx.bfs_edges(tree, 0):
        parent[v] = u
    separators = tuple(
        () if p < 0 else domain.sorted(set(cliques[i]) & set(cliques[p]))
        for i, p in enumerate(parent)
    )
    return JunctionTree(domain, tuple(cliques), tuple(parent), tuple(order), separators)


