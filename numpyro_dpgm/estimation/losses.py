"""Measurement losses: the negative log-likelihood of noisy linear measurements of marginals.

Shared by the estimators (Prox-PGM's loss ``L(μ)``, CGM-EM's evidence ``log p(y | n)``). For a
measurement ``y_M = Q_M n_{C_M} + noise`` the term is (seed 003, §3 below Problem 1)

* ``"l2"``: ``½‖Q_M μ_{C_M} − y_M‖² / σ_M²`` with ``σ_M²`` the noise variance;
* ``"l1"``: ``‖Q_M μ_{C_M} − y_M‖₁ / b_M`` with ``b_M`` the Laplace scale (``σ`` for Gaussian);

and ``"auto"`` picks ``"l1"`` for (discrete) Laplace noise and ``"l2"`` for (discrete) Gaussian.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import device_array
from ..domain import Clique, Domain
from ..measurements import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace, Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..tables import project_table, projection_index

__all__ = [
    "LAPLACE_FAMILY",
    "LossTerm",
    "MeasurementEvidence",
    "TermData",
    "TermGroup",
    "build_terms",
    "check_measurements",
    "expected_noise_loss",
    "group_answers",
    "group_terms",
    "grouped_loss",
    "lipschitz_bound",
    "measurement_loss",
    "measurement_nll",
    "term_answers",
    "term_cells",
    "terms_loss",
]

Array = Any


#: The noise classes whose loss is the L1 norm over their scale.
LAPLACE_FAMILY = (Laplace, DiscreteLaplace)
_GAUSSIAN_FAMILY = (Gaussian, DiscreteGaussian)


class LossTerm(NamedTuple):
    """Static description of one measurement's loss term (hashable)."""

    clique: Clique  # the measured attributes, in the measurement's order
    slot: int  # index of the network clique its table is projected from
    kind: str  # "l1" or "l2"
    has_query: bool


class TermData(NamedTuple):
    """Array data of one loss term (a pytree)."""

    values: Array
    query: Array | None
    weight: Array  # 1/σ² (l2) or 1/b (l1)
    laplace_scale: float = 0.0  # b of Laplace-family noise, 0 for Gaussian-family noise


def measurement_loss(measurement: Measurement, kind: str = "auto") -> tuple[str, float]:
    """Loss kind and weight of one measurement.

    Parameters
    ----------
    measurement : Measurement
    kind : {"auto", "l1", "l2"}
        ``"auto"`` picks ``"l1"`` for Laplace-family noise and ``"l2"`` for Gaussian-family
        noise (the noise's negative log-likelihood up to constants).

    Returns
    -------
    kind : str
        ``"l1"`` or ``"l2"``.
    weight : float
        ``1/σ²`` for ``"l2"`` (``σ²`` is the noise variance, e.g. ``2b²`` for Laplace(b)), so
        that the term is ``½‖(Qμ − y)/σ‖²``; ``1/b`` for ``"l1"`` (``b`` the Laplace scale, or
        ``σ`` for Gaussian noise), so that the term is ``‖Qμ − y‖₁/b``.
    """
    noise = measurement.noise
    if kind == "auto":
        kind = "l1" if isinstance(noise, LAPLACE_FAMILY) else "l2"
    if kind == "l2":
        return "l2", 1.0 / noise.variance
    if kind == "l1":
        scale = noise.scale if isinstance(noise, LAPLACE_FAMILY) else noise.sigma
        return "l1", 1.0 / scale
    raise ValueError(f"unknown loss {kind!r}; use 'auto', 'l1', 'l2' or a callable")


