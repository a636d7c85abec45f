"""Supports of the collective graphical model: count tables and the scaled marginal polytope."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints
from numpyro.distributions.transforms import StickBreakingTransform, Transform, biject_to

from ..domain import Clique
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..tables import project_table

__all__ = [
    "DecomposableLayout",
    "ScaledMarginalPolytope",
    "ScaledMarginalPolytopeTransform",
    "consistency_residual",
    "count_tables",
    "decomposable_layout",
    "scaled_marginal_polytope",
    "triangulated",
]


class DecomposableLayout(NamedTuple):
    """Where the junction-tree clique and separator tables of a decomposable network live.

    Attributes
    ----------
    covered : MarkovNetwork
        The network restricted to the attributes its cliques mention (attributes in no clique are
        free and sum out of the CGM).
    tree_cliques : tuple of network cliques
        For every junction-tree clique, the network clique with the same attributes.
    separators : tuple of (network clique, separator) pairs
        For every edge of the junction tree, a network clique containing the separator and the
        separator's attributes (its table is the projection).
    """

    covered: MarkovNetwork
    tree_cliques: tuple[Clique, ...]
    separators: tuple[tuple[Clique, Clique], ...]


@functools.lru_cache(maxsize=128)
def decomposable_layout(network: MarkovNetwork) -> DecomposableLayout:
    """Junction-tree layout of a decomposable network (cached); a clear error otherwise."""
    attrs = [a for a in network.domain.attrs if any(a in c for c in network.cliques)]
    covered = MarkovNetwork(network.domain.project(attrs), network.cliques)
    if not covered.is_decomposable:
        raise ValueError(
            "the CGM density and its bijection need a decomposable network (its maximal cliques "
            f"must be those of a chordal graph); {list(network.cliques)} is not. Use the network "
            "of its triangulation, MarkovNetwork(domain, build_junction_tree(network).cliques) "
            "(numpyro_dpgm.oracles), whose tables determine the original ones by projection. "
            "(EM through NLBP, cgm_em, works on any network.)"
        )
    tree = jt.build_junction_tree(covered, "min_fill")
    by_set = {frozenset(c): c for c in network.cliques}
    tree_cliques = tuple(by_set[frozenset(c)] for c in tree.cliques)
    seps = []
    for i, p in enumerate(tree.parent):
        if p >= 0:
            seps.append((tree_cliques[i], tree.separators[i]))
    return DecomposableLayout(covered, tree_cliques, tuple(seps))


@functools.lru_cache(maxsize=128)
def triangulated(network: MarkovNetwork) -> MarkovNetwork:
    """The network itself if decomposable, else the network of its junction tree's cliques.

    The latent count tables of a CGM on a network that is not decomposable live here: the tables
    of the triangulation's (min-fill) junction-tree cliques, in that network's own layout. Every
    clique of ``network`` lies inside one of them, so its table is a projection, and
    ``embed_theta`` (:mod:`numpyro_dpgm.metrics`) re-expresses ``θ`` there without changing
    ``p_θ``: the junction-tree cliques' tables are sufficient statistics of the larger family, so
    the CGM of the triangulation is exact for them.
    """
    attrs = [a for a in network.domain.attrs if any(a in c for c in network.cliques)]
    if MarkovNetwork(network.domain.project(attrs), network.cliques).is_decomposable:
        return network
    tree = jt.build_junction_tree(network, "min_fill")
    return MarkovNetwork(network.domain, [c for c in tree.cliques if len(c) > 0])


def consistency_residual(network: MarkovNetwork, n: Any, total: Any) -> Any:
    """Largest violation of the (local) marginal-polytope constraints of ``n``.

    ``max(|Σ n_C − N|, max_{C,D} |proj_{C∩D} n_C − proj_{C∩D} n_D|, max(−n))`` over the network's
    cliques, for ``n`` of shape ``(..., num_params)``. Zero on ``N·M``. On a network that is not
    decomposable, zero is necessary but not sufficient (the local polytope contains ``N·M``).
    """
    tables = network.unflatten(jnp.asarray(n))
    nb = jnp.ndim(n) - 1
    worst = [jnp.max(-jnp.asarray(n), axis=-1)]
    for c in network.cliques:
        t = tables[c]
        worst.append(jnp.abs(jnp.sum(t, axis=tuple(range(nb, nb + len(c)))) - total))
    cliques = network.cliques
    for i, c in enumerate(cliques):
        for d in cliques[i + 1 :]:
            shared = tuple(a for a in c if a in d)
            if not shared:
                continue
            pc = _project_batched(tables[c], c, shared, nb)
            pd = _project_batched(tables[d], d, shared, nb)
            worst.append(jnp.max(jnp.abs(pc - pd).reshape(pc.shape[:nb] + (-1,)), axis=-1))
    return jnp.max(jnp.stack(jnp.broadcast_arrays(*worst), axis=-1), axis=-1)


def _project_batched(table: Any, clique: tuple, target: tuple, nb: int) -> Any:
    if nb == 0:
        return project_table(table, clique, target)
    batch = (f"__batch{i}" for i in range(nb))
    full = tuple(batch) + clique
    return project_table(table, full, full[:nb] + target)


def _host(mask: Any) -> Any:
    """A concrete mask as a NumPy array (NumPyro reduces it with ``np.all``, which inside jit
    would trace a jax.Array's reduction); a traced one as it is."""
    return mask if isinstance(mask, jax.core.Tracer) else np.asarray(mask)


class _CountTables(constraints.Constraint):
    """Integer, non-negative, consistent clique count tables of ``N`` records."""

    is_discrete = True
    event_dim = 1

    def __init__(self, network: MarkovNetwork, total_count: Any, atol: float = 0.0):
        self.network = network
        self.total_count = total_count
        self.atol = atol

    def __call__(self, x: Any) -> Any:
        # evaluated at once where x and N are concrete, also inside jit (as NumPyro's own
        # constraints, written with NumPy operators, are), so that out-of-support values warn
        with jax.ensure_compile_time_eval():
            x = jnp.asarray(x)
            integer = jnp.all(jnp.equal(jnp.mod(x, 1), 0), axis=-1)
            residual = consistency_residual(self.network, x, self.total_count)
            return _host(integer & (residual <= self.atol))

    def feasible_like(self, prototype: Any) -> Any:
        """All records in cell 0 of every table (consistent on any network), in an integer
        dtype, broadcast to ``prototype``'s shape (a batch of totals along its batch axes)."""
        int_dtype = jnp.result_type(int)
        first = jnp.concatenate([
            jnp.zeros(s, int_dtype).at[0].set(1) for s in self.network.sizes
        ])
        total = jnp.asarray(self.total_count)
        if not jnp.issubdtype(total.dtype, jnp.integer):
            total = jnp.rint(total).astype(int_dtype)
        return jnp.broadcast_to(first * total[..., None], jnp.shape(prototype))

    def tree_flatten(self):
        return (self.total_count,), (("total_count",), {"network": self.network,
                                                         "atol": self.atol})

    def __repr__(self) -> str:
        return f"CountTables(cliques={list(self.network.cliques)}, N={self.total_count})"


class ScaledMarginalPolytope(_CountTables):
    """``N·M``: non-negative, consistent real tables summing to ``N`` (relaxed CGM support)."""

    is_discrete = False

    def __init__(self, network: MarkovNetwork, total_count: Any, atol: float = 1e-6):
        super().__init__(network, total_count, atol)

    def __call__(self, x: Any) -> Any:
        with jax.ensure_compile_time_eval():  # as _CountTables
            tol = self.atol * jnp.maximum(1.0, self.total_count)
            residual = consistency_residual(self.network, jnp.asarray(x), self.total_count)
            return _host(residual <= tol)

    def feasible_like(self, prototype: Any) -> Any:
        """Uniform tables (an interior point), broadcast to ``prototype``'s shape."""
        uniform = jnp.concatenate([jnp.full(s, 1.0 / s) for s in self.network.sizes])
        total = jnp.asarray(self.total_count, dtype=uniform.dtype)
        return jnp.broadcast_to(uniform * total[..., None], jnp.shape(prototype))

    def __repr__(self) -> str:
        return f"ScaledMarginalPolytope(cliques={list(self.network.cliques)}, N={self.total_count})"


def count_tables(network: MarkovNetwork, total_count: Any) -> constraints.Constraint:
    """Support of the exact CGM: integer consistent count tables of ``total_count`` records."""
    return _CountTables(network, total_count)


def scaled_marginal_polytope(
    network: MarkovNetwork, total_count: Any, atol: float = 1e-6
) -> constraints.Constraint:
    """Support of the relaxed CGM: the marginal polytope scaled by ``total_count``.

    ``atol`` is the tolerance of the consistency check, relative to ``max(1, N)``.
    """
    return ScaledMarginalPolytope(network, total_count, atol)


class ScaledMarginalPolytopeTransform(Transform):
    """Bijection from ``R^d`` onto the free coordinates of ``N·M`` of a decomposable network.

    It follows the junction tree's factorisation of the hyper-multinomial: the root clique table
    is ``N · StickBreaking(z_root)``; for every other clique ``C`` with separator ``S`` and every
    separator cell ``s``, the row ``n_C(s, ·) = n_S(s) · StickBreaking(z_{C,s})`` where ``n_S`` is
    the projection of the parent's table. Tables of cliques contained in another are projections.
    ``d = (|X_root| − 1) + Σ_C |X_S|·(|X_{C∖S}| − 1)``, and

    ``log|det J| = Σ stick-breaking terms + (|X_root| − 1)·log N
    + Σ_C (|X_{C∖S}| − 1)·Σ_s log n_S(s)``.

    The output is in the network's layout (every clique's table, raveled in C order).
    """

    domain = constraints.real_vector

    def __init__(self, network: MarkovNetwork, total_count: Any):
        self.network = network
        self.total_count = total_count
        self._plan = _transform_plan(network)

    @property
    def codomain(self) -> constraints.Constraint:
        return scaled_marginal_polytope(self.network, self.total_count)

    def _segments(self, x: Any) -> list[Any]:
        out, start = [], 0
        for step in self._plan.steps:
            size = step.rows * (step.new_size - 1)
            out.append(jnp.reshape(x[..., start:start + size],
                                   x.shape[:-1] + (step.rows, step.new_size - 1)))
            start += size
        return out

    def _forward_with_logdet(self, x: Any) -> tuple[Any, Any]:
        sb = StickBreakingTransform()
        domain = self.network.domain
        batch = x.shape[:-1]
        total = jnp.asarray(self.total_count, dtype=x.dtype)
        tables: dict[Clique, Any] = {}
        logdet = jnp.zeros(batch, dtype=x.dtype)
        for step, z in zip(self._plan.steps, self._segments(x), strict=True):
            if step.parent is None:
                n_s = jnp.broadcast_to(total, batch)[..., None]  # one "separator cell"
            else:
                parent = tables[step.parent]
                nb = len(batch)
                names = tuple(f"__b{i}" for i in range(nb))
                n_s = jnp.reshape(
                    project_table(parent, names + step.parent, names + step.sep),
                    batch + (step.rows,))
            probs = sb(z)  # batch + (rows, new_size)
            logdet = logdet + jnp.sum(sb.log_abs_det_jacobian(z, probs), axis=-1)
            logdet = logdet + (step.new_size - 1) * jnp.sum(jnp.log(n_s), axis=-1)
            rows = n_s[..., None] * probs
            shape = batch + domain.shape_of(step.sep) + domain.shape_of(step.new)
            tables[step.sep + step.new] = jnp.reshape(rows, shape)
        out = []
        nb = len(batch)
        names = tuple(f"__b{i}" for i in range(nb))
        for c in self.network.cliques:
            src = self._plan.source[c]
            out.append(jnp.reshape(project_table(tables[src], names + src, names + c),
                                   batch + (-1,)))
        return jnp.concatenate(out, axis=-1), logdet

    def __call__(self, x: Any) -> Any:
        return self._forward_with_logdet(x)[0]

    def log_abs_det_jacobian(self, x: Any, y: Any, intermediates: Any = None) -> Any:
        return self._forward_with_logdet(x)[1]

    def _inverse(self, y: Any) -> Any:
        sb = StickBreakingTransform()
        domain = self.network.domain
        batch = y.shape[:-1]
        nb = len(batch)
        names = tuple(f"__b{i}" for i in range(nb))
        tables = self.network.unflatten(y)
        parts = []
        for step in self._plan.steps:
            c = self._plan.network_clique[step.sep + step.new]
            t = project_table(tables[c], names + c, names + step.sep + step.new)
            rows = jnp.reshape(t, batch + (step.rows, step.new_size))
            probs = rows / jnp.sum(rows, axis=-1, keepdims=True)
            parts.append(jnp.reshape(sb._inverse(probs), batch + (-1,)))
        del domain
        return jnp.concatenate(parts, axis=-1)

    def forward_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:-1] + (self.network.num_params,)

    def inverse_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:-1] + (self._plan.dim,)

    def tree_flatten(self):
        return (self.total_count,), (("total_count",), {"network": self.network,
                                                         "_plan": self._plan})

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ScaledMarginalPolytopeTransform)
                and other.network == self.network and other.total_count is self.total_count)


