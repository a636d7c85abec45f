"""Out-of-model marginals from a calibrated junction tree, without re-triangulating.

Over the smallest subtree of cliques that covers the query
(:meth:`~numpyro_dpgm.oracles.triangulation.JunctionTree.covering_subtree`), with top clique
``r``, the joint of its attributes is ``μ_{S_r} · Φ / Σ_{U∖S_r} Φ``, ``Φ`` being the product of
the potentials placed in the subtree and the upward messages entering it from outside. Under
``jit``/``vmap``/``grad`` the query is traced from the clique marginals (:func:`query_marginal`);
on the host it is contracted in NumPy (batched matrix products in an opt_einsum order,
:func:`numpy_contract`), so a new attribute set compiles nothing.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import opt_einsum

from .._jit import device_array
from ..domain import Clique
from ..tables import project_table
from .calibration import TreeMarginals
from .triangulation import JunctionTree

__all__ = [
    "query_marginal",
]

Array = Any

# ------------------------------------------------------------------------------------------------
# Queries on a calibrated tree
# ------------------------------------------------------------------------------------------------
class _QueryPlan(NamedTuple):
    nodes: tuple[int, ...]  # covering subtree, its top first
    subscripts: str  # einsum over the nodes' tables -> the query
    path: tuple[tuple[int, ...], ...]  # opt_einsum contraction order


@functools.lru_cache(maxsize=1024)
def _query_plan(tree: JunctionTree, attrs: Clique) -> _QueryPlan:
    nodes = tree.covering_subtree(attrs)
    union = tree.domain.sorted({a for i in nodes for a in tree.cliques[i]})
    symbol = {a: opt_einsum.get_symbol(k) for k, a in enumerate(union)}
    inputs = ",".join("".join(symbol[a] for a in tree.cliques[i]) for i in nodes)
    subscripts = inputs + "->" + "".join(symbol[a] for a in attrs)
    shapes = [tree.domain.shape_of(tree.cliques[i]) for i in nodes]
    path, _ = opt_einsum.contract_path(subscripts, *shapes, shapes=True, optimize="auto")
    return _QueryPlan(nodes, subscripts, tuple(tuple(step) for step in path))


def is_traced(values: Any) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def query_marginal(tree: JunctionTree, calibrated: TreeMarginals, attrs: Clique) -> Array:
    """Marginal over any attribute set from a calibrated junction tree.

    Parameters
    ----------
    tree : JunctionTree
    calibrated : TreeMarginals
        Output of :func:`calibrate_marginals` on ``tree``.
    attrs : tuple of str
        The query, axes in the order given.

    Returns
    -------
    array, shape ``domain.shape_of(attrs)``
        Sums to one.

    Notes
    -----
    A query inside a clique is summed out of that clique's marginal. Otherwise the joint of
    the attributes of the query's covering subtree (:meth:`JunctionTree.covering_subtree`) is
    ``μ_top · ∏_i p(x_{C_i∖S_i} | x_{S_i})``, and the query is its contraction, in the order
    opt_einsum finds (cached per tree and query). With concrete arrays the contraction runs
    eagerly in NumPy, so a new query compiles nothing; under ``jit``/``vmap``/``grad`` it is
    traced with ``jnp.einsum``.
    """
    attrs = tree.domain.check_clique(attrs)
    traced = is_traced(calibrated.marginals)
    xp: Any = jnp if traced else np

    def probs(j: int) -> Any:  # only the tables a query reads are brought to the host
        return calibrated.marginals[j] if traced else np.asarray(calibrated.marginals[j])

    i = tree.containing(attrs)
    if i is not None:
        out = project_table(probs(i), tree.cliques[i], attrs)
    else:
        plan = _query_plan(tree, attrs)
        operands = [probs(plan.nodes[0])]
        for j in plan.nodes[1:]:
            b = probs(j)
            mu = xp.sum(b, axis=tree.reduce_axes(j, tree.separators[j]), keepdims=True)
            operands.append(b / xp.where(mu > 0, mu, 1.0))
        if traced:
            out = jnp.einsum(plan.subscripts, *operands, optimize=list(plan.path),
                             precision=jax.lax.Precision.HIGHEST)
        else:
            out = numpy_contract(plan.subscripts, operands, plan.path)
    return out if traced else device_array(out)


def numpy_contract(
    subscripts: str, operands: list[np.ndarray], path: tuple[tuple[int, ...], ...]
) -> np.ndarray:
    """``einsum(subscripts, *operands)`` in NumPy along an opt_einsum ``path``.

    Every pairwise step is one batched matrix product (``np.matmul``, i.e. BLAS): indices in
    both operands and still needed are the batch, those in both and no longer needed are
    contracted, and indices only one operand has and nothing needs are summed out first.
    """
    inputs, output = subscripts.split("->")
    terms = [(s, np.asarray(t)) for s, t in zip(inputs.split(","), operands, strict=True)]
    for step in path:
        picked = [terms[k] for k in step]
        terms = [t for k, t in enumerate(terms) if k not in step]
        needed = set(output).union(*(s for s, _ in terms))
        while len(picked) > 1:
            (sx, x), (sy, y) = picked[0], picked[1]
            keep = needed.union(*(s for s, _ in picked[2:]))
            picked = [_matmul_pair(sx, x, sy, y, keep)] + picked[2:]
        s, t = picked[0]
        gone = [k for k, c in enumerate(s) if c not in needed]
        if gone:
            t, s = t.sum(axis=tuple(gone)), "".join(c for c in s if c in needed)
        terms.append((s, t))
    (s, t), = terms
    return np.transpose(t, [s.index(c) for c in output]) if s != output else t


def _matmul_pair(
    sx: str, x: np.ndarray, sy: str, y: np.ndarray, keep: set[str]
) -> tuple[str, np.ndarray]:
    """Contract two labelled tables as one batched matrix product; keep the labels in ``keep``."""
    sum_x = [k for k, c in enumerate(sx) if c not in sy and c not in keep]
    if sum_x:
        x, sx = x.sum(axis=tuple(sum_x)), "".join(c for c in sx if c in sy or c in keep)
    sum_y = [k for k, c in enumerate(sy) if c not in sx and c not in keep]
    if sum_y:
        y, sy = y.sum(axis=tuple(sum_y)), "".join(c for c in sy if c in sx or c in keep)
    batch = [c for c in sx if c in sy and c in keep]
    inner = [c for c in sx if c in sy and c not in keep]
    left = [c for c in sx if c not in sy]
    right = [c for c in sy if c not in sx]
    size = dict(zip(sx, x.shape, strict=True)) | dict(zip(sy, y.shape, strict=True))
    nb, ni = math.prod(size[c] for c in batch), math.prod(size[c] for c in inner)
    nl, nr = math.prod(size[c] for c in left), math.prod(size[c] for c in right)
    xm = np.transpose(x, [sx.index(c) for c in batch + left + inner]).reshape(nb, nl, ni)
    ym = np.transpose(y, [sy.index(c) for c in batch + inner + right]).reshape(nb, ni, nr)
    out = np.matmul(xm, ym).reshape([size[c] for c in batch + left + right])
    return "".join(batch + left + right), out