def expected_noise_loss(measurements: Sequence[Measurement], kind: str = "l2") -> float:
    """``E[L(n)] = Σ_M E[ℓ_M(noise_M)]``: the loss of the true tables, in expectation over the
    noise, the level of Morozov's discrepancy principle.

    An ``"l2"`` term ``½‖r‖²/σ²`` has expectation ``½`` per answer (``σ²`` the noise variance;
    for discrete Gaussian noise an upper bound of the variance, so slightly less); an ``"l1"``
    term ``‖r‖₁/b`` has ``1`` per answer under Laplace noise of scale ``b`` and ``√(2/π)`` under
    Gaussian noise with ``b = σ`` (the continuous values, close for the discrete variants).

    Parameters
    ----------
    measurements : sequence of Measurement
    kind : {"l2", "l1", "auto"}
        The loss (:func:`measurement_loss`).

    Returns
    -------
    float

    Examples
    --------
    >>> from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
    >>> ms = [Measurement(("a",), [3.0, 1.0], Laplace(2.0)),
    ...       Measurement(("b",), [1.0, 2.0, 3.0], Gaussian(1.0))]
    >>> expected_noise_loss(ms), expected_noise_loss(ms, "auto")
    (2.5, 3.5)
    """
    total = 0.0
    for m in measurements:
        loss_kind, _ = measurement_loss(m, kind)
        per_answer = 0.5 if loss_kind == "l2" else (
            1.0 if isinstance(m.noise, LAPLACE_FAMILY) else math.sqrt(2.0 / math.pi))
        total += per_answer * int(np.size(m.values))
    return total


@jax.custom_jvp
def _abs(x: Array) -> Array:
    """``|x|`` with the minimum-norm subgradient ``0`` at ``x = 0``."""
    return jnp.abs(x)


@_abs.defjvp
def _abs_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    (x,), (t,) = primals, tangents
    return jnp.abs(x), jnp.sign(x) * t


def _smallest_containing(
    network: MarkovNetwork, clique: Clique, holders: dict[str, set[int]]
) -> int | None:
    """The smallest network clique containing ``clique`` (``holders``: attribute -> cliques)."""
    every = set(range(len(network.cliques)))
    found = set.intersection(every, *(holders.get(a, set()) for a in clique))
    return min(found, key=lambda i: (network.sizes[i], i)) if found else None


def _holders(network: MarkovNetwork) -> dict[str, set[int]]:
    """The network cliques holding each attribute."""
    out: dict[str, set[int]] = {}
    for i, c in enumerate(network.cliques):
        for a in c:
            out.setdefault(a, set()).add(i)
    return out


def check_measurements(measurements: Any, domain: Domain) -> tuple[Measurement, ...]:
    if isinstance(measurements, Measurement):
        measurements = [measurements]
    if isinstance(measurements, str | bytes) or not isinstance(measurements, Iterable):
        raise TypeError("measurements must be a sequence of Measurement")
    out = []
    for k, m in enumerate(measurements):
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements[{k}] is a {type(m).__name__}, not a Measurement")
        clique = domain.check_clique(m.clique)
        cells = domain.size(clique)
        if m.query is None and m.values.size != cells:
            raise ValueError(
                f"measurement {k} of {clique} has {m.values.size} values; an identity query of "
                f"that clique has {cells} cells (shape {domain.shape_of(clique)})"
            )
        if m.query is not None and m.query.shape[1] != cells:
            raise ValueError(
                f"measurement {k} of {clique}: the query has {m.query.shape[1]} columns; the "
                f"clique table has {cells} cells (shape {domain.shape_of(clique)})"
            )
        out.append(m)
    return tuple(out)


def build_terms(
    network: MarkovNetwork, measurements: Sequence[Measurement], kind: str
) -> tuple[tuple[LossTerm, ...], tuple[TermData, ...]]:
    terms, data = [], []
    holders = _holders(network)
    for k, m in enumerate(measurements):
        slot = _smallest_containing(network, m.clique, holders)
        if slot is None:
            raise ValueError(
                f"measurement {k} of {m.clique} is not contained in any clique of the network "
                f"{list(network.cliques)}"
            )
        loss_kind, weight = measurement_loss(m, kind)
        terms.append(LossTerm(tuple(m.clique), slot, loss_kind, m.query is not None))
        data.append(TermData(  # transfers: jnp.asarray would compile a program per shape
            device_array(m.values),
            None if m.query is None else device_array(m.query),
            device_array(weight),
            float(m.noise.scale) if isinstance(m.noise, LAPLACE_FAMILY) else 0.0,
        ))
    return tuple(terms), tuple(data)


