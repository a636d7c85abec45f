"""The gauge of the clique log-potentials: minimal reference-coded parameters ``θ = M φ``.

The clique log-potentials ``θ`` are overcomplete: adding a constant to one clique table and
subtracting it from another, or moving a function of a separator from one clique to a neighbour,
leaves ``p_θ`` unchanged, so a prior placed directly on ``θ`` puts mass along directions the
likelihood cannot see. The prior is therefore placed on *minimal reference-coded*
(corner-constraint) parameters ``φ``: for every non-empty attribute set ``A`` contained in some
clique (the cliques' downward closure) and every cell ``v`` of ``A`` in which **no** attribute
takes its reference value ``r_a`` (level 0 unless chosen), one parameter ``λ_A(v)``; the
log-density of a record is

.. math:: \\log p(x) = \\sum_A λ_A(x_A)\\, 1[x_a ≠ r_a\\ ∀ a ∈ A] - \\log Z(φ).

Each ``λ_A`` is written into the table of one clique containing ``A`` (the first in the
network's order), which defines the 0/1 matrix ``M``. These indicator features and the constant
form a basis of the functions ``Σ_C g_C(x_C)``, so ``φ ↦ p_{Mφ}`` reaches every distribution of
the model family exactly once (:meth:`ReferenceCoding.from_theta` is the inverse, by Möbius
inversion at the reference cell). Main effects ``λ_{a}(v)`` are log odds of level ``v`` against
the reference level at the reference of the other attributes; interactions are log odds ratios.
The prior is not invariant to the choice of reference levels; where a reference level is rare,
every parameter of its terms is coupled through its sparse cells (a reference at each attribute's
most frequent level, ``reference="released"`` of the model, avoids that).

The number of free parameters is ``Σ_A Π_{a∈A}(k_a − 1)``, far fewer than ``num_params``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from ...domain import Clique, Domain
from ...network import MarkovNetwork
from .labels import cell_label

__all__ = ["ReferenceCoding", "cached_coding", "reference_coding", "reference_levels"]

Array = Any


class ReferenceCoding:
    """Minimal reference-coded parameterisation ``θ = M φ`` of a network (see the module notes).

    Build it with :func:`reference_coding` (cached per network).

    Attributes
    ----------
    network : MarkovNetwork
    terms : tuple of (attribute tuple, host clique index)
        The interaction sets ``A`` (attributes in domain order, ordered by size then domain
        order) and the network clique whose table holds ``λ_A``.
    dim : int
        Number of parameters ``φ``.
    labels : list of str
        ``"a=1,b=2"`` for ``λ_{(a,b)}(1, 2)``.
    """

    #: The ``coding`` of :func:`~.model.noisy_marginals_model` that builds it.
    name = "reference"

    def __init__(self, network: MarkovNetwork, reference: Mapping[str, int] | None = None):
        if not isinstance(network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
        domain = network.domain
        ref = reference_levels(domain, reference)
        subsets: set[frozenset[str]] = set()
        for c in network.cliques:
            for r in range(1, len(c) + 1):
                subsets.update(frozenset(s) for s in itertools.combinations(c, r))
        order = {a: i for i, a in enumerate(domain.attrs)}
        terms = sorted((domain.sorted(s) for s in subsets),
                       key=lambda t: (len(t), [order[a] for a in t]))
        hosts = []
        for t in terms:
            hosts.append(next(i for i, c in enumerate(network.cliques) if set(t) <= set(c)))
        self.network = network
        self.terms: tuple[tuple[Clique, int], ...] = tuple(zip(terms, hosts, strict=True))

        labels: list[str] = []
        to_rows, to_cols = [], []  # θ index, φ index: θ = segment-sum of φ
        inv_rows, inv_cols, inv_sign = [], [], []  # φ index, θ index, ±1: φ = R θ
        j = 0
        self.reference: dict[str, int] = ref
        for attrs, host in self.terms:
            levels = self.levels(attrs)
            hc = network.cliques[host]
            hshape = network.shapes[host]
            containing = [i for i, c in enumerate(network.cliques) if set(attrs) <= set(c)]
            for v in itertools.product(*levels):
                labels.append(cell_label(attrs, v))
                val = dict(zip(attrs, v, strict=True))
                # M: every cell of the host table with x_A = v
                for cell in np.ndindex(*hshape):
                    if all(cell[hc.index(a)] == val[a] for a in attrs):
                        to_rows.append(network.offsets[host] + np.ravel_multi_index(cell, hshape))
                        to_cols.append(j)
                # R: λ_A(v) = Σ_{C ⊇ A} Σ_{B ⊆ A} (−1)^{|A∖B|} θ_C((v_B, 0)_C)
                for ci in containing:
                    c, shape = network.cliques[ci], network.shapes[ci]
                    for r in range(len(attrs) + 1):
                        for b in itertools.combinations(attrs, r):
                            cell = tuple(val[a] if a in b else ref[a] for a in c)
                            inv_rows.append(j)
                            inv_cols.append(network.offsets[ci]
                                            + int(np.ravel_multi_index(cell, shape)))
                            inv_sign.append((-1.0) ** (len(attrs) - r))
                j += 1
        self.dim: int = j
        self.labels: list[str] = labels
        self._to_rows = np.asarray(to_rows, dtype=np.int64)
        self._to_cols = np.asarray(to_cols, dtype=np.int64)
        self._inv_rows = np.asarray(inv_rows, dtype=np.int64)
        self._inv_cols = np.asarray(inv_cols, dtype=np.int64)
        self._inv_sign = np.asarray(inv_sign, dtype=np.float64)

    def levels(self, attrs: Clique) -> list[list[int]]:
        """The non-reference levels of each attribute of ``attrs`` (``λ_A``'s cells are their
        product)."""
        return [[v for v in range(self.network.domain[a]) if v != self.reference[a]]
                for a in attrs]

    def __repr__(self) -> str:
        return f"ReferenceCoding(cliques={list(self.network.cliques)}, dim={self.dim})"

    def to_theta(self, phi: Array) -> Array:
        """``θ = M φ`` for ``phi`` of shape ``batch + (dim,)``; shape ``batch + (num_params,)``."""
        phi = jnp.asarray(phi)
        if phi.ndim < 1 or phi.shape[-1] != self.dim:
            raise ValueError(f"phi has shape {phi.shape}; expected (..., {self.dim})")
        out = jnp.zeros(phi.shape[:-1] + (self.network.num_params,), dtype=phi.dtype)
        return out.at[..., self._to_rows].add(phi[..., self._to_cols])

    def from_theta(self, theta: Array) -> Array:
        """The ``φ`` with ``p_{Mφ} = p_θ`` (Möbius inversion at the reference cell).

        ``theta`` of shape ``batch + (num_params,)`` in the network's layout, any gauge.
        """
        theta = jnp.asarray(theta)
        if theta.ndim < 1 or theta.shape[-1] != self.network.num_params:
            raise ValueError(
                f"theta has shape {theta.shape}; expected (..., {self.network.num_params})")
        out = jnp.zeros(theta.shape[:-1] + (self.dim,), dtype=theta.dtype)
        return out.at[..., self._inv_rows].add(self._inv_sign * theta[..., self._inv_cols])

    def tangent(self, direction: Array) -> Array:
        """The change of ``φ`` that adds ``direction`` to ``θ`` (:meth:`from_theta`, linear)."""
        return self.from_theta(direction)

    @property
    def matrix(self) -> np.ndarray:
        """The dense 0/1 matrix ``M`` of shape ``(num_params, dim)``."""
        m = np.zeros((self.network.num_params, self.dim))
        m[self._to_rows, self._to_cols] = 1.0
        return m


@functools.lru_cache(maxsize=64)
def _cached(kind: type, network: MarkovNetwork, reference: tuple[tuple[str, int], ...]) -> Any:
    return kind(network, dict(reference))


def cached_coding(kind: type, network: MarkovNetwork, reference: Mapping[str, int] | None) -> Any:
    """``kind(network, reference)``, cached per coding class, network and reference levels."""
    return _cached(kind, network, tuple(sorted(dict(reference or {}).items())))


def reference_coding(network: MarkovNetwork,
                     reference: Mapping[str, int] | None = None) -> ReferenceCoding:
    """The minimal reference-coded parameterisation of ``network`` (cached per network and
    ``reference``, a mapping of attributes to their reference levels, default level 0)."""
    return cached_coding(ReferenceCoding, network, reference)


def reference_levels(domain: Domain, reference: Mapping[str, int] | None) -> dict[str, int]:
    """Every attribute's reference level: ``reference``'s where it names one, else 0."""
    ref = {a: 0 for a in domain.attrs}
    for a, v in dict(reference or {}).items():
        if a not in ref:
            raise KeyError(f"reference names unknown attribute {a!r}; attributes are "
                           f"{list(domain.attrs)}")
        if not (isinstance(v, int | np.integer) and 0 <= int(v) < domain[a]):
            raise ValueError(f"the reference level of {a!r} must be an integer in "
                             f"[0, {domain[a]}), got {v!r}")
        ref[a] = int(v)
    return ref
