"""Conditional coding: log odds of a decomposable network's junction-tree conditionals.

A decomposable network's record model factorises along a junction tree (cliques ``K`` in a
topological order, ``S_K`` the separator with the parent, ``R_K = K ∖ S_K`` the residual):

.. math:: p(x) = \\prod_K p(x_{R_K} \\mid x_{S_K}).

The conditional coding's parameters are the log odds of each conditional against a reference
residual cell ``r_0`` (the reference levels of ``R_K``'s attributes),
``β_K(s, r) = \\log p(r \\mid s) − \\log p(r_0 \\mid s)`` for every separator cell ``s`` and
residual cell ``r ≠ r_0``, and the clique log-potentials are the log conditionals themselves,

.. math:: θ_K(s, r) = β_K(s, r) − \\log \\sum_{r'} e^{β_K(s, r')}, \\qquad β_K(s, r_0) = 0,

so that ``A(θ) = 0`` needs no inference and ``θ·n = \\sum_K \\sum_{s,r} n_K(s, r)
\\log p(r \\mid s)``. The number of parameters equals the reference coding's (both are minimal);
the map ``β ↦ p_θ`` reaches every distribution of the model family with positive
probabilities exactly once. Given complete tables ``n`` the likelihood is a product of one
multinomial per ``(K, s)``, so ``β``'s blocks are independent a posteriori under an
independent prior: the geometry NUTS needs, where the reference coding's parameters of one term
are coupled through its sparse reference cells. The prior ``β ∼ N(0, s²I)`` is a different prior
from the reference coding's (it depends on the tree's root and on the reference levels); both are
weakly informative at the default scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...distributions.constraints import decomposable_layout
from ...network import MarkovNetwork
from ...oracles import junction_tree as jt
from .coding import cached_coding, reference_levels
from .labels import cell_label

__all__ = ["ConditionalCoding", "conditional_coding"]

Array = Any


class ConditionalCoding:
    """Junction-tree conditional log odds ``β`` with ``θ`` the log conditionals (module notes).

    Build it with :func:`conditional_coding` (cached per network and reference levels).

    Attributes
    ----------
    network : MarkovNetwork
        Decomposable.
    reference : dict
        The reference level of every attribute.
    blocks : tuple of (clique, separator, residual)
        The junction tree's cliques (network cliques, root first) with their separators and
        residuals; non-maximal cliques of the network hold no parameters (``θ = 0`` there).
    dim : int
        Number of parameters ``β``.
    labels : list of str
        ``"b=2|a=1"`` for ``β_{(a,b)}(a=1, b=2)`` (residual given separator; a root block has
        no separator).
    rows : tuple of numpy int arrays
        Per block, the cells of the network's flat layout as a ``(separator cells, residual
        cells)`` array: row ``s`` holds the cells of the conditional ``p(· | s)``.

    Examples
    --------
    >>> import numpy as np, numpyro
    >>> from numpyro_dpgm import MarkovNetwork
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2, "c": 3}, [("a", "b"), ("b", "c")])
    >>> coding = conditional_coding(net)
    >>> coding.blocks  # the root (b, c), then a given b
    ((('b', 'c'), (), ('b', 'c')), (('a', 'b'), ('b',), ('a',)))
    >>> coding.labels
    ['b=0,c=1', 'b=0,c=2', 'b=1,c=0', 'b=1,c=1', 'b=1,c=2', 'a=1|b=0', 'a=1|b=1']
    >>> theta = np.asarray(coding.to_theta(np.array([1.0, 0, 0, 0, 0, 0.5, 0])))
    >>> np.exp(theta[4:]).round(3).tolist()  # p(b, c): the log odds 1 raised b=0, c=1
    [0.13, 0.352, 0.13, 0.13, 0.13, 0.13]
    >>> np.exp(theta[:4]).round(3).tolist()  # p(a | b): log odds 0.5 for a=1 given b=0
    [0.378, 0.5, 0.622, 0.5]
    """

    #: The ``coding`` of :func:`~.model.noisy_marginals_model` that builds it.
    name = "conditional"

    def __init__(self, network: MarkovNetwork, reference: Mapping[str, int] | None = None):
        if not isinstance(network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
        layout = decomposable_layout(network)
        domain = network.domain
        ref = reference_levels(domain, reference)
        tree = jt.build_junction_tree(layout.covered, "min_fill")
        by_set = {frozenset(c): c for c in network.cliques}
        blocks, labels = [], []
        pos, param, group, ref_pos, spans, rows = [], [], [], [], [], []
        j = g = 0
        for i in tree.order:
            clique = by_set[frozenset(tree.cliques[i])]
            sep = tuple(a for a in clique if a in tree.separators[i])
            res = tuple(a for a in clique if a not in sep)
            blocks.append((clique, sep, res))
            host = network.clique_index(clique)
            shape = network.shapes[host]
            s_shape = domain.shape_of(sep)
            r_shape = domain.shape_of(res)
            r0 = int(np.ravel_multi_index(tuple(ref[a] for a in res), r_shape))
            cells = np.stack(np.unravel_index(np.arange(network.sizes[host]), shape), -1)
            s_idx = (np.ravel_multi_index(tuple(cells[:, clique.index(a)] for a in sep), s_shape)
                     if sep else np.zeros(len(cells), np.int64))
            r_idx = np.ravel_multi_index(tuple(cells[:, clique.index(a)] for a in res), r_shape)
            n_r = int(np.prod(r_shape))
            rank = np.where(r_idx < r0, r_idx, r_idx - 1)
            beta_idx = np.where(r_idx == r0, -1, j + s_idx * (n_r - 1) + rank)
            flat = network.offsets[host] + np.arange(network.sizes[host])
            order = np.lexsort((r_idx, s_idx))  # cells by (s, r)
            by_sr = flat[order].reshape(-1, n_r)  # row s: the cells of s, by r
            pos.append(flat)
            param.append(beta_idx)
            group.append(g + s_idx)
            for s in np.ndindex(*s_shape):
                s_lab = cell_label(sep, s)
                for r in np.ndindex(*r_shape):
                    if int(np.ravel_multi_index(r, r_shape)) == r0:
                        continue
                    lab = cell_label(res, r)
                    labels.append(f"{lab}|{s_lab}" if sep else lab)
            ref_pos.append(by_sr[:, r0])
            rows.append(by_sr)
            spans.append((j, int(np.prod(s_shape)), n_r, r0))
            j += int(np.prod(s_shape)) * (n_r - 1)
            g += int(np.prod(s_shape))
        self.network = network
        self.reference = ref
        self.blocks: tuple[tuple[tuple[str, ...], ...], ...] = tuple(blocks)
        self.dim: int = j
        self.labels: list[str] = labels
        self._spans = tuple(spans)  # per block: first β, separator cells, residual cells, r0
        self.rows: tuple[np.ndarray, ...] = tuple(rows)
        self._pos = np.concatenate(pos)
        self._param = np.concatenate(param)
        self._group = np.concatenate(group)
        self._groups = g
        # per parameter: its cell and the reference cell of its (K, s)
        has = self._param >= 0
        self._beta_cell = np.empty(j, np.int64)
        self._beta_cell[self._param[has]] = self._pos[has]
        group_ref = np.concatenate(ref_pos)  # per group, its reference cell
        self._beta_ref = group_ref[self._group[has][np.argsort(self._param[has])]]

    def __repr__(self) -> str:
        return f"ConditionalCoding(cliques={list(self.network.cliques)}, dim={self.dim})"

    def to_theta(self, beta: Array) -> Array:
        """The log conditionals ``θ`` of ``beta`` (shape ``batch + (dim,)``), shape ``batch +
        (num_params,)``; ``A(θ) = 0``."""
        beta = jnp.asarray(beta)
        if beta.ndim < 1 or beta.shape[-1] != self.dim:
            raise ValueError(f"beta has shape {beta.shape}; expected (..., {self.dim})")
        batch = beta.shape[:-1]
        flat = jnp.reshape(beta, (-1, self.dim))
        ext = jnp.concatenate([flat, jnp.zeros((flat.shape[0], 1), flat.dtype)], axis=1)
        logits = ext[:, self._param].T  # (cells, B); parameter -1 is the reference's 0
        group = jnp.asarray(self._group)
        top = jax.ops.segment_max(logits, group, self._groups)
        total = jax.ops.segment_sum(jnp.exp(logits - top[group]), group, self._groups)
        log_cond = logits - (top + jnp.log(total))[group]
        out = jnp.zeros((flat.shape[0], self.network.num_params), flat.dtype)
        out = out.at[:, self._pos].set(log_cond.T)
        return jnp.reshape(out, batch + (self.network.num_params,))

    def block_logits(self, beta: Array) -> list[Array]:
        """Per block (in :attr:`blocks`' order), the logits ``β_K(s, r)`` of ``p(r | s)`` as a
        ``(separator cells, residual cells)`` array, ``0`` at the reference residual cell, for
        one ``beta`` of shape ``(dim,)``: ``θ_K`` without the normalisation."""
        beta = jnp.asarray(beta)
        out = []
        for j, rows, cols, r0 in self._spans:
            b = beta[j:j + rows * (cols - 1)].reshape(rows, cols - 1)
            out.append(jnp.concatenate([b[:, :r0], jnp.zeros((rows, 1), b.dtype), b[:, r0:]],
                                       axis=1))
        return out

    def log_odds(self, theta: Array) -> Array:
        """``θ_K(s, r) − θ_K(s, r_0)`` for every parameter: the inverse of :meth:`to_theta`
        on log conditionals, and linear (shape ``batch + (num_params,)`` in, ``batch +
        (dim,)`` out)."""
        theta = jnp.asarray(theta)
        return theta[..., self._beta_cell] - theta[..., self._beta_ref]

    def tangent(self, direction: Array) -> Array:
        """The change of ``β`` that adds ``direction`` to ``θ``, for directions that stay in
        one block's context (a cell of ``(K, s)`` and ``(K, s)`` itself, as the moves of
        :mod:`.interweave` do): :meth:`log_odds`, which is linear."""
        return self.log_odds(direction)

    def from_theta(self, theta: Array) -> Array:
        """The ``β`` with ``p_{θ(β)} = p_θ``, for ``theta`` of shape ``batch + (num_params,)``
        in any gauge (its junction-tree marginals' log odds)."""
        theta = jnp.asarray(theta)
        if theta.ndim < 1 or theta.shape[-1] != self.network.num_params:
            raise ValueError(
                f"theta has shape {theta.shape}; expected (..., {self.network.num_params})")
        net = self.network

        def one(t: Array) -> Array:
            return self.log_odds(jnp.log(net.flatten(jt.marginals(net, t))))

        flat = jnp.reshape(theta, (-1, net.num_params))
        return jnp.reshape(jax.vmap(one)(flat), theta.shape[:-1] + (self.dim,))


def conditional_coding(network: MarkovNetwork,
                       reference: Mapping[str, int] | None = None) -> ConditionalCoding:
    """The conditional coding of a decomposable ``network`` (cached per network and
    ``reference``, a mapping of attributes to their reference levels, default level 0)."""
    return cached_coding(ConditionalCoding, network, reference)