def term_cells(network: MarkovNetwork, terms: tuple[LossTerm, ...], mu: Array) -> tuple[Array, ...]:
    """``μ_{C_M}`` of every term, flat: the measured cliques' tables of the flat count-scale
    marginals ``mu`` (before any query)."""
    cells = []
    for term in terms:
        start = network.offsets[term.slot]
        table = jnp.reshape(mu[start : start + network.sizes[term.slot]],
                            network.shapes[term.slot])
        cells.append(jnp.ravel(project_table(table, network.cliques[term.slot], term.clique)))
    return tuple(cells)


def term_answers(
    network: MarkovNetwork,
    terms: tuple[LossTerm, ...],
    mu: Array,
    data: tuple[TermData, ...],
) -> tuple[Array, ...]:
    """``Q_M μ_{C_M}`` of every term: the answers that flat count-scale marginals ``mu`` give
    to the measurements (flat, in the order of ``values``)."""
    return tuple(d.query @ c if term.has_query else c
                 for term, d, c in zip(terms, data, term_cells(network, terms, mu), strict=True))


def terms_loss(
    network: MarkovNetwork,
    terms: tuple[LossTerm, ...],
    mu: Array,
    data: tuple[TermData, ...],
    smooth: Array,
) -> Array:
    """``Σ_M ℓ_M(Q_M μ_{C_M} − y_M)`` for flat count-scale marginals ``mu``.

    L1 terms use the Huber function ``h_δ(r) = r²/(2δ)`` for ``|r| ≤ δ``, ``|r| − δ/2``
    otherwise, with ``δ = smooth·b_M`` (the exact ``|r|`` when ``smooth == 0``), so that
    ``ℓ_M − (smooth/2)·m_M ≤ ℓ_M^smooth ≤ ℓ_M`` for ``m_M`` answers.
    """
    total = jnp.zeros((), dtype=mu.dtype)
    for term, d, pred in zip(terms, data, term_answers(network, terms, mu, data), strict=True):
        r = pred - d.values
        if term.kind == "l2":
            total = total + 0.5 * d.weight * jnp.vdot(r, r)
        else:
            delta = jnp.where(smooth > 0, smooth / d.weight, 1.0)
            a = _abs(r)
            huber = jnp.where(a <= delta, 0.5 * r * r / delta, a - 0.5 * delta)
            total = total + d.weight * jnp.sum(jnp.where(smooth > 0, huber, a))
    return total


class TermGroup(NamedTuple):
    """The array data of loss terms of one kind and shape, stacked (a pytree).

    ``T`` rows, each reading ``c`` cells of measured tables, each the sum of ``f`` cells of
    the flat marginals (``f`` = the network clique's cells over the measured clique's), with
    ``k`` answers (``k = c`` without a query). Terms without a query are concatenated into one
    row per kind and ``f`` (:func:`group_terms`), so their weights are per answer.
    """

    index: Array  # (T, c, f) int32: positions in the flat marginals summed into each cell
    values: Array  # (T, k)
    query: Array | None  # (T, k, c), or None for identity queries
    weight: Array  # (T, k): 1/σ² (l2) or 1/b (l1) of each answer
    laplace_scale: Array  # (T, k): b of Laplace-family noise, 0 for Gaussian-family noise


def _diagonal(query: Any) -> np.ndarray | None:
    """The diagonal of a square diagonal query with no zero on it, else ``None``."""
    q = np.asarray(query)
    if q.ndim != 2 or q.shape[0] != q.shape[1]:
        return None
    d = np.diag(q).copy()
    if np.any(d == 0) or np.any(q != np.diag(d)):
        return None
    return d


