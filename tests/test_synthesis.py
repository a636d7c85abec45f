"""Synthetic data sets: frequencies against exact joints, categories, posterior draws, errors."""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import pytest
from oracles.brute_force import BruteForce, assert_close, chi_square_pvalue, reference

from numpyro_dpgm import MarkovNetwork, MarkovRandomField, count
from numpyro_dpgm.synthesis import posterior_models, synthesize, theta_from_counts

DECOMPOSABLE = ("tree", "triangles_sharing_edge", "disconnected", "attr_in_no_clique",
                "oneway_beside_twoway")


def _codes(df: pd.DataFrame) -> np.ndarray:
    return np.stack([df[c].cat.codes.to_numpy() if isinstance(df[c].dtype, pd.CategoricalDtype)
                     else df[c].to_numpy() for c in df.columns], axis=1)


def test_point_estimate_frequencies_match_the_exact_joint():
    ref = reference("chain3")
    mrf = MarkovRandomField(ref.network, ref.theta)
    df = synthesize(mrf, 20_000, rng_key=0)
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == list(ref.network.domain.attrs) and len(df) == 20_000
    assert all(df[c].dtype == np.int64 for c in df.columns)
    # fixed seed; under the exact law the p-value is uniform, so 1e-3 fails 1 run in 1000
    assert chi_square_pvalue(_codes(df), ref.exact.joint, ref.exact.shape) > 1e-3


def test_several_data_sets_from_a_point_estimate_are_independent_draws():
    ref = reference("chain3")
    frames = synthesize(MarkovRandomField(ref.network, ref.theta), 5_000, num_datasets=3, rng_key=1)
    assert isinstance(frames, list) and len(frames) == 3
    assert not frames[0].equals(frames[1])
    pooled = np.concatenate([_codes(f) for f in frames])
    assert chi_square_pvalue(pooled, ref.exact.joint, ref.exact.shape) > 1e-3


def test_categories_round_trip_and_column_selection():
    ref = reference("chain3")  # x0: 2, x1: 3, x2: 4 values
    net = ref.network
    a, b, c = net.domain.attrs
    labels = {a: ["no", "yes"], c: ["w", "x", "y", "z"]}
    mrf = MarkovRandomField(net, ref.theta)
    plain = synthesize(mrf, 500, rng_key=7)
    labelled = synthesize(mrf, 500, rng_key=7, categories=labels)
    assert isinstance(labelled[a].dtype, pd.CategoricalDtype)
    assert list(labelled[a].cat.categories) == ["no", "yes"]
    assert labelled[b].dtype == np.int64  # no labels given: codes
    np.testing.assert_array_equal(_codes(labelled), plain.to_numpy())
    expected = np.asarray(labels[c])[plain[c].to_numpy()]
    np.testing.assert_array_equal(labelled[c].astype(str).to_numpy(), expected)
    # counting the labelled frame (by category codes) gives the tables of the codes
    for clique in net.cliques:
        np.testing.assert_array_equal(count(labelled, [clique], net.domain)[clique],
                                      count(plain, [clique], net.domain)[clique])
    sub = synthesize(mrf, 10, rng_key=7, columns=[c, a], categories=labels)
    assert list(sub.columns) == [c, a]

    class Encoding:  # anything with a .categories mapping
        categories = labels

    assert synthesize(mrf, 10, rng_key=7, categories=Encoding()).equals(
        synthesize(mrf, 10, rng_key=7, categories=labels))


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_theta_from_counts_recovers_the_joint(name):
    ref = reference(name)
    net = ref.network
    total = 1234.0
    n = np.concatenate([total * ref.exact.marginal(c).reshape(-1) for c in net.cliques])
    theta = np.asarray(theta_from_counts(net, n))
    rebuilt = BruteForce(net, theta)
    assert_close(rebuilt.joint, ref.exact.joint, name)
    # a batch of draws
    other = reference(name, seed=1)
    n2 = np.concatenate([total * other.exact.marginal(c).reshape(-1) for c in net.cliques])
    both = np.asarray(theta_from_counts(net, np.stack([n, n2])))
    assert_close(BruteForce(net, both[1]).joint, other.exact.joint, name)


def test_posterior_draws_give_one_data_set_per_draw():
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    # four very different draws: draw j puts almost all mass on cell (j % 2, j % 3)
    draws = np.full((4, 6), -20.0)
    for j in range(4):
        draws[j, (j % 2) * 3 + j % 3] = 0.0
    frames = synthesize({"theta": draws}, 200, num_datasets=2, rng_key=0, network=net)
    # evenly spaced draws 0 and 3
    assert (frames[0][["a", "b"]].to_numpy() == [0, 0]).all()
    assert (frames[1][["a", "b"]].to_numpy() == [1, 0]).all()
    # the same draws as a batched MarkovRandomField, and through the "n" site
    batched = synthesize(MarkovRandomField(net, draws), 200, num_datasets=2, rng_key=0)
    assert all(f.equals(g) for f, g in zip(frames, batched, strict=True))
    n = np.exp(draws) / np.exp(draws).sum(1, keepdims=True) * 50
    from_n = synthesize({"n": n}, 200, num_datasets=4, rng_key=0, network=net, site="n")
    assert (from_n[2][["a", "b"]].to_numpy() == [0, 2]).all()


