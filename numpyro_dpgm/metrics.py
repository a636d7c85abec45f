"""Accuracy measures between models and tables."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._jit import device_array
from .distributions.mrf import MarkovRandomField
from .network import MarkovNetwork
from .oracles import junction_tree as jt
from .tables import CliqueTables, project_table

__all__ = ["kl_divergence", "embed_theta", "total_variation", "marginal_l1_error",
           "noisy_tables_l1"]


def embed_theta(source: MarkovNetwork, theta: Any, target: MarkovNetwork) -> Any:
    """Re-express ``source``'s log-potentials in ``target``'s layout.

    Every clique of ``source`` must have a clique of ``target`` with the same attributes (any
    order); cliques of ``target`` without a counterpart get zero log-potentials.
    """
    if source.domain != target.domain:
        raise ValueError("networks over different domains cannot share parameters")
    traced = isinstance(theta, jax.core.Tracer)
    tables = source.unflatten(theta if traced else np.asarray(theta))
    by_set = {frozenset(c): c for c in source.cliques}
    have = {frozenset(t) for t in target.cliques}
    missing = [c for c in source.cliques if frozenset(c) not in have]
    if missing:
        raise ValueError(f"target network lacks clique(s) {missing}")
    xp: Any = jnp if traced else np  # on the host: no program per structure
    parts = []
    for c, shape in zip(target.cliques, target.shapes, strict=True):
        src = by_set.get(frozenset(c))
        parts.append(xp.zeros(math.prod(shape), dtype=jnp.result_type(theta)) if src is None
                     else xp.ravel(project_table(xp.asarray(tables[src]), src, c)))  # transposes
    return xp.concatenate(parts) if traced else device_array(np.concatenate(parts))


def kl_divergence(p: MarkovRandomField, q: MarkovRandomField) -> Any:
    """Exact ``KL(p_θ ‖ p_φ) = (θ − φ)·μ(θ) − A(θ) + A(φ)``.

    Both models are re-expressed on the union of their cliques (zero log-potentials where a
    clique is absent), so the identity holds with one junction tree. Unbatched models only.
    """
    for m in (p, q):
        if not isinstance(m, MarkovRandomField):
            raise TypeError(f"kl_divergence expects MarkovRandomField, got {type(m).__name__}")
        if m.batch_shape:
            raise ValueError("kl_divergence takes unbatched models; use jax.vmap over theta")
    if p.network.domain != q.network.domain:
        raise ValueError("models over different domains: KL is undefined")
    union = p.network.with_cliques(q.network.cliques)
    theta = embed_theta(p.network, p.theta, union)
    phi = embed_theta(q.network, q.theta, union)
    mu = union.flatten(jt.marginals(union, theta))
    return (jnp.dot(theta - phi, mu) - jt.log_partition(union, theta)
            + jt.log_partition(union, phi))


def total_variation(p: Any, q: Any) -> Any:
    """``½ Σ |p − q|`` of two probability tables (or arrays) of the same shape."""
    p, q = jnp.asarray(p), jnp.asarray(q)
    if p.shape != q.shape:
        raise ValueError(f"tables of different shapes {p.shape} and {q.shape}")
    for name, t in (("first", p), ("second", q)):
        if not isinstance(t, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(t))):
            raise ValueError(f"the {name} table has non-finite entries (NaN or inf)")
    return 0.5 * jnp.sum(jnp.abs(p - q))


def marginal_l1_error(model: MarkovRandomField, tables: CliqueTables) -> Any:
    """Mean over cliques of ``Σ |μ_C(model) − t_C / Σ t_C|`` (L1 error of normalised tables).

    ``tables`` may cover any attribute sets, in or out of the model.
    """
    errors = []
    for c, t in tables.items():
        t = jnp.asarray(t)
        if not isinstance(t, jax.core.Tracer) and not (
            bool(jnp.all(jnp.isfinite(t))) and bool(jnp.all(t >= 0)) and float(jnp.sum(t)) > 0
        ):
            raise ValueError(
                f"the table of {c} must be finite and non-negative with a positive sum (counts "
                "or probabilities); clip or drop noisy tables before comparing"
            )
        errors.append(2 * total_variation(model.marginal(c), t / jnp.sum(t)))
    return jnp.mean(jnp.stack(errors))


def noisy_tables_l1(measurements: Any, tables: CliqueTables) -> float:
    """Mean over measurements of ``Σ |ỹ_C − t_C / Σ t_C|``, ``ỹ_C`` the noisy table clipped at 0
    and normalised: the error of the released tables themselves, the baseline of every fit.

    Every measurement must be of a whole table (no query matrix) whose clique ``tables`` holds
    in the same attribute order.

    Examples
    --------
    >>> from numpyro_dpgm.measurements import Laplace, Measurement
    >>> m = Measurement(("a",), [3.0, -1.0, 1.0], Laplace(1.0))
    >>> noisy_tables_l1([m], CliqueTables({("a",): np.array([2.0, 1.0, 1.0])}))
    0.5
    """
    errors = []
    for m in measurements:
        if m.query is not None:
            raise ValueError(f"the measurement of {m.clique} answers a query matrix; "
                             "noisy_tables_l1 compares whole noisy tables only")
        t = np.asarray(tables[m.clique], dtype=float).ravel()
        y = np.clip(np.asarray(m.values, dtype=float).ravel(), 0, None)
        if y.shape != t.shape:
            raise ValueError(f"the measurement of {m.clique} has {y.size} values, its table "
                             f"{t.size} cells")
        errors.append(float(np.abs(y / max(y.sum(), 1e-12) - t / t.sum()).sum()))
    return float(np.mean(errors))
