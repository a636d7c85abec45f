"""Flat layout of Convex-GBP: every region table and every message lives in one vector.

Region ``r``'s table (C order over its attributes in domain order) occupies cells
``region_offsets[r] : region_offsets[r] + size_r`` of a vector of length ``num_cells``; the
message of edge ``e = (p, t)`` (a table over ``t``) occupies ``message_offsets[e] : ... + size_t``
of the message vector. Every sum over neighbours and every projection is a dense reduction of a
gathered index matrix padded with a neutral element. For the two big reductions (ψ and the
projections' log-sum-exps) rows are ordered so that rows of similar width are contiguous
("buckets", each padded to its largest width), so each reduction is one gather per bucket and no
scatter or permutation is needed. A sweep is therefore a small, fixed number of array operations
whatever the graph: XLA's compile time does not grow with the number of regions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..domain import Clique, Domain
from ..tables import projection_index
from .region_graph import RegionGraph, width_bucket

Array = Any

class Plan(NamedTuple):
    """A bucketed reduction over contiguous rows: ``out = concat_b(reduce(x[index[b]]))``.

    ``index[b]`` is the ``(n_b, w_b)`` index matrix of bucket ``b`` (padding points past the
    end of ``x``, where a neutral element is appended); ``sign[b]`` (sums only) multiplies the
    entries; ``scale[b]`` (log-sum-exp only) holds per-row counting numbers ``κ`` for
    ``κ log Σ exp(·/κ)``.
    """

    index: tuple[Array, ...]
    sign: tuple[Array, ...]
    scale: tuple[Array, ...]


class Layout(NamedTuple):
    """Device-resident index arrays of a region graph (see :func:`_host_layout`)."""

    theta_src: Array
    param_dst: Array
    psi: Plan
    fan: Plan
    par: Plan
    region: Plan
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
    return projection_index(domain.shape_of(parent), parent, child)


def _pad_rows(blocks: Sequence[np.ndarray], fill: float) -> np.ndarray:
    """Stack row blocks ``(n_j, w_j)`` into one ``(Σ n_j, max w_j)`` matrix padded with ``fill``."""
    if not blocks:
        return np.zeros((0, 0))
    width = max(b.shape[1] for b in blocks)
    out = np.full((sum(b.shape[0] for b in blocks), width), fill,
                  dtype=np.result_type(*blocks))
    row = 0
    for b in blocks:
        out[row:row + b.shape[0], :b.shape[1]] = b
        row += b.shape[0]
    return out


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
        if runs and width_bucket(blocks[runs[-1][0]].shape[1]) == width_bucket(blk.shape[1]):
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
        params = off + _projection_index(domain, rg.regions[i], c)
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
def _layout(rg: RegionGraph, x64: bool) -> Layout:
    """Device copies of :func:`_host_layout` (cached per precision mode)."""
    host = _host_layout(rg)

    def dev(x: Any) -> Any:
        if isinstance(x, dict):
            return Plan(**{k: dev(v) for k, v in x.items()})
        if isinstance(x, tuple):
            return tuple(dev(v) for v in x)
        return jnp.asarray(x)

    # concrete device arrays even when first requested inside a trace (they are cached)
    with jax.ensure_compile_time_eval():
        return Layout(**{k: dev(v) for k, v in host.items()})


def device_layout(rg: RegionGraph) -> Layout:
    return _layout(rg, bool(jax.config.jax_enable_x64))
