"""Markov networks: a domain, a list of cliques and the parameter layout over them.

The log-linear model of a network with cliques ``C`` is

.. math:: p_θ(x) = \\exp\\Big(\\sum_{C} θ_C(x_C) - A(θ)\\Big),

with one log-potential per cell of every clique table (the overcomplete indicator features
``φ(x)`` of seed 002, §2 and seed 003, §2). The parameter vector ``θ`` is the concatenation over
cliques, in the order given, of each table raveled in C order; :meth:`MarkovNetwork.flatten` and
:meth:`MarkovNetwork.unflatten` convert between the vector and
:class:`~numpyro_dpgm.tables.CliqueTables`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from ._jit import device_array
from .domain import Clique, Domain
from .tables import CliqueTables

__all__ = ["MarkovNetwork"]


class MarkovNetwork:
    """A domain with cliques and the flat parameter layout over them.

    Parameters
    ----------
    domain : Domain or Mapping[str, int]
        The attributes and their numbers of values.
    cliques : sequence of tuples of attribute names
        Kept in the order given (as are the attributes inside each clique). A clique may be a
        subset of another (e.g. one-way tables beside two-way ones).

    Notes
    -----
    Immutable and hashable by value, so a network can be static data of a jitted function.

    Examples
    --------
    >>> net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    >>> net.num_params
    12
    >>> net.unflatten(np.arange(12.0))[("b", "c")].shape
    (3, 2)
    """

    def __init__(self, domain: Domain | dict[str, int], cliques: Sequence[Iterable[str]]):
        domain = domain if isinstance(domain, Domain) else Domain(domain)
        if isinstance(cliques, str) or not isinstance(cliques, Iterable):
            raise TypeError("cliques must be a sequence of tuples of attribute names")
        cliques = tuple(domain.check_clique(c) for c in cliques)
        seen: dict[frozenset[str], Clique] = {}
        for c in cliques:
            key = frozenset(c)
            if key in seen:
                raise ValueError(f"clique {c} repeats clique {seen[key]} (same attributes)")
            seen[key] = c
        self.domain: Domain = domain
        self.cliques: tuple[Clique, ...] = cliques
        self.shapes: tuple[tuple[int, ...], ...] = tuple(domain.shape_of(c) for c in cliques)
        self.sizes: tuple[int, ...] = tuple(math.prod(s) for s in self.shapes)
        self.offsets: tuple[int, ...] = tuple(int(o) for o in np.cumsum((0,) + self.sizes)[:-1])
        self.num_params: int = int(sum(self.sizes))
        self._hash = hash((domain, cliques))

    # -- identity ------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MarkovNetwork):
            return NotImplemented
        return self.domain == other.domain and self.cliques == other.cliques

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"MarkovNetwork(attrs={list(self.domain.attrs)}, cliques={list(self.cliques)})"

    # -- layout --------------------------------------------------------------------------------
    def slice_of(self, clique: Iterable[str]) -> slice:
        """Slice of the flat parameter vector that holds ``clique``'s table."""
        i = self.clique_index(clique)
        return slice(self.offsets[i], self.offsets[i] + self.sizes[i])

    def clique_index(self, clique: Iterable[str]) -> int:
        clique = tuple(clique)
        try:
            return self.cliques.index(clique)
        except ValueError:
            raise KeyError(
                f"clique {clique} is not in the network; it has {list(self.cliques)}"
            ) from None

    def flatten(self, tables: CliqueTables | dict[Clique, Any]) -> Any:
        """Concatenate the tables (one per clique of the network) into a parameter vector.

        Leading batch dimensions are kept: a table of shape ``batch + clique_shape`` gives a
        vector of shape ``batch + (num_params,)``.
        """
        missing = [c for c in self.cliques if c not in tables]
        if missing:
            raise KeyError(f"tables are missing clique(s) {missing}")
        parts = []
        for c, shape in zip(self.cliques, self.shapes, strict=True):
            t = tables[c]
            if tuple(np.shape(t))[len(np.shape(t)) - len(shape):] != shape:
                raise ValueError(
                    f"table of clique {c} has shape {np.shape(t)}; expected (..., {shape})"
                )
            batch = np.shape(t)[: len(np.shape(t)) - len(shape)]
            parts.append(jnp.reshape(t, batch + (-1,)))
        return jnp.concatenate(parts, axis=-1)

    def unflatten(self, vector: Any) -> CliqueTables:
        """Split a parameter vector (with optional leading batch dims) into clique tables."""
        shape = np.shape(vector)
        if not shape or shape[-1] != self.num_params:
            raise ValueError(
                f"parameter vector has shape {shape}; the network expects (..., {self.num_params})"
            )
        batch = shape[:-1]
        if not isinstance(vector, jax.core.Tracer):  # host slices: a device slice compiles
            host = np.asarray(vector)
            return CliqueTables({
                c: device_array(np.reshape(host[..., o : o + s], batch + sh))
                for c, o, s, sh in zip(self.cliques, self.offsets, self.sizes, self.shapes,
                                       strict=True)
            })
        return CliqueTables({
            c: jnp.reshape(vector[..., o : o + s], batch + sh)
            for c, o, s, sh in zip(self.cliques, self.offsets, self.sizes, self.shapes, strict=True)
        })

    def zeros(self, dtype: Any = None) -> CliqueTables:
        """All-zero tables (the uniform distribution's log-potentials)."""
        return self.unflatten(jnp.zeros(self.num_params, dtype=dtype))

    # -- features ------------------------------------------------------------------------------
    def cell_indices(self, records: Any) -> Any:
        """Flat parameter index of the cell each record falls in, per clique.

        Parameters
        ----------
        records : int array, shape ``(..., num_attrs)``
            Integer codes in domain order.

        Returns
        -------
        int array, shape ``(..., num_cliques)``
            ``idx[..., j] = offsets[j] + ravel_multi_index(x[clique_j], shape_j)``, so that
            ``θ·φ(x) = Σ_j θ[idx[..., j]]``.
        """
        cols = []
        for c, shape, off in zip(self.cliques, self.shapes, self.offsets, strict=True):
            strides = np.cumprod((1,) + shape[::-1])[:-1][::-1]
            flat = off
            for a, s in zip(c, strides, strict=True):
                flat = flat + records[..., self.domain.index(a)] * int(s)
            cols.append(flat)
        return jnp.stack(cols, axis=-1)

    def features(self, records: Any) -> Any:
        """Sufficient statistics ``Σ_i φ(x_i)`` of records, as a flat vector (float)."""
        idx = jnp.reshape(self.cell_indices(records), (-1,))
        return jnp.zeros(self.num_params).at[idx].add(1.0)

    # -- graph structure -----------------------------------------------------------------------
    @functools.cached_property
    def graph(self) -> nx.Graph:
        """Primal (interaction) graph: attributes as nodes, an edge within every clique."""
        g = nx.Graph()
        g.add_nodes_from(self.domain.attrs)
        for c in self.cliques:
            g.add_edges_from((a, b) for i, a in enumerate(c) for b in c[i + 1 :])
        return g

    @property
    def maximal_cliques(self) -> tuple[Clique, ...]:
        """Cliques of the network not contained in another of its cliques."""
        sets = [frozenset(c) for c in self.cliques]
        return tuple(
            c for c, s in zip(self.cliques, sets, strict=True)
            if not any(s < t for t in sets)
        )

    @functools.cached_property
    def is_decomposable(self) -> bool:
        """True when the maximal cliques are exactly those of a chordal graph.

        Attributes in no clique are independent and do not matter. Then the junction tree's
        cliques are the network's maximal cliques (plus singletons for such attributes), and the
        hyper-multinomial and closed-form MLE (seed 002, §3; seed 003, §2) apply.
        """
        if not nx.is_chordal(self.graph):
            return False
        covered = {a for c in self.cliques for a in c}
        graph_cliques = {frozenset(c) for c in nx.find_cliques(self.graph.subgraph(covered))}
        return graph_cliques <= {frozenset(c) for c in self.cliques}

    def with_cliques(self, extra: Iterable[Iterable[str]]) -> MarkovNetwork:
        """The network with cliques added (those already covered by an equal set are skipped)."""
        have = {frozenset(c) for c in self.cliques}
        new = []
        for c in extra:
            c = (c,) if isinstance(c, str) else tuple(c)
            if frozenset(c) not in have:
                have.add(frozenset(c))
                new.append(c)
        return self if not new else MarkovNetwork(self.domain, self.cliques + tuple(new))
