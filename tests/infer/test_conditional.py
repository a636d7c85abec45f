"""The conditional coding against enumeration: normalised log conditionals, the inverse map,
reference levels, and the exact posterior with the prior on its parameters.

* ``θ = to_theta(β)`` is normalised: ``A(θ) = 0`` by the junction tree and by summing the
  enumerated joint table; each clique's ``e^θ`` is the conditional of its residual given its
  separator, computed from the enumerated joint.
* ``from_theta`` inverts it, from any gauge: ``p_{θ(β)} = p_θ`` on the enumerated joint.
* Reference levels: ``β`` is the log odds against the chosen level; bad names and levels raise.
* The CGM told that ``θ`` is normalised skips computing ``A(θ)`` and nothing else. (The exact
  posterior with the prior on ``β``, by quadrature: ``tests/infer/test_gibbs.py``.)
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.infer.bayes import noisy_marginals_model
from numpyro_dpgm.infer.bayes.coding import reference_coding
from numpyro_dpgm.infer.bayes.conditional import conditional_coding
from numpyro_dpgm.infer.bayes.model import released_reference
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.oracles import junction_tree as jt

NETWORKS = {
    "pair": MarkovNetwork({"a": 2, "b": 3}, [("a", "b")]),
    "chain with one-ways": MarkovNetwork({"a": 3, "b": 2, "c": 4, "d": 3},
                                         [("c", "b"), ("a", "b"), ("c", "d"), ("a",), ("d",)]),
    "triangles": MarkovNetwork({"a": 2, "b": 3, "c": 2, "d": 3},
                               [("a", "b", "c"), ("d", "c", "b")]),
    "forest": MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("c",)]),
}


def joint(net: MarkovNetwork, theta: np.ndarray) -> np.ndarray:
    """``Σ_C θ_C(x_C)`` for every record ``x`` of the domain, in domain order."""
    tables = net.unflatten(np.asarray(theta))
    out = np.zeros(net.domain.shape)
    for c in net.cliques:
        axes = [net.domain.attrs.index(a) for a in c]
        t = np.asarray(tables[c])
        order = np.argsort(axes)
        t = np.transpose(t, order)
        shape = [net.domain.shape[i] if i in axes else 1 for i in range(len(net.domain.attrs))]
        out = out + t.reshape(shape)
    return out


@pytest.mark.parametrize("name", list(NETWORKS))
def test_to_theta_gives_normalised_log_conditionals(name):
    net = NETWORKS[name]
    coding = conditional_coding(net)
    assert coding.dim == reference_coding(net).dim == len(coding.labels)
    beta = np.asarray(jax.random.normal(jax.random.key(0), (coding.dim,))) * 1.5
    theta = np.asarray(coding.to_theta(beta))
    log_p = joint(net, theta)
    assert abs(logsumexp(log_p)) < 1e-12
    assert abs(float(jt.log_partition(net, jnp.asarray(theta)))) < 1e-12
    p = np.exp(log_p)
    attrs = net.domain.attrs
    tables = net.unflatten(theta)
    for clique, sep, _res in coding.blocks:
        drop = tuple(i for i, a in enumerate(attrs) if a not in clique)
        marg = p.sum(axis=drop)  # axes in domain order
        kept = [a for a in attrs if a in clique]
        marg = np.transpose(marg, [kept.index(a) for a in clique])
        sep_axes = tuple(i for i, a in enumerate(clique) if a not in sep)
        cond = marg / marg.sum(axis=sep_axes, keepdims=True)
        np.testing.assert_allclose(np.exp(np.asarray(tables[clique])), cond, atol=1e-12)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_from_theta_inverts_from_any_gauge(name):
    net = NETWORKS[name]
    coding = conditional_coding(net, {"b": 1})
    beta = np.asarray(jax.random.normal(jax.random.key(1), (3, coding.dim)))
    np.testing.assert_allclose(coding.from_theta(coding.to_theta(beta)), beta, atol=1e-10)
    np.testing.assert_allclose(coding.log_odds(coding.to_theta(beta)), beta, atol=1e-12)
    theta = np.asarray(jax.random.normal(jax.random.key(2), (net.num_params,)))
    back = np.asarray(coding.to_theta(coding.from_theta(theta)))
    log_p, log_q = joint(net, theta), joint(net, back)
    np.testing.assert_allclose(log_q, log_p - logsumexp(log_p), atol=1e-10)


def test_parameters_are_log_odds_against_the_reference_levels():
    net = NETWORKS["pair"]
    coding = conditional_coding(net, {"a": 1, "b": 2})
    theta = np.asarray(jax.random.normal(jax.random.key(3), (net.num_params,)))
    p = np.exp(joint(net, theta))
    p = p / p.sum()
    beta = dict(zip(coding.labels, np.asarray(coding.from_theta(theta)), strict=True))
    # a single clique is the root block: the joint cells' log odds against (a=1, b=2)
    assert set(beta) == {f"a={i},b={j}" for i, j in itertools.product(range(2), range(3))
                         if (i, j) != (1, 2)}
    for (i, j), value in zip(itertools.product(range(2), range(3)), p.ravel(), strict=True):
        if (i, j) != (1, 2):
            assert beta[f"a={i},b={j}"] == pytest.approx(np.log(value / p[1, 2]), abs=1e-10)


def test_bad_reference_and_networks_raise():
    net = NETWORKS["pair"]
    with pytest.raises(KeyError, match="unknown attribute 'z'"):
        conditional_coding(net, {"z": 0})
    with pytest.raises(ValueError, match=r"integer in \[0, 3\)"):
        conditional_coding(net, {"b": 3})
    with pytest.raises(ValueError, match=r"integer in \[0, 2\)"):
        reference_coding(net, {"a": -1})
    loop = MarkovNetwork({"a": 2, "b": 2, "c": 2}, [("a", "b"), ("b", "c"), ("a", "c")])
    with pytest.raises(ValueError, match="decomposable"):
        conditional_coding(loop)
    y = [Measurement(("a", "b"), np.zeros(4), Laplace(1.0))]
    with pytest.raises(ValueError, match="coding='conditional' needs a decomposable"):
        noisy_marginals_model(loop, y, 10, triangulate=True, coding="conditional")
    with pytest.raises(ValueError, match="coding must be one of"):
        noisy_marginals_model(net, [Measurement(("a", "b"), np.zeros(6), Laplace(1.0))], 10,
                              coding="cpt")


def test_reference_coding_at_other_levels_reaches_the_same_distributions():
    net = NETWORKS["chain with one-ways"]
    coding = reference_coding(net, {"a": 2, "c": 3})
    theta = np.asarray(jax.random.normal(jax.random.key(4), (net.num_params,)))
    phi = coding.from_theta(theta)
    log_p, log_q = joint(net, theta), joint(net, np.asarray(coding.to_theta(phi)))
    np.testing.assert_allclose(log_q - logsumexp(log_q), log_p - logsumexp(log_p), atol=1e-10)
    assert not any("a=2" in lab or "c=3" in lab for lab in coding.labels)


def test_released_reference_reads_the_smallest_table():
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    ms = [Measurement(("a", "b"), np.array([1.0, 9, 0, 2, 8, 7]), Laplace(1.0)),
          Measurement(("b",), np.array([5.0, 1, 20]), Laplace(1.0))]
    # b from its own table (argmax 2), not from (a, b) (column sums 3, 17, 7); c unmeasured
    assert released_reference(net, ms) == {"a": 1, "b": 2}


@pytest.mark.parametrize("relaxed", [True, False])
def test_normalised_densities_skip_only_a_zero(relaxed):
    """The CGM told that ``θ`` is normalised gives the densities of the one that computes
    ``A(θ)`` by the junction tree, on the conditional coding's ``θ``."""
    from numpyro_dpgm.distributions import CollectiveGraphicalModel

    net = NETWORKS["chain with one-ways"]
    coding = conditional_coding(net)
    theta = coding.to_theta(jax.random.normal(jax.random.key(5), (4, coding.dim)))
    full = CollectiveGraphicalModel(net, theta, 30, relaxed=relaxed)
    n = full.sample(jax.random.key(6))
    skip = CollectiveGraphicalModel(net, theta, 30, relaxed=relaxed, normalized=True)
    np.testing.assert_allclose(skip.log_prob(n), full.log_prob(n), atol=1e-10)
    np.testing.assert_allclose(skip.complete_log_likelihood(n),
                               full.complete_log_likelihood(n), atol=1e-10)
