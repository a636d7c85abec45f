"""CliqueTables: arithmetic, projection and the pytree contract."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from numpyro_dpgm import CliqueTables
from numpyro_dpgm.tables import project_table

RNG = np.random.default_rng(0)
A = {("a", "b"): RNG.normal(size=(2, 3)), ("c",): RNG.normal(size=(4,)),
     ("b", "c", "a"): RNG.normal(size=(3, 4, 2))}
B = {c: RNG.uniform(1, 2, size=v.shape) for c, v in A.items()}


def _check(result: CliqueTables, expected: dict) -> None:
    assert isinstance(result, CliqueTables) and list(result) == list(expected)
    for c, v in expected.items():
        np.testing.assert_allclose(result[c], v, rtol=1e-12, atol=1e-14)


def test_mapping_protocol() -> None:
    t = CliqueTables(A)
    assert len(t) == 3 and list(t) == list(A) and t.cliques == tuple(A)
    assert ("c",) in t and ("b", "a") not in t
    np.testing.assert_array_equal(t[["a", "b"]], A[("a", "b")])
    with pytest.raises(KeyError, match=r"no table for clique \('b', 'a'\)"):
        t[("b", "a")]
    with pytest.raises(ValueError, match="one per attribute"):
        CliqueTables({("a", "b"): np.zeros(3)})
    assert "shape (3, 4, 2)" in repr(t)


def test_arithmetic() -> None:
    t, u = CliqueTables(A), CliqueTables(B)
    _check(t + u, {c: A[c] + B[c] for c in A})
    _check(t - u, {c: A[c] - B[c] for c in A})
    _check(t * u, {c: A[c] * B[c] for c in A})
    _check(t / u, {c: A[c] / B[c] for c in A})
    _check(t + 2.0, {c: A[c] + 2 for c in A})
    _check(2.0 + t, {c: 2 + A[c] for c in A})
    _check(3.0 - t, {c: 3 - A[c] for c in A})
    _check(t - 3.0, {c: A[c] - 3 for c in A})
    _check(2.5 * t, {c: 2.5 * A[c] for c in A})
    _check(t / 4.0, {c: A[c] / 4 for c in A})
    _check(-t, {c: -A[c] for c in A})
    _check(t.map(np.exp), {c: np.exp(A[c]) for c in A})
    np.testing.assert_allclose(t.dot(u), sum(float((A[c] * B[c]).sum()) for c in A), rtol=1e-14)
    np.testing.assert_allclose(t.sum(), sum(float(v.sum()) for v in A.values()), rtol=1e-14)
    totals = u.totals()
    for c in B:
        np.testing.assert_allclose(totals[c], B[c].sum(), rtol=1e-14)
    reordered = CliqueTables({c: B[c] for c in reversed(list(B))})
    with pytest.raises(ValueError, match="different cliques"):
        t + reordered
    with pytest.raises(ValueError, match="different cliques"):
        t.dot(CliqueTables({("c",): B[("c",)]}))


def test_project() -> None:
    t = CliqueTables(A)
    abc = A[("b", "c", "a")]
    np.testing.assert_allclose(t.project(("a", "c")), abc.sum(axis=0).T, rtol=1e-14)
    np.testing.assert_allclose(t.project(("c",)), A[("c",)])  # first table containing it
    np.testing.assert_allclose(t.project(("b",)), A[("a", "b")].sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(t.project(("a", "b", "c")), np.transpose(abc, (2, 0, 1)))
    with pytest.raises(KeyError, match="no table contains"):
        CliqueTables({("a", "b"): A[("a", "b")]}).project(("a", "c"))


def test_project_table() -> None:
    abc = A[("b", "c", "a")]
    clique = ("b", "c", "a")
    np.testing.assert_allclose(project_table(abc, clique, ("a", "b")), abc.sum(axis=1).T,
                               rtol=1e-14)
    np.testing.assert_array_equal(project_table(abc, clique, clique), abc)
    np.testing.assert_allclose(project_table(abc, clique, ()), abc.sum(), rtol=1e-14)
    big = 700.0 + abc  # exp overflows float64: the log projection must stay in log space
    np.testing.assert_allclose(project_table(big, clique, ("c",), log=True),
                               logsumexp(big, axis=(0, 2)), rtol=1e-14)
    np.testing.assert_allclose(project_table(jnp.asarray(abc), clique, ("a", "c")),
                               abc.sum(axis=0).T, rtol=1e-14)
    with pytest.raises(ValueError, match=r"\['z'\] not in it"):
        project_table(abc, clique, ("a", "z"))


def test_pytree_round_trip() -> None:
    t = CliqueTables({c: jnp.asarray(v) for c, v in A.items()})
    leaves, treedef = jax.tree.flatten(t)
    assert len(leaves) == 3
    for leaf, c in zip(leaves, A, strict=True):
        np.testing.assert_array_equal(leaf, A[c])
    back = jax.tree.unflatten(treedef, leaves)
    assert isinstance(back, CliqueTables) and list(back) == list(A)
    _check(jax.tree.map(lambda x: 2 * x, t), {c: 2 * A[c] for c in A})
    out = jax.jit(lambda x, y: x * y + 1.0)(t, CliqueTables(B))
    _check(out, {c: A[c] * B[c] + 1 for c in A})
    total = jax.jit(lambda x: x.sum())(t)
    np.testing.assert_allclose(total, sum(float(v.sum()) for v in A.values()), rtol=1e-14)
    stacked = jax.tree.map(lambda x: jnp.stack([x, -x]), t)
    sums = jax.vmap(lambda x: x.project(("a",)))(stacked)
    np.testing.assert_allclose(sums[0], A[("a", "b")].sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(sums[1], -A[("a", "b")].sum(axis=1), rtol=1e-14)
    grads = jax.grad(lambda x: (x * x).sum())(t)
    _check(grads, {c: 2 * A[c] for c in A})