def test_posterior_models_reads_phi_draws_through_the_reference_coding():
    from numpyro_dpgm.infer.bayes import reference_coding

    ref = reference("chain3")
    coding = reference_coding(ref.network)
    phi = np.asarray(coding.from_theta(ref.theta))[None]
    mrf = posterior_models({"phi": phi}, ref.network, site="phi")
    assert mrf.batch_shape == (1,)
    assert_close(np.asarray(mrf.marginal(("v1",)))[0], ref.exact.marginal("v1"))


def test_posterior_models_reads_phi_draws_through_the_fitted_models_coding():
    from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
    from numpyro_dpgm.privacy import simulate_release

    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    records = pd.DataFrame({"a": [0, 1, 1, 0, 1] * 8, "b": [0, 1, 2, 1, 0] * 8,
                            "c": [1, 1, 0, 0, 1] * 8})
    ms = simulate_release(records, net, 1.0, jax.random.key(0), domain=net.domain)
    model = noisy_marginals_model(net, ms, len(records), coding="conditional",
                                  reference="released")
    mcmc = run_nuts(model, jax.random.key(1), num_warmup=10, num_samples=5, num_chains=1,
                    check=False)
    by_phi = posterior_models(mcmc, site="phi")
    by_theta = posterior_models(mcmc, site="theta")
    assert_close(np.asarray(by_phi.marginal(("a", "b"))),
                 np.asarray(by_theta.marginal(("a", "b"))))


def test_nuts_fit_is_synthesised_with_its_own_network_and_size():
    from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_nuts
    from numpyro_dpgm.privacy import simulate_release

    net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    records = pd.DataFrame({"a": [0, 1, 1, 0, 1] * 8, "b": [0, 1, 1, 1, 0] * 8})
    ms = simulate_release(records, net, 1.0, jax.random.key(0), domain=net.domain)
    model = noisy_marginals_model(net, ms, len(records))
    mcmc = run_nuts(model, jax.random.key(1), num_warmup=30, num_samples=20, num_chains=1)
    frames = synthesize(mcmc, None, num_datasets=3, rng_key=2, categories={"a": ["x", "y"]})
    assert len(frames) == 3 and all(len(f) == 40 for f in frames)
    assert list(frames[0]["a"].cat.categories) == ["x", "y"]


def test_bad_input_errors():
    ref = reference("chain3")
    mrf = MarkovRandomField(ref.network, ref.theta)
    a = ref.network.domain.attrs[0]
    with pytest.raises(ValueError, match="num_records must be a positive integer"):
        synthesize(mrf, 0, rng_key=0)
    with pytest.raises(ValueError, match="num_datasets must be a positive integer"):
        synthesize(mrf, 5, num_datasets=1.5, rng_key=0)
    with pytest.raises(TypeError, match="rng_key must be"):
        synthesize(mrf, 5, rng_key="seed")
    with pytest.raises(ValueError, match="has 3 labels but the domain gives"):
        synthesize(mrf, 5, rng_key=0, categories={a: ["p", "q", "r"]})
    with pytest.raises(ValueError, match="repeated labels"):
        synthesize(mrf, 5, rng_key=0, categories={a: ["p", "p"]})
    with pytest.raises(KeyError, match="not in the domain"):
        synthesize(mrf, 5, rng_key=0, categories={"nope": ["p"]})
    with pytest.raises(KeyError, match="not attributes of the domain"):
        synthesize(mrf, 5, rng_key=0, columns=["nope"])
    with pytest.raises(TypeError, match="pass network="):
        synthesize({"theta": np.zeros((3, ref.network.num_params))}, 5, rng_key=0)
    with pytest.raises(ValueError, match="exceeds the 3 posterior draws"):
        synthesize({"theta": np.zeros((3, ref.network.num_params))}, 5, num_datasets=4, rng_key=0,
                   network=ref.network)
    with pytest.raises(KeyError, match="no draws of site 'theta'"):
        synthesize({"mu": np.zeros((3, 2))}, 5, rng_key=0, network=ref.network)
    with pytest.raises(ValueError, match="site must be one of"):
        synthesize({"theta": np.zeros((3, 2))}, 5, rng_key=0, network=ref.network, site="mu")
    with pytest.raises(ValueError, match="theta draws have shape"):
        synthesize({"theta": np.zeros((3, 2))}, 5, rng_key=0, network=ref.network)
    with pytest.raises(TypeError, match="pass num_records="):
        synthesize({"theta": np.zeros((3, ref.network.num_params))}, None, rng_key=0,
                   network=ref.network)
    with pytest.raises(TypeError, match="cannot read posterior draws"):
        synthesize(object(), 5, rng_key=0, network=ref.network)
    with pytest.raises(ValueError, match="zero or negative cells"):
        theta_from_counts(ref.network, np.zeros(ref.network.num_params))