def group_terms(
    network: MarkovNetwork, terms: tuple[LossTerm, ...], data: tuple[TermData, ...]
) -> tuple[tuple[str, ...], tuple[TermGroup, ...]]:
    """Stack the loss terms into groups of one kind and shape (for :func:`grouped_loss`).

    The loss is then a fixed number of array operations, one set per group, however many
    measurements there are, and its index arrays are data (a pytree), not constants. Terms
    without a query are concatenated along their cells into one row per loss kind and ``f``,
    whatever their tables' sizes: a model whose measurements cover its own cliques (the
    mechanisms') has one or two groups, and its programs compile in a fraction of the time
    one group per table size took. A diagonal query ``D`` (MST's compressed one-way tables)
    is the identity on ``y/D`` with weight ``D²/σ²`` (L2) or ``|D|/b`` and scale ``b/|D|``
    (L1): the same loss, the same whitened residuals.

    Returns
    -------
    kinds : tuple of str
        ``"l1"`` or ``"l2"`` per group (static).
    groups : tuple of TermGroup
        The groups' data, in order of first appearance.
    """
    index_of: dict[tuple[int, Clique], np.ndarray] = {}
    parts: dict[tuple[Any, ...], list[tuple[np.ndarray, Any, Any, Any, Any]]] = {}
    for term, d in zip(terms, data, strict=True):
        key = (term.slot, term.clique)
        if key not in index_of:
            proj = projection_index(network.shapes[term.slot], network.cliques[term.slot],
                                    term.clique)
            cells = network.domain.size(term.clique)
            index_of[key] = (network.offsets[term.slot]
                             + np.argsort(proj, kind="stable").reshape(cells, -1))
        idx = index_of[key]
        values, weight, scale = np.asarray(d.values, dtype=float), float(d.weight), d.laplace_scale
        query = None if d.query is None else np.asarray(d.query)
        diag = None if query is None else _diagonal(query)
        if diag is not None:
            values, query = values / diag, None
            weight = weight * (diag * diag if term.kind == "l2" else np.abs(diag))
            scale = scale / np.abs(diag)
        k = values.size
        row = (idx, values, query, np.broadcast_to(weight, (k,)), np.broadcast_to(scale, (k,)))
        if query is None:  # one row per kind and f
            parts.setdefault((term.kind, idx.shape[1], None), []).append(row)
        else:
            parts.setdefault((term.kind, idx.shape, query.shape), []).append(row)
    kinds, groups = [], []
    for (kind, _, shape_q), members in parts.items():
        kinds.append(kind)
        if shape_q is None:
            members = [tuple(np.concatenate([m[j] for m in members]) if j != 2 else None
                             for j in range(5))]
        index, values, query, weight, scale = (
            None if shape_q is None and j == 2 else np.stack([m[j] for m in members])
            for j in range(5))
        groups.append(TermGroup(
            device_array(index.astype(np.int32)), device_array(values),
            None if query is None else device_array(query),
            device_array(weight.astype(float)), device_array(scale.astype(float))))
    return tuple(kinds), tuple(groups)


def group_answers(mu: Array, groups: tuple[TermGroup, ...]) -> tuple[Array, ...]:
    """The answers ``Q_M μ_{C_M}`` of each group's terms at flat count-scale marginals ``mu``,
    one array ``(T, k)`` per group (the predictions that :func:`grouped_loss` compares with
    the groups' ``values``)."""
    out = []
    for g in groups:
        pred = jnp.sum(mu.at[g.index].get(mode="promise_in_bounds"), axis=-1)
        if g.query is not None:
            pred = jnp.einsum("tkc,tc->tk", g.query, pred)
        out.append(pred)
    return tuple(out)


def grouped_loss(
    kinds: tuple[str, ...], mu: Array, groups: tuple[TermGroup, ...], smooth: Array
) -> Array:
    """:func:`terms_loss` of the groups of :func:`group_terms` (equal up to rounding)."""
    total = jnp.zeros((), dtype=mu.dtype)
    for kind, g, pred in zip(kinds, groups, group_answers(mu, groups), strict=True):
        r = pred - g.values
        w = g.weight.astype(mu.dtype)
        if kind == "l2":
            total = total + 0.5 * jnp.sum(w * r * r)
        else:
            delta = jnp.where(smooth > 0, smooth / w, 1.0)
            a = _abs(r)
            huber = jnp.where(a <= delta, 0.5 * r * r / delta, a - 0.5 * delta)
            total = total + jnp.sum(w * jnp.where(smooth > 0, huber, a))
    return total


