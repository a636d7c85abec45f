"""MarkovRandomField against brute-force enumeration, and its NumPyro contract."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions import constraints
from oracles.brute_force import (
    BruteForce,
    assert_close,
    empirical_tv,
    reference,
    tv_bound,
)

from numpyro_dpgm import MarkovNetwork, MarkovRandomField

# a non-decomposable model with a clique in non-domain order, and one with one-way tables
NAMES = ("nondomain_order", "oneway_beside_twoway")


def _batched(name: str) -> tuple[MarkovNetwork, np.ndarray, list[BruteForce]]:
    """Network, θ of batch shape (2, 3) and the brute-force joint of every batch element."""
    refs = [reference(name, scale, seed) for scale in (1.0, 30.0) for seed in (0, 1, 2)]
    theta = np.stack([r.theta for r in refs]).reshape(2, 3, -1)
    return refs[0].network, theta, [r.exact for r in refs]


@pytest.mark.parametrize("name", NAMES)
def test_log_prob_matches_enumeration(name: str) -> None:
    for scale in (1.0, 30.0):
        ref = reference(name, scale)
        mrf = MarkovRandomField(ref.network, ref.theta)
        assert mrf.batch_shape == () and mrf.event_shape == (len(ref.network.domain),)
        records = ref.exact.records()
        lp = mrf.log_prob(records)
        assert lp.shape == (len(records),)
        assert_close(lp, ref.exact.log_prob(records), f"{name} log_prob")
        assert_close(jax.nn.logsumexp(lp), 0.0, "log Σ_x p(x)")
        assert_close(jnp.sum(jnp.exp(lp)), 1.0, "Σ_x p(x)")
        # records with extra leading dims keep them
        block = records[:6].reshape(2, 3, -1)
        assert_close(mrf.log_prob(block), ref.exact.log_prob(block))
        assert_close(mrf.log_partition(), ref.exact.log_z)


@pytest.mark.parametrize("name", NAMES)
def test_inference_methods_match_enumeration(name: str) -> None:
    ref = reference(name, 30.0)
    net, exact = ref.network, ref.exact
    mrf = MarkovRandomField(net, ref.theta)
    mus = mrf.marginals()
    for c in net.cliques:
        assert_close(mus[c], exact.marginal(c), f"{c}")
    scaled = mrf.marginals(total=500.0)
    assert_close(scaled[net.cliques[0]], 500.0 * exact.marginal(net.cliques[0]))
    last = net.domain.attrs[-1]
    assert_close(mrf.marginal(last), exact.marginal((last,)))  # a bare attribute name
    query = (net.domain.attrs[-1], net.domain.attrs[0])  # in no clique of either network
    assert_close(mrf.marginal(query), exact.marginal(query))
    assert_close(mrf.mean, exact.mean())
    assert mrf.mean.shape == (len(net.domain),)


def test_theta_as_clique_tables_and_integer_theta() -> None:
    ref = reference("nondomain_order")
    net = ref.network
    from_tables = MarkovRandomField(net, net.unflatten(jnp.asarray(ref.theta)))
    assert_close(from_tables.theta, ref.theta)
    ints = MarkovRandomField(net, np.arange(net.num_params) % 3)
    assert jnp.issubdtype(ints.theta.dtype, jnp.floating)
    expected = BruteForce(net, (np.arange(net.num_params) % 3).astype(float))
    assert_close(ints.log_partition(), expected.log_z)


@pytest.mark.parametrize("name", NAMES)
def test_batched_theta(name: str) -> None:
    """θ of batch shape (2, 3): every method broadcasts and matches each element's joint."""
    net, theta, exacts = _batched(name)
    mrf = MarkovRandomField(net, theta)
    assert mrf.batch_shape == (2, 3)
    d = len(net.domain)
    records = exacts[0].records()
    lp = mrf.log_prob(records[:, None, None, :])  # (S, 1, 1, d) against batch (2, 3)
    assert lp.shape == (len(records), 2, 3)
    log_z = mrf.log_partition()
    mus = mrf.marginals()
    query = (net.domain.attrs[-1], net.domain.attrs[0])
    oom = mrf.marginal(query)
    mean = mrf.mean
    assert log_z.shape == (2, 3) and mean.shape == (2, 3, d)
    assert oom.shape == (2, 3) + net.domain.shape_of(query)
    for b, exact in enumerate(exacts):
        i, j = divmod(b, 3)
        assert_close(lp[:, i, j], exact.log_prob(records), f"batch {b}")
        assert_close(log_z[i, j], exact.log_z)
        assert_close(oom[i, j], exact.marginal(query))
        assert_close(mean[i, j], exact.mean())
        for c in net.cliques:
            assert mus[c].shape == (2, 3) + net.domain.shape_of(c)
            assert_close(mus[c][i, j], exact.marginal(c))
    # one record per batch element
    per = np.stack([e.records()[b] for b, e in enumerate(exacts)]).reshape(2, 3, d)
    lp_per = mrf.log_prob(per)
    for b, exact in enumerate(exacts):
        assert_close(lp_per[divmod(b, 3)], exact.log_prob(per.reshape(6, d)[b]))


