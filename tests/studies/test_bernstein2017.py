"""The seed-002 reproduction: exact building blocks, and the quick run end to end.

The quick run is seed 002's claim in the cells it runs: CGM-EM below naive MLE in mean KL to the
true model, in every cell (third-order chain and Erdős–Rényi, |X| = 10, N = 10⁴, ε ∈ {0.1, 1},
3 × 3 nested trials).
"""

from __future__ import annotations

import csv
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce

from numpyro_dpgm import MarkovNetwork, MarkovRandomField
from numpyro_dpgm.estimation.cgm_em import cgm_em
from numpyro_dpgm.estimation.naive import DEFAULT_L2_FLOOR, default_l2, naive_mle
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.metrics import kl_divergence
from studies import bernstein2017 as b17
from studies.bernstein2017 import fits, mobility, models


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_models_follow_the_paper() -> None:
    chain = b17.synthetic_network("chain3")
    assert len(chain.cliques) == 24
    assert all(1 <= abs(int(a[1:]) - int(b[1:])) <= 3 for a, b in chain.cliques)
    er = b17.synthetic_network("er", k=20)
    assert er.domain.shape == (20,) * 10 and chain.graph.number_of_nodes() == 10
    import networkx as nx

    assert nx.is_connected(er.graph)
    theta = b17.dirichlet_theta(chain, np.random.default_rng(0))
    for c in chain.cliques:  # each edge table is a Dirichlet draw: positive, sums to one
        np.testing.assert_allclose(np.exp(theta[chain.slice_of(c)]).sum(), 1.0)
    with pytest.raises(ValueError, match="unknown model"):
        b17.model_edges("grid")


def test_exact_sampler_matches_enumeration() -> None:
    # a loopy 4-node model: a cycle plus a chord, 3 values each
    net = MarkovNetwork({"a": 3, "b": 3, "c": 3, "d": 3},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("b", "d")])
    theta = np.random.default_rng(1).normal(size=net.num_params)
    x = b17.ExactSampler(MarkovRandomField(net, theta))(200_000, np.random.default_rng(2))
    bf = BruteForce(net, theta)
    freq = np.bincount(np.ravel_multi_index(x.T, net.domain.shape), minlength=81) / len(x)
    # multinomial frequencies: 5 standard errors
    se = np.sqrt(bf.probs() * (1 - bf.probs()) / len(x))
    assert np.all(np.abs(freq - bf.probs()) <= 5 * se + 1e-12)


def test_batched_estimators_and_kl_match_the_public_ones() -> None:
    # the vmapped cores of the grid against naive_mle / cgm_em (at the study's settings) and
    # metrics.kl_divergence, on a small loopy model (a 4-cycle with a chord) so that compiling
    # stays cheap
    net = MarkovNetwork({"a": 3, "b": 3, "c": 3, "d": 3},
                        [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("b", "d")])
    truth = models.Truth(net, b17.dirichlet_theta(net, np.random.default_rng(3)))
    x = b17.ExactSampler(truth.model)(2000, np.random.default_rng(4))
    n = np.asarray(net.features(x))
    b = len(net.cliques) / 1.0
    ys = jnp.asarray(n[None] + np.random.default_rng(5).laplace(0, b, (2, net.num_params)))
    total = jnp.asarray(2000.0)
    th = fits.naive_batch(net, ys, total, jnp.asarray(default_l2(b, 2000)))
    th_em = fits.em_batch(net, fits.measurement_evidence(net), ys, total, jnp.asarray(b))
    # the loop of the single-trial program (what the study runs on CPU) gives the same fits
    loop, _ = fits.cell_fits("loop", fits.naive_batch, fits.naive_single, (net,), ys,
                             (total, jnp.asarray(default_l2(b, 2000))))
    np.testing.assert_allclose(np.asarray(loop), np.asarray(th), atol=1e-6)
    for y, t, t_em, k in zip(np.asarray(ys), th, th_em, truth.kl(th), strict=True):
        meas = [Measurement(c, y[net.slice_of(c)], Laplace(b)) for c in net.cliques]
        # the study keeps seed 002's rule λ = max(b/N, 10⁻⁴), not naive_mle's weaker default
        # where b·K/N < 0.3 (here 5·9/2000)
        ref = naive_mle(meas, net, total_count=2000, l2=default_l2(b, 2000))
        assert float(kl_divergence(truth.model, ref.model)) == pytest.approx(float(k), rel=1e-6)
        assert float(kl_divergence(truth.model, MarkovRandomField(net, t))) == pytest.approx(
            float(k), rel=1e-9)
        em = cgm_em(meas, net, total_count=2000, max_iters=fits.EM_ITERS,
                    inner_iters=fits.EM_INNER,
                    naive_l2=max(fits.EM_INIT_L2_SCALE * b / 2000, DEFAULT_L2_FLOOR),
                    max_halvings=fits.EM_HALVINGS)
        np.testing.assert_allclose(np.asarray(t_em), np.asarray(em.theta), atol=1e-6)