class _Step(NamedTuple):
    sep: Clique  # separator attributes (domain order); () at a root
    new: Clique  # the clique's other attributes (domain order)
    parent: Clique | None  # key (sep + new of the parent step) of the parent table
    rows: int
    new_size: int


class _Plan(NamedTuple):
    steps: tuple[_Step, ...]
    source: dict  # network clique -> key of the step table it is projected from
    network_clique: dict  # step key -> a network clique with the same attributes
    dim: int


@functools.lru_cache(maxsize=128)
def _transform_plan(network: MarkovNetwork) -> _Plan:
    layout = decomposable_layout(network)
    tree = jt.build_junction_tree(layout.covered, "min_fill")
    domain = network.domain
    keys: list[Clique] = [()] * len(tree.cliques)
    steps = []
    for i in tree.order:
        clique = tree.cliques[i]
        sep = tree.separators[i] if tree.parent[i] >= 0 else ()
        new = tuple(a for a in clique if a not in sep)
        keys[i] = sep + new
        parent = keys[tree.parent[i]] if tree.parent[i] >= 0 else None
        steps.append(_Step(sep, new, parent, domain.size(sep), domain.size(new)))
    by_set = {frozenset(k): k for k in keys}
    source = {}
    for c in network.cliques:
        holder = next(k for k in keys if set(c) <= set(k))
        source[c] = holder
    network_clique = {by_set[frozenset(c)]: c for c in layout.tree_cliques}
    dim = sum(s.rows * (s.new_size - 1) for s in steps)
    return _Plan(tuple(steps), source, network_clique, dim)


@biject_to.register(ScaledMarginalPolytope)
def _biject_scaled_marginal_polytope(constraint: ScaledMarginalPolytope) -> Transform:
    return ScaledMarginalPolytopeTransform(constraint.network, constraint.total_count)