def test_attributes_in_no_clique_are_kept_uniform_with_a_warning():
    """With no measurement of ``c``, the max-entropy model draws it uniformly and independently
    of the rest; a warning names it; ``drop_unmodelled=True`` leaves it out."""
    import warnings

    from numpyro_dpgm.synthesis import UnmodelledAttributesWarning, unmodelled_attributes

    net = MarkovNetwork({"a": 2, "c": 4, "b": 3}, [("a", "b")])
    theta = jax.numpy.asarray([3.0, 0, 0, 0, 0, 3.0])  # a and b strongly dependent
    mrf = MarkovRandomField(net, theta)
    assert unmodelled_attributes(net) == ["c"]
    with pytest.warns(UnmodelledAttributesWarning, match=r"\['c'\] are in no clique.*uniformly"):
        df = synthesize(mrf, 8000, rng_key=0, categories={"c": ["w", "x", "y", "z"]})
    assert list(df.columns) == ["a", "c", "b"]
    shares = df["c"].value_counts(normalize=True)
    assert set(shares.index) == {"w", "x", "y", "z"} and np.abs(shares - 0.25).max() < 0.02
    by_a = pd.crosstab(df["a"], df["c"], normalize="index")
    assert np.abs(by_a.loc[0] - by_a.loc[1]).max() < 0.04
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = synthesize(mrf, 10, rng_key=0, drop_unmodelled=True)
        sets = synthesize(MarkovRandomField(net, jax.numpy.stack([theta, theta])), 10, 2, rng_key=0,
                          drop_unmodelled=True)
    assert list(kept.columns) == ["a", "b"] and all(list(s.columns) == ["a", "b"] for s in sets)


def test_iter_synthetic_draws_one_data_set_at_a_time(monkeypatch):
    """dpgm synth writes each data set before the next is drawn: the iterator checks its input
    at once and draws lazily, so memory does not grow with the number of data sets."""
    import jax.numpy as jnp

    from numpyro_dpgm import MarkovNetwork, MarkovRandomField
    from numpyro_dpgm.synthesis import iter_synthetic, synthesize

    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    draws = MarkovRandomField(net, jnp.zeros((4, net.num_params)))
    calls = []
    original = MarkovRandomField.sample
    monkeypatch.setattr(MarkovRandomField, "sample",
                        lambda self, key, shape=(): calls.append(shape) or original(self, key,
                                                                                    shape))
    with pytest.raises(ValueError, match="exceeds the 4 posterior draws"):
        iter_synthetic(draws, 10, 5, rng_key=0)  # refused before anything is drawn
    frames = iter_synthetic(draws, 10, 3, rng_key=0)
    assert calls == []
    first = next(frames)
    assert calls == [(10,)] and first.shape == (10, 2)
    rest = list(frames)
    assert len(rest) == 2 and calls == [(10,)] * 3
    # synthesize is the same draws, collected
    again = synthesize(draws, 10, 3, rng_key=0)
    for a, b in zip([first, *rest], again, strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_records_come_in_chunks_and_are_the_same_records(monkeypatch):
    """iter_synthetic_chunks draws at most SAMPLE_CHUNK records per call, and the chunks of a data
    set are exactly the records synthesize returns; the chunk frequencies match the exact joint."""
    import jax.numpy as jnp

    from numpyro_dpgm import synthesis

    monkeypatch.setattr(synthesis, "SAMPLE_CHUNK", 700)
    net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    theta = jnp.asarray(np.random.default_rng(2).normal(size=net.num_params))
    draws = MarkovRandomField(net, jnp.stack([theta, -theta]))
    chunks = list(synthesis.iter_synthetic_chunks(draws, 2000, 2, rng_key=5,
                                                  categories={"a": ["x", "y"]}))
    assert [(c.dataset, c.start, len(c.frame), c.last) for c in chunks] == [
        (0, 0, 700, False), (0, 700, 700, False), (0, 1400, 600, True),
        (1, 0, 700, False), (1, 700, 700, False), (1, 1400, 600, True)]
    whole = synthesize(draws, 2000, 2, rng_key=5, categories={"a": ["x", "y"]})
    for j, frame in enumerate(whole):
        parts = pd.concat([c.frame for c in chunks if c.dataset == j])
        pd.testing.assert_frame_equal(parts, frame)
        assert frame.index.equals(pd.RangeIndex(2000)) and frame["a"].dtype.name == "category"
    # the chunks are independent draws of one model: 2000 records against the exact joint
    probs = BruteForce(net, np.asarray(theta)).probs()
    codes = np.stack([whole[0]["a"].cat.codes.to_numpy(), whole[0]["b"].to_numpy()], axis=1)
    assert chi_square_pvalue(codes, probs, (2, 3)) > 1e-3