def test_batch_mode_is_resolved_or_refused() -> None:
    assert b17.resolve_batch("vmap") == "vmap"
    assert b17.resolve_batch("loop") == "loop"
    assert b17.resolve_batch("auto") == ("loop" if jax.default_backend() == "cpu" else "vmap")
    with pytest.raises(ValueError, match="batch must be"):
        b17.resolve_batch("pmap")


def test_mobility_chain_is_a_normalised_markov_chain() -> None:
    net, tie, w = b17.mobility_chain(steps=4, locations=2)
    bf = BruteForce(net, w[tie])
    assert bf.log_z == pytest.approx(0.0, abs=1e-12)  # π and P are normalised
    days = mobility.simulate_days(w, 3, 4, 50_000, np.random.default_rng(0))
    assert np.all(np.any(days > 0, axis=1))  # never-connected days are not in the log
    # the simulator is the chain conditioned on at least one connection
    keep = np.any(bf.records() > 0, axis=1)
    p = bf.probs() * keep / np.sum(bf.probs() * keep)
    freq = np.bincount(np.ravel_multi_index(days.T, (3,) * 4), minlength=81) / len(days)
    assert np.max(np.abs(freq - p)) < 5 * np.sqrt(p.max() / len(days))
    wts = b17.user_weights(np.array([[0, 0, 1, 1], [1, 2, 1, 2], [0, 0, 0, 1]]))
    np.testing.assert_allclose(wts, [1 / 2, 1 / 3, 1 / 1])


@pytest.mark.slow
def test_quick_run_cgm_em_beats_naive_in_every_cell(tmp_path) -> None:
    import numpyro

    numpyro.enable_x64()
    out = b17.run(tmp_path, quick=True, log=lambda m: None)
    for name in ("synthetic.csv", "synthetic_summary.csv", "synthetic_chain3_k10.png",
                 "synthetic_er_k10.png", "mobility.csv", "mobility.png", "meta.json"):
        assert (out / name).stat().st_size > 0, name
    summary = _rows(out / "synthetic_summary.csv")
    cells = {(r["model"], r["N"], r["epsilon"]) for r in summary if r["epsilon"]}
    assert cells == set(itertools.product(("chain3", "er"), ("10000",), ("0.1", "1.0")))
    kl = {(r["model"], r["N"], r["epsilon"], r["method"]): float(r["kl_mean"]) for r in summary}
    for cell in cells:
        assert kl[(*cell, "cgm_em")] < kl[(*cell, "naive")], cell
        assert kl[(*cell, "naive")] < kl[(cell[0], "", "", "random")]
    for model in ("chain3", "er"):
        assert kl[(model, "10000", "", "nonprivate")] < kl[(model, "10000", "1.0", "cgm_em")]
    # the markdown summary counts the same cells from the CSV files
    assert "CGM-EM below naive MLE in 4 of 4 cells." in (out / "summary.md").read_text()
    mob = _rows(out / "mobility.csv")
    assert {r["method"] for r in mob} == {"truth", "nonprivate", "naive", "cgm_em", "psgd"}
    ll = {r["method"]: float(r["heldout_ll"]) for r in mob}
    assert ll["nonprivate"] <= ll["truth"] + 0.5  # held-out: nothing beats the truth by much
    jax.clear_caches()