def lipschitz_bound(
    network: MarkovNetwork, terms: tuple[LossTerm, ...], data: tuple[TermData, ...]
) -> float:
    """Upper bound on the Lipschitz constant of ``∇L`` (count scale).

    The Hessian of the L2 part is block diagonal over network cliques,
    ``H_C = Σ_{M→C} w_M (Q_M P_M)ᵀ(Q_M P_M)`` with ``P_M`` the projection of clique ``C``'s
    table onto ``C_M`` (``‖P_M‖² = |C|/|C_M|``), so
    ``λ_max(H) ≤ max_C Σ_{M→C} w_M ‖Q_M‖² |C|/|C_M|``; equality for identity queries. L1 terms
    contribute the same expression with ``w_M = 1/b_M²`` (the curvature of an L2 term whose
    noise scale is ``b_M``): a heuristic starting point that the line search corrects.
    """
    blocks: dict[int, float] = {}
    for term, d in zip(terms, data, strict=True):
        q2 = 1.0 if not term.has_query else float(np.linalg.norm(np.asarray(d.query), 2) ** 2)
        w = float(d.weight) if term.kind == "l2" else float(d.weight) ** 2
        ratio = network.sizes[term.slot] / network.domain.size(term.clique)
        blocks[term.slot] = blocks.get(term.slot, 0.0) + w * q2 * ratio
    return max(blocks.values()) if blocks else 1.0


def measurement_nll(network: MarkovNetwork, measurements: Sequence[Measurement],
                    total: float) -> Any:
    """``θ ↦ L(N·μ(θ))``: the measurements' negative log-likelihood (up to a constant, the
    ``"auto"`` loss of Prox-PGM: L1 for Laplace-family, L2 for Gaussian-family noise) at the
    expected counts of the model with log-potentials ``θ``, as a float.

    The common ``loss_trace`` of the EM estimators (one value per iterate ``θ_k``). One
    compiled program per network and loss terms: the values, weights and total are its data.
    """
    terms, data = build_terms(network, measurements, "auto")
    total_arr = jnp.asarray(float(total))
    return lambda theta: float(_nll(network, terms, jnp.asarray(theta), data, total_arr))


@partial(jax.jit, static_argnums=(0, 1))
def _nll(network: MarkovNetwork, terms: tuple[LossTerm, ...], theta: Array,
         data: tuple[TermData, ...], total: Array) -> Array:
    mu = network.flatten(jt.marginals(network, theta)) * total
    return terms_loss(network, terms, mu, data, jnp.asarray(0.0, mu.dtype))


class MeasurementEvidence(NamedTuple):
    """``log p(y | n)`` of a list of measurements, up to a constant (hashable, static).

    Laplace-family noise gives ``−‖Q n_C − y‖₁ / b`` per measurement, Gaussian-family noise
    ``−‖Q n_C − y‖² / (2σ²)``; discrete noise is treated as its continuous counterpart.
    Call as ``evidence(n, data, smoothing)`` with ``data`` from :meth:`build`; ``smoothing > 0``
    replaces ``|r|`` of Laplace terms by a Huber function of width ``smoothing·b``.
    """

    network: MarkovNetwork
    terms: tuple[LossTerm, ...]

    @classmethod
    def build(
        cls, network: MarkovNetwork, measurements: Sequence[Measurement]
    ) -> tuple[MeasurementEvidence, Any]:
        terms, data = build_terms(network, measurements, "auto")
        return cls(network, terms), data

    def __call__(self, n: Array, data: Any, smoothing: Array = 0.0) -> Array:
        return -terms_loss(self.network, self.terms, n, data, jnp.asarray(smoothing))
