r"""The normal relaxation of the CGM, built along the junction tree in non-centred form.

Given ``θ``, the clique tables of ``N`` records drawn from ``p_θ`` factorise along a junction
tree (cliques ``K`` in a topological order, separator ``S`` with the parent, residual
``R = K ∖ S``): given the tables built so far, the records with ``x_S = s`` draw ``x_R`` from
``p_θ(· | s)`` independently, so ``n_K(s, ·) ∼ Multinomial(n_S(s), p_θ(· | s))``. Replacing each
multinomial by a normal vector with the covariance taken at the expected count ``N μ_S(s)``,

.. math::

    n_K(s, ·) = n_S(s)\, p(· \mid s) + \sqrt{N μ_S(s)}\; \big(\operatorname{diag} p − p p^⊤
    \big)^{1/2} z_K(s, ·), \qquad z ∼ \mathcal N(0, I),                          \tag{1}

with ``(diag p − p pᵀ)^{1/2} z = √p ⊙ (z − √p (√pᵀ z))``, gives tables that are consistent
(every table sums to ``N`` and shares its margins with its neighbours) and whose mean and
covariance, all tables jointly, are exactly those of the CGM: the conditional mean and
covariance in (1) are linear in ``n_S``, so the law of total covariance gives
``E n = N μ(θ)`` and ``Cov(n_C(x), n_D(x')) = N (P_θ(x, x') − μ_C(x) μ_D(x'))``. Unlike the
``lgamma`` relaxation (:mod:`.relaxation`) it moves no mass into near-empty cells; unlike the
exact law its cells can go below zero and its higher moments are a normal's, so it is close to
the CGM where the noise of a release is wide against the counts' own spread, or where cells hold
many records.

NUTS samples ``z`` (site ``"z"``), not ``n``: in (1) the tables follow ``θ``, which suits cells
whose released counts are mostly noise (given ``θ``, ``z`` is then nearly its prior). Where the
release pins a count, that parameterisation ties ``z`` to ``θ`` along a narrow ridge. So each
cell is partially centred (Papaspiliopoulos, Roberts & Sköld 2007): ``z = z̃ − (1 − w) D(θ)``
with ``D`` the ``z`` that moves ``n_K(s, ·)`` from a fixed reference ``N μ_S(s) p₀(· | s)`` to
``N μ_S(s) p(· | s)``, and ``w`` the noise's share of the cell's released count
(``w = 1``: non-centred, ``w = 0``: the table's deviation from ``p₀`` is sampled directly).
At fixed ``θ`` the map ``z̃ ↦ z`` is a translation, so ``z̃ ∼ N((1 − w) D(θ), I)`` is exact and
needs no Jacobian.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..domain import Clique
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..tables import project_table
from .constraints import decomposable_layout

__all__ = ["NormalBlock", "NormalTablesPlan", "centring_shift", "logit_conditionals",
           "normal_tables", "normal_tables_plan", "rows_to_network", "tree_conditionals"]

Array = Any


class NormalBlock(NamedTuple):
    """One junction-tree clique of (1): its table as ``(separator cell, residual cell)`` rows.

    Attributes
    ----------
    clique : tuple of str
        The network clique (its attribute order is the layout's).
    parent : tuple of str or None
        The parent's network clique (``None`` at a root).
    sep, res : tuple of str
        Separator and residual attributes.
    rows, cols : int
        Cells of the separator and of the residual.
    offset : int
        Where the block's ``z`` starts.
    to_rows : numpy int array ``(rows * cols,)``
        The clique's cells (layout order) in ``(s, r)`` order.
    axes : tuple of int
        The clique's axes in ``sep + res`` order (``to_rows`` as a transpose).
    """

    clique: Clique
    parent: Clique | None
    sep: Clique
    res: Clique
    rows: int
    cols: int
    offset: int
    to_rows: np.ndarray
    axes: tuple[int, ...]


class NormalTablesPlan(NamedTuple):
    """The static structure of (1) for a decomposable network (:func:`normal_tables_plan`).

    Attributes
    ----------
    network : MarkovNetwork
    blocks : tuple of NormalBlock
        Root first.
    dim : int
        Size of ``z``: the cells of the junction-tree cliques. ``z`` is laid out clique by
        clique in the order of ``blocks``, each clique's cells by separator cell, then residual
        cell (``NormalBlock.to_rows`` maps them to the clique's own layout).
    hosts : dict
        Every network clique → the junction-tree clique whose table it is a projection of.
    """

    network: MarkovNetwork
    blocks: tuple[NormalBlock, ...]
    dim: int
    hosts: dict


@functools.lru_cache(maxsize=64)
def normal_tables_plan(network: MarkovNetwork) -> NormalTablesPlan:
    """The plan of (1) for a decomposable ``network`` (cached); a clear error otherwise."""
    layout = decomposable_layout(network)
    tree = jt.build_junction_tree(layout.covered, "min_fill")
    by_set = {frozenset(c): c for c in network.cliques}
    cliques = [by_set[frozenset(c)] for c in tree.cliques]
    dom = network.domain
    blocks, offset = [], 0
    for i in tree.order:
        clique = cliques[i]
        parent = cliques[tree.parent[i]] if tree.parent[i] >= 0 else None
        sep = tuple(a for a in clique if parent is not None and a in tree.separators[i])
        res = tuple(a for a in clique if a not in sep)
        rows, cols = dom.size(sep), dom.size(res)
        axes = tuple(clique.index(a) for a in sep + res)
        to_rows = np.transpose(np.arange(rows * cols).reshape(dom.shape_of(clique)),
                               axes).reshape(-1)
        blocks.append(NormalBlock(clique, parent, sep, res, rows, cols, offset, to_rows, axes))
        offset += rows * cols
    hosts = {c: next(b.clique for b in blocks if set(c) <= set(b.clique))
             for c in layout.covered.cliques}
    return NormalTablesPlan(network, tuple(blocks), offset, hosts)


def tree_conditionals(plan: NormalTablesPlan, theta: Array,
                      normalized: bool = False) -> list[tuple[Array, Array]]:
    """Per block, ``μ_S`` (``(rows, 1)``) and ``p(r | s)`` (``(rows, cols)``) at ``θ``.

    ``normalized``: ``θ`` holds the log conditionals of the junction tree (the conditional
    coding, ``A(θ) = 0``), read off ``θ`` instead of calibrated."""
    net = plan.network
    if normalized:
        return _forward(plan, [jnp.exp(_to_rows(b, theta[net.slice_of(b.clique)], net))
                               for b in plan.blocks])
    mu = jt.marginals(net, theta)
    out = []
    for b in plan.blocks:
        rows = _to_rows(b, mu[b.clique], net)
        mu_s = jnp.sum(rows, axis=1, keepdims=True)
        out.append((mu_s, rows / mu_s))
    return out


def logit_conditionals(plan: NormalTablesPlan, logits: list[Array]) -> list[tuple[Array, Array]]:
    """:func:`tree_conditionals` from per-block logits of ``p(r | s)`` (``(rows, cols)`` each,
    in the order of ``plan.blocks``), e.g. the conditional coding's ``block_logits``."""
    return _forward(plan, [jax.nn.softmax(x, axis=1) for x in logits])


def _forward(plan: NormalTablesPlan, conds: list[Array]) -> list[tuple[Array, Array]]:
    """``μ_S`` of every block from the conditionals, one pass from the root."""
    net = plan.network
    joint: dict[Clique, Array] = {}
    out = []
    for b, cond in zip(plan.blocks, conds, strict=True):
        if b.parent is None:
            mu_s = jnp.ones((1, 1), cond.dtype)
        else:
            mu_s = project_table(joint[b.parent], b.parent, b.sep).reshape(b.rows, 1)
        joint[b.clique] = _from_rows(b, mu_s * cond, net)
        out.append((mu_s, cond))
    return out


def _to_rows(block: NormalBlock, table: Array, net: MarkovNetwork) -> Array:
    """A clique's table (any shape with its cells) as the block's ``(rows, cols)``."""
    table = jnp.reshape(table, net.domain.shape_of(block.clique))
    return jnp.transpose(table, block.axes).reshape(block.rows, block.cols)


def _from_rows(block: NormalBlock, rows: Array, net: MarkovNetwork) -> Array:
    """A block's ``(rows, cols)`` table back in its clique's shape and attribute order."""
    shape = net.domain.shape_of(block.sep + block.res)
    return jnp.transpose(jnp.reshape(rows, shape), np.argsort(block.axes))


def normal_tables(plan: NormalTablesPlan, conditionals: list, total: Array, z: Array) -> Array:
    """The tables of (1) at standard normal coordinates ``z``.

    Parameters
    ----------
    plan : NormalTablesPlan
    conditionals : list
        Per block ``(μ_S, p(r | s))``: :func:`tree_conditionals` of ``θ``, or
        :func:`logit_conditionals`.
    total : float
        ``N``.
    z : array ``(plan.dim,)``

    Returns
    -------
    array ``(num_params,)``
        Count tables in the network's layout (non-maximal cliques by projection).

    Examples
    --------
    >>> import jax.numpy as jnp, numpyro
    >>> from numpyro_dpgm import MarkovNetwork
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b"), ("a",)])
    >>> plan = normal_tables_plan(net)
    >>> conds = tree_conditionals(plan, jnp.zeros(net.num_params))
    >>> normal_tables(plan, conds, 100.0, jnp.zeros(plan.dim)).tolist()
    [25.0, 25.0, 25.0, 25.0, 50.0, 50.0]
    """
    net = plan.network
    z = jnp.asarray(z)
    tables: dict[Clique, Array] = {}
    for b, (mu_s, cond) in zip(plan.blocks, conditionals, strict=True):
        zb = z[b.offset:b.offset + b.rows * b.cols].reshape(b.rows, b.cols)
        sq = jnp.sqrt(cond)
        if b.parent is None:
            n_s = jnp.full((1, 1), total, cond.dtype)
        else:
            n_s = project_table(tables[b.parent], b.parent, b.sep).reshape(b.rows, 1)
        spread = sq * (zb - sq * jnp.sum(sq * zb, axis=1, keepdims=True))
        tables[b.clique] = _from_rows(b, n_s * cond + jnp.sqrt(total * mu_s) * spread, net)
    return _network_layout(plan, tables)


def rows_to_network(plan: NormalTablesPlan, rows: Array) -> Array:
    """The network's layout of tables given as the plan's blocks, each by ``(s, r)`` rows
    (``rows``: ``(plan.dim,)``, laid out as ``z``); linear."""
    net = plan.network
    return _network_layout(plan, {
        b.clique: _from_rows(b, rows[b.offset:b.offset + b.rows * b.cols], net)
        for b in plan.blocks})


def _network_layout(plan: NormalTablesPlan, tables: dict) -> Array:
    """Every network clique's table (non-maximal ones projected from their host), flattened."""
    net = plan.network
    return net.flatten({c: tables[c] if c == plan.hosts[c]
                        else project_table(tables[plan.hosts[c]], plan.hosts[c], c)
                        for c in net.cliques})


def centring_shift(plan: NormalTablesPlan, conditionals: list, total: Array, weight: Array,
                   reference: Array) -> Array:
    """``(1 − w) D(θ)``: the mean of the partially centred coordinates ``z̃ = z + (1 − w) D``.

    ``D`` moves the tables of (1) from ``N μ_S(s) p₀(· | s)`` to ``N μ_S(s) p(· | s)``:
    ``D_K(s, r) = √(N μ_S(s)) (p(r | s) − p₀(r | s)) / √p(r | s)``.

    Parameters
    ----------
    plan, conditionals, total :
        As in :func:`normal_tables`.
    weight : array ``(plan.dim,)``
        Per cell of ``z``, the non-centred weight ``w ∈ [0, 1]``.
    reference : array ``(plan.dim,)``
        The reference conditionals ``p₀(r | s)``, laid out as ``z`` (each row sums to one).

    Returns
    -------
    array ``(plan.dim,)``
    """
    weight, reference = jnp.asarray(weight), jnp.asarray(reference)
    parts = []
    for b, (mu_s, cond) in zip(plan.blocks, conditionals, strict=True):
        sl = slice(b.offset, b.offset + b.rows * b.cols)
        w = weight[sl].reshape(b.rows, b.cols)
        p0 = reference[sl].reshape(b.rows, b.cols)
        parts.append(((1.0 - w) * jnp.sqrt(total * mu_s) * (cond - p0) / jnp.sqrt(cond))
                     .reshape(-1))
    return jnp.concatenate(parts)