def test_sample_shapes_and_frequencies() -> None:
    """Shapes with sample_shape and batch_shape; each batch element follows its own θ."""
    ref = reference("nondomain_order")
    net = ref.network
    d = len(net.domain)
    upper = np.array(net.domain.shape)
    mrf = MarkovRandomField(net, ref.theta)
    key = jax.random.key(0)
    assert mrf.sample(key).shape == (d,)
    assert mrf.sample(key, (20,)).shape == (20, d)
    x = mrf.sample(key, (4, 5))
    assert x.shape == (4, 5, d) and jnp.issubdtype(x.dtype, jnp.integer)
    assert ((np.asarray(x) >= 0) & (np.asarray(x) < upper)).all()
    assert bool(jnp.all(mrf.support(x)))

    _, theta, exacts = _batched("nondomain_order")
    batched = MarkovRandomField(net, theta)
    n = 20_000
    assert batched.sample(key, (n // 2, 2)).shape == (n // 2, 2, 2, 3, d)
    xb = batched.sample(jax.random.key(11), (n,))
    assert xb.shape == (n, 2, 3, d)
    assert batched.log_prob(xb[:7]).shape == (7, 2, 3)
    xb = np.asarray(xb)
    assert ((xb >= 0) & (xb < upper)).all()
    for b, exact in enumerate(exacts):
        i, j = divmod(b, 3)
        tv = empirical_tv(xb[:, i, j], exact.probs(), exact.shape)
        assert tv < tv_bound(exact.probs(), n), f"batch element {b}: TV {tv:.4f}"
        # and they do not match another element's joint
        other = exacts[(b + 3) % 6]
        assert empirical_tv(xb[:, i, j], other.probs(), other.shape) > tv_bound(other.probs(), n)


def test_support_constraint_and_validation() -> None:
    ref = reference("nondomain_order")
    net = ref.network
    mrf = MarkovRandomField(net, ref.theta, validate_args=True)
    assert mrf.support.is_discrete and mrf.support.event_dim == 1
    upper = np.array(net.domain.shape) - 1
    good = np.stack([np.zeros_like(upper), upper])
    bad_high = good.copy()
    bad_high[1, 2] = upper[2] + 1
    bad_neg = good.copy()
    bad_neg[0, 0] = -1
    assert np.asarray(mrf.support(good)).tolist() == [True, True]
    assert np.asarray(mrf.support(bad_high)).tolist() == [True, False]
    assert np.asarray(mrf.support(bad_neg)).tolist() == [False, True]
    with pytest.warns(UserWarning, match="Out-of-support"):
        mrf.log_prob(bad_high)
    with pytest.warns(UserWarning, match="Out-of-support"):
        mrf.log_prob(bad_neg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(mrf.log_prob(good), ref.exact.log_prob(good))
    # argument validation: non-finite θ is rejected
    bad_theta = np.array(ref.theta)
    bad_theta[0] = np.nan
    with pytest.raises(ValueError, match="theta"):
        MarkovRandomField(net, bad_theta, validate_args=True)
    assert isinstance(MarkovRandomField.arg_constraints["theta"], type(constraints.real_vector))


def test_constructor_errors() -> None:
    net = reference("chain3").network
    with pytest.raises(ValueError, match=r"\(\.\.\., 18\)"):
        MarkovRandomField(net, np.zeros(5))
    with pytest.raises(ValueError, match="theta has shape"):
        MarkovRandomField(net, np.float64(0.0))
    with pytest.raises(TypeError, match="MarkovNetwork"):
        MarkovRandomField({"v0": 2}, np.zeros(2))
    with pytest.raises(KeyError, match="zz"):
        MarkovRandomField(net, np.zeros(net.num_params)).marginal(("zz",))


def test_jit_and_vmap_over_the_distribution() -> None:
    """The distribution is a pytree: θ is a leaf, the network static."""
    ref = reference("nondomain_order")
    net = ref.network
    mrf = MarkovRandomField(net, ref.theta)
    leaves, treedef = jax.tree.flatten(mrf)
    assert len(leaves) == 1 and leaves[0].shape == (net.num_params,)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.network is net and rebuilt.method == mrf.method
    records = ref.exact.records()

    @jax.jit
    def stats(dist: MarkovRandomField, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return dist.log_prob(x), dist.log_partition(), dist.marginal(("e", "a"))

    lp, log_z, ea = stats(mrf, records)
    assert_close(lp, ref.exact.log_prob(records))
    assert_close(log_z, ref.exact.log_z)
    assert_close(ea, ref.exact.marginal(("e", "a")))
    # a new θ through the same compiled function
    other = reference("nondomain_order", 30.0)
    lp2, log_z2, _ = stats(MarkovRandomField(net, other.theta), records)
    assert_close(lp2, other.exact.log_prob(records))
    assert_close(log_z2, other.exact.log_z)
    # jax.tree.map acts on θ
    doubled = jax.tree.map(lambda t: 2 * t, mrf)
    assert isinstance(doubled, MarkovRandomField)
    assert_close(doubled.log_partition(), BruteForce(net, 2 * np.asarray(ref.theta)).log_z)
    # vmap of a function that builds the distribution inside
    thetas = jnp.stack([jnp.asarray(ref.theta), jnp.asarray(other.theta)])
    log_zs = jax.vmap(lambda t: MarkovRandomField(net, t).log_partition())(thetas)
    assert_close(log_zs, [ref.exact.log_z, other.exact.log_z])
    # sampling under jit with the distribution as an argument
    x = jax.jit(lambda dist, k: dist.sample(k, (3,)))(mrf, jax.random.key(0))
    assert x.shape == (3, len(net.domain))
