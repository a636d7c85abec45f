"""The bijection onto the scaled marginal polytope: log-Jacobian, inverse, codomain, shapes.

The reference log-Jacobian is ``jax.jacfwd`` of the forward map restricted to a set of *free
coordinates* of the output tables, followed by ``slogdet``. The free coordinates are chosen here
from a junction tree written out by hand for each case (root clique: every cell but one; every
other clique: for each separator cell, the cells of that row but one), independently of the
library's own plan; any such choice parameterises the integer points of ``N·M`` by integer
points, so the choices differ by unimodular maps and give the same ``|det J|``. Two different
dropped cells and (where the case allows) two different roots are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions.transforms import biject_to

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions.constraints import (
    ScaledMarginalPolytopeTransform,
    scaled_marginal_polytope,
)
from numpyro_dpgm.oracles import junction_tree as jt

TOL = 1e-10  # float64, tiny models


@dataclass(frozen=True)
class Case:
    """A small decomposable network with junction trees over its maximal cliques, by hand.

    Each tree lists ``(network clique, separator)`` in topological order (the root first, with
    separator ``()``); a second component of a forest is a child with separator ``()``.
    """

    name: str
    domain: tuple[tuple[str, int], ...]
    cliques: tuple[tuple[str, ...], ...]
    trees: tuple[tuple[tuple[tuple[str, ...], tuple[str, ...]], ...], ...]
    N: float = 7.0

    def network(self) -> MarkovNetwork:
        return MarkovNetwork(dict(self.domain), self.cliques)


CASES = (
    Case("single_pair", (("a", 2), ("b", 2)), (("a", "b"),),
         (((("a", "b"), ()),),), N=20.0),
    Case("chain_2_3_2", (("a", 2), ("b", 3), ("c", 2)), (("a", "b"), ("b", "c")),
         (((("a", "b"), ()), (("b", "c"), ("b",))),
          ((("b", "c"), ()), (("a", "b"), ("b",))))),
    Case("chain_4_ternary", (("a", 3), ("b", 2), ("c", 3), ("d", 2)),
         (("a", "b"), ("b", "c"), ("c", "d")),
         (((("a", "b"), ()), (("b", "c"), ("b",)), (("c", "d"), ("c",))),
          ((("c", "d"), ()), (("b", "c"), ("c",)), (("a", "b"), ("b",))))),
    Case("three_clique", (("a", 2), ("b", 3), ("c", 2)), (("a", "b", "c"),),
         (((("a", "b", "c"), ()),),)),
    Case("three_clique_reordered_with_subsets", (("a", 2), ("b", 2), ("c", 3)),
         (("c", "a", "b"), ("a",), ("b", "c")),
         (((("c", "a", "b"), ()),),)),
    Case("disconnected", (("a", 2), ("b", 2), ("c", 3), ("d", 2)),
         (("a", "b"), ("c", "d")),
         (((("a", "b"), ()), (("c", "d"), ())),
          ((("c", "d"), ()), (("a", "b"), ())))),
    Case("oneway_inside_twoway", (("a", 2), ("b", 3), ("c", 2)),
         (("a",), ("a", "b"), ("b",), ("b", "c"), ("c",)),
         (((("a", "b"), ()), (("b", "c"), ("b",))),)),
    Case("orders_differ_from_domain", (("a", 3), ("b", 2), ("c", 2)),
         (("b", "a"), ("c", "b")),
         (((("b", "a"), ()), (("c", "b"), ("b",))),
          ((("c", "b"), ()), (("b", "a"), ("b",))))),
    Case("star_with_free_attribute", (("a", 2), ("b", 3), ("c", 2), ("d", 2), ("e", 4)),
         (("b", "a"), ("b", "c"), ("d", "b")),
         (((("b", "a"), ()), (("b", "c"), ("b",)), (("d", "b"), ("b",))),
          ((("d", "b"), ()), (("b", "a"), ("b",)), (("b", "c"), ("b",))))),
    Case("two_triangles", (("a", 2), ("b", 2), ("c", 2), ("d", 3)),
         (("a", "b", "c"), ("d", "c", "b")),
         (((("a", "b", "c"), ()), (("d", "c", "b"), ("b", "c"))),
          ((("d", "c", "b"), ()), (("a", "b", "c"), ("c", "b"))))),
)


def _offsets(case: Case) -> dict[tuple[str, ...], int]:
    sizes = dict(case.domain)
    out, offset = {}, 0
    for c in case.cliques:
        out[c] = offset
        offset += math.prod(sizes[a] for a in c)
    return out


def free_coordinates(case: Case, tree: tuple, drop: str) -> np.ndarray:
    """Indices (network layout) of the free coordinates of ``tree``; ``drop`` picks which cell
    of each row is dependent (``"last"`` or ``"first"``)."""
    sizes = dict(case.domain)
    offsets = _offsets(case)
    idx = []
    for clique, sep in tree:
        shape = tuple(sizes[a] for a in clique)
        rows: dict[tuple[int, ...], list[int]] = {}
        for flat, cell in enumerate(np.ndindex(*shape)):
            key = tuple(cell[clique.index(a)] for a in sep)
            rows.setdefault(key, []).append(offsets[clique] + flat)
        for cells in rows.values():
            idx.extend(cells[:-1] if drop == "last" else cells[1:])
    return np.asarray(sorted(idx))


def full_jacobian(t: ScaledMarginalPolytopeTransform, z: jax.Array) -> np.ndarray:
    """``∂ y / ∂ z`` of every output coordinate, shape ``z.shape[:-1] + (num_params, d)``."""
    flat = jnp.reshape(z, (-1, z.shape[-1]))
    jac = jax.jit(jax.vmap(jax.jacfwd(t.__call__)))(flat)
    return np.reshape(np.asarray(jac), z.shape[:-1] + jac.shape[-2:])


def reference_logdet(
    t: ScaledMarginalPolytopeTransform, z: jax.Array, free: np.ndarray,
    jac: np.ndarray | None = None,
) -> np.ndarray:
    """``log|det ∂ y_free / ∂ z|`` by ``jacfwd`` + ``slogdet`` (batched over leading dims)."""
    jac = full_jacobian(t, z) if jac is None else jac
    sign, logdet = np.linalg.slogdet(jac[..., free, :])
    assert np.all(sign != 0)
    return logdet


def library_logdet(t: ScaledMarginalPolytopeTransform, z: jax.Array) -> Any:
    return jax.jit(lambda u: t.log_abs_det_jacobian(u, t(u)))(z)


def forward(t: ScaledMarginalPolytopeTransform, z: jax.Array) -> Any:
    return jax.jit(t.__call__)(z)


def inverse(t: ScaledMarginalPolytopeTransform, y: jax.Array) -> Any:
    return jax.jit(t._inverse)(y)


def _transform(case: Case, total: float | None = None) -> ScaledMarginalPolytopeTransform:
    net = case.network()
    t = biject_to(scaled_marginal_polytope(net, case.N if total is None else total))
    assert isinstance(t, ScaledMarginalPolytopeTransform)
    return t


def _dim(t: ScaledMarginalPolytopeTransform) -> int:
    return t.inverse_shape((t.network.num_params,))[-1]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dimension_is_that_of_the_hand_tree(case):
    t = _transform(case)
    for tree in case.trees:
        assert _dim(t) == len(free_coordinates(case, tree, "last"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_log_jacobian_matches_jacfwd_slogdet(case):
    t = _transform(case)
    d = _dim(t)
    key = jax.random.key(sum(map(ord, case.name)))
    z = jax.random.normal(key, (3, d)) * 1.5
    got = library_logdet(t, z)
    assert got.shape == (3,)
    jac = full_jacobian(t, z)
    for tree in case.trees:
        for drop in ("last", "first"):
            ref = reference_logdet(t, z, free_coordinates(case, tree, drop), jac)
            np.testing.assert_allclose(got, ref, rtol=TOL, atol=TOL, err_msg=f"{tree} {drop}")


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=lambda c: c.name)
def test_traced_total_count(case):
    """``N`` as a traced argument of a jitted function (no retrace per value)."""
    net = case.network()
    d = _dim(_transform(case))
    z = jax.random.normal(jax.random.key(3), (d,))

    @jax.jit
    def fwd(u, total):
        t = ScaledMarginalPolytopeTransform(net, total)
        y = t(u)
        return y, t.log_abs_det_jacobian(u, y)

    free = free_coordinates(case, case.trees[0], "last")
    for total in (3.0, 11.5):
        y, ld = fwd(z, jnp.asarray(total))
        t = _transform(case, total)
        np.testing.assert_allclose(y, forward(t, z), rtol=TOL, atol=TOL)
        assert float(ld) == pytest.approx(float(reference_logdet(t, z, free)), abs=TOL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_inverse_round_trips(case):
    t = _transform(case)
    net = case.network()
    d = _dim(t)
    z = jax.random.normal(jax.random.key(7), (4, d)) * 2.0
    np.testing.assert_allclose(inverse(t, forward(t, z)), z, rtol=1e-9, atol=1e-9)
    # interior tables from the model family: N·μ(θ), exactly consistent
    thetas = jax.random.normal(jax.random.key(8), (4, net.num_params))
    mu = jax.jit(jax.vmap(lambda th: net.flatten(jt.marginals(net, th))))(thetas)
    tables = case.N * mu
    u = inverse(t, tables)
    assert u.shape == (4, d)
    np.testing.assert_allclose(forward(t, u), tables, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_lands_in_codomain(case):
    t = _transform(case)
    net = case.network()
    z = jax.random.normal(jax.random.key(11), (5, _dim(t))) * 3.0
    y = forward(t, z)
    member = jax.jit(t.codomain.__call__)
    assert bool(jnp.all(member(y)))
    assert bool(jnp.all(y >= 0))
    sizes = dict(case.domain)
    for c, off in _offsets(case).items():
        size = math.prod(sizes[a] for a in c)
        np.testing.assert_allclose(np.sum(y[:, off:off + size], axis=-1), case.N, rtol=1e-12)
    # every pair of cliques agrees on its shared attributes (checked independently here)
    tables = {c: np.asarray(v) for c, v in net.unflatten(np.asarray(y)).items()}
    for i, c in enumerate(net.cliques):
        for e in net.cliques[i + 1:]:
            shared = tuple(a for a in c if a in e)
            if shared:
                pc = _marginalise(tables[c], c, shared)
                pe = _marginalise(tables[e], e, shared)
                np.testing.assert_allclose(pc, pe, rtol=1e-10, atol=1e-10)
    # a table moved off the polytope is rejected
    bumped = y.at[:, 0].add(0.5)
    assert not bool(jnp.any(member(bumped)))


def _marginalise(table: np.ndarray, clique: tuple, target: tuple) -> np.ndarray:
    """Batched projection onto ``target`` (in ``target``'s order), written with einsum."""
    letters = "pqrstuvw"
    src = "z" + "".join(letters[clique.index(a)] for a in clique)
    dst = "z" + "".join(letters[clique.index(a)] for a in target)
    return np.einsum(f"{src}->{dst}", table)


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[6]], ids=lambda c: c.name)
def test_batch_shapes(case):
    t = _transform(case)
    net = case.network()
    d = _dim(t)
    z = jax.random.normal(jax.random.key(5), (2, 3, d))
    y = forward(t, z)
    ld = library_logdet(t, z)
    assert y.shape == (2, 3, net.num_params)
    assert ld.shape == (2, 3)
    assert t.forward_shape((2, 3, d)) == (2, 3, net.num_params)
    assert t.inverse_shape((2, 3, net.num_params)) == (2, 3, d)
    assert inverse(t, y).shape == (2, 3, d)
    assert t.codomain(y).shape == (2, 3)
    flat = jnp.reshape(z, (6, d))
    y_each = jax.jit(jax.vmap(t.__call__))(flat)
    ld_each = jax.jit(jax.vmap(lambda u: t.log_abs_det_jacobian(u, t(u))))(flat)
    np.testing.assert_allclose(jnp.reshape(y, (6, -1)), y_each, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(jnp.reshape(ld, (6,)), ld_each, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(
        ld, reference_logdet(t, z, free_coordinates(case, case.trees[0], "last")),
        rtol=TOL, atol=TOL)


def test_batched_total_count():
    case = CASES[1]
    net = case.network()
    totals = jnp.asarray([3.0, 40.0])
    t = ScaledMarginalPolytopeTransform(net, totals)
    d = _dim(t)
    z = jax.random.normal(jax.random.key(2), (2, d))
    y, ld = forward(t, z), library_logdet(t, z)
    free = free_coordinates(case, case.trees[0], "last")
    for k in range(2):
        tk = _transform(case, float(totals[k]))
        np.testing.assert_allclose(y[k], forward(tk, z[k]), rtol=TOL, atol=TOL)
        assert float(ld[k]) == pytest.approx(float(reference_logdet(tk, z[k], free)), abs=TOL)


def test_log_jacobian_scales_with_total_as_documented():
    """Scaling ``N`` by ``c`` scales every separator count by ``c``, so ``log|det J|`` grows
    by ``(|X_root| − 1)·log c + Σ_C |X_S|(|X_{C∖S}| − 1)·log c = d·log c``."""
    case = CASES[2]
    z = jax.random.normal(jax.random.key(9), (_dim(_transform(case)),))
    t1, t2 = _transform(case, 5.0), _transform(case, 15.0)
    diff = float(library_logdet(t2, z) - library_logdet(t1, z))
    assert diff == pytest.approx(_dim(t1) * math.log(3.0), abs=TOL)


def test_gradient_of_log_jacobian_is_finite():
    t = _transform(CASES[2])
    z = jax.random.normal(jax.random.key(4), (_dim(t),)) * 4.0
    g = jax.jit(jax.grad(lambda u: t.log_abs_det_jacobian(u, t(u))))(z)
    assert bool(jnp.all(jnp.isfinite(g)))


def test_non_decomposable_network_raises_clearly():
    net = MarkovNetwork({"a": 2, "b": 2, "c": 2, "d": 2},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
    with pytest.raises(ValueError, match="decomposable"):
        biject_to(scaled_marginal_polytope(net, 10.0))
