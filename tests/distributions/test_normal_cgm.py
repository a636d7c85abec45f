"""The normal relaxation of the CGM against the exact law's moments, by enumeration.

The tables of ``normal_tables`` are affine in ``z``, so with ``z ∼ N(0, I)`` their mean is the
tables at ``z = 0`` and their covariance ``J Jᵀ`` (``J`` the Jacobian in ``z``). The CGM of ``N``
records has mean ``N μ`` and covariance ``N (P(x, x') − μ μᵀ)`` over the clique indicators, which
enumerating every record of a small domain gives exactly; they must agree to rounding.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions.normal_cgm import (
    centring_shift,
    logit_conditionals,
    normal_tables,
    normal_tables_plan,
    tree_conditionals,
)
from numpyro_dpgm.infer.bayes.conditional import conditional_coding

DOMAIN = {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2}
CLIQUES = [("a", "b"), ("c", "b"), ("b", "d"), ("d", "e"), ("a",), ("d",)]  # a tree, one-ways
TOTAL = 50.0


def _indicators(net: MarkovNetwork) -> np.ndarray:
    """Per record of the domain, its indicator vector in the network's layout."""
    attrs = list(net.domain.attrs)
    rows = []
    for x in itertools.product(*(range(net.domain[a]) for a in attrs)):
        v = np.zeros(net.num_params)
        for c in net.cliques:
            cell = np.ravel_multi_index([x[attrs.index(a)] for a in c], net.domain.shape_of(c))
            v[net.slice_of(c).start + cell] = 1.0
        rows.append(v)
    return np.array(rows)


def _exact_moments(net: MarkovNetwork, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = _indicators(net)
    logp = f @ theta
    p = np.exp(logp - logp.max())
    p /= p.sum()
    mu = f.T @ p
    return TOTAL * mu, TOTAL * (f.T @ (p[:, None] * f) - np.outer(mu, mu))


@pytest.mark.parametrize("normalized", [False, True])
def test_mean_and_covariance_are_the_cgm_s(normalized):
    net = MarkovNetwork(DOMAIN, CLIQUES)
    plan = normal_tables_plan(net)
    rng = np.random.default_rng(3)
    if normalized:  # the conditional coding's θ: log conditionals, A(θ) = 0
        coding = conditional_coding(net)
        theta = np.asarray(coding.to_theta(rng.normal(0.0, 1.5, coding.dim)))
    else:
        theta = rng.normal(0.0, 1.5, net.num_params)

    def tables(z):
        conds = tree_conditionals(plan, jnp.asarray(theta), normalized)
        return normal_tables(plan, conds, TOTAL, z)

    z0 = jnp.zeros(plan.dim)
    jac = np.asarray(jax.jacobian(tables)(z0))
    mean, cov = _exact_moments(net, theta)
    np.testing.assert_allclose(np.asarray(tables(z0)), mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(jac @ jac.T, cov, rtol=0, atol=1e-10)


def test_tables_are_consistent_for_any_z():
    net = MarkovNetwork(DOMAIN, CLIQUES)
    plan = normal_tables_plan(net)
    theta = jnp.asarray(np.random.default_rng(0).normal(size=net.num_params))
    z = jnp.asarray(np.random.default_rng(1).normal(0.0, 3.0, plan.dim))
    t = net.unflatten(normal_tables(plan, tree_conditionals(plan, theta), TOTAL, z))
    for c in net.cliques:
        assert float(jnp.sum(t[c])) == pytest.approx(TOTAL, abs=1e-9)
    shared = {("a",): [("a", "b")], ("b",): [("a", "b"), ("c", "b"), ("b", "d")],
              ("d",): [("b", "d"), ("d", "e"), ("d",)]}
    for attr, cliques in shared.items():
        margins = [np.asarray(t[c]).sum(axis=tuple(i for i, a in enumerate(c) if a != attr[0]))
                   for c in cliques]
        for m in margins[1:]:
            np.testing.assert_allclose(m, margins[0], atol=1e-9)


def test_centring_shift_moves_the_tables_to_the_reference():
    """``w = 0``: ``z = z̃ − D`` with ``z̃ = 0`` puts every row at ``N μ_S(s) p₀(· | s)``
    (the root, whose ``n_S = N μ_S = N``); ``w = 1``: no shift."""
    net = MarkovNetwork({"a": 3, "b": 2}, [("a", "b")])
    plan = normal_tables_plan(net)
    theta = jnp.asarray(np.random.default_rng(2).normal(size=net.num_params))
    ref = np.random.default_rng(4).dirichlet(np.ones(plan.dim))  # one block: the root
    conds = tree_conditionals(plan, theta)
    shift = centring_shift(plan, conds, TOTAL, jnp.zeros(plan.dim), jnp.asarray(ref))
    n = normal_tables(plan, conds, TOTAL, -shift)
    block = plan.blocks[0]
    np.testing.assert_allclose(np.asarray(n)[block.to_rows], TOTAL * ref, atol=1e-10)
    none = centring_shift(plan, conds, TOTAL, jnp.ones(plan.dim), jnp.asarray(ref))
    assert float(jnp.max(jnp.abs(none))) == 0.0


def test_the_conditional_coding_s_logits_give_its_conditionals():
    """``logit_conditionals`` of the coding's ``block_logits`` equal ``tree_conditionals`` of
    its normalised ``θ`` (the two routes of the model)."""
    net = MarkovNetwork(DOMAIN, CLIQUES)
    plan = normal_tables_plan(net)
    coding = conditional_coding(net, {"b": 2, "d": 1})
    beta = jnp.asarray(np.random.default_rng(6).normal(0.0, 2.0, coding.dim))
    direct = logit_conditionals(plan, coding.block_logits(beta))
    via_theta = tree_conditionals(plan, coding.to_theta(beta), normalized=True)
    calibrated = tree_conditionals(plan, coding.to_theta(beta))
    for (m1, c1), (_, c2), (m3, c3) in zip(direct, via_theta, calibrated, strict=True):
        np.testing.assert_allclose(c1, c2, atol=1e-12)
        np.testing.assert_allclose(c1, c3, atol=1e-12)
        np.testing.assert_allclose(m1, m3, atol=1e-12)


def test_not_decomposable_is_refused():
    net = MarkovNetwork({"a": 2, "b": 2, "c": 2, "d": 2},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
    with pytest.raises(ValueError, match="decomposable"):
        normal_tables_plan(net)
