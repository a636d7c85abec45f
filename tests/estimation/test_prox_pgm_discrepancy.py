"""``prox_pgm(stop="discrepancy")``: mirror descent from the maximum-entropy point, stopped by
Morozov's discrepancy principle at the loss the true tables have in expectation."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from test_prox_pgm import CYCLE, certified_l2, table_measurements

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.estimation.losses import expected_noise_loss
from numpyro_dpgm.estimation.prox_pgm import prox_pgm
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement


@pytest.mark.parametrize("noise", [Laplace(3.0), Gaussian(2.0)], ids=["laplace", "gaussian"])
@pytest.mark.parametrize("kind", ["l2", "l1"])
def test_expected_noise_loss_is_the_mean_loss_of_the_truth(noise, kind):
    """Monte Carlo over 20,000 releases of two tables: the loss of the true tables averages
    to ``expected_noise_loss`` within 4 standard errors."""
    rng = np.random.default_rng(31)
    truth = [np.array([50.0, 30.0, 20.0]), np.array([10.0, 40.0, 25.0, 25.0])]
    draw = rng.laplace if isinstance(noise, Laplace) else rng.normal
    scale = noise.scale if isinstance(noise, Laplace) else noise.sigma
    weight = 1.0 / (noise.variance if kind == "l2" else scale)
    losses = []
    for _ in range(20_000):
        r = np.concatenate([draw(scale=scale, size=t.size) for t in truth])
        losses.append(weight * (0.5 * np.sum(r**2) if kind == "l2" else np.sum(np.abs(r))))
    ms = [Measurement((a,), t, noise) for a, t in zip("ab", truth, strict=True)]
    expected = expected_noise_loss(ms, kind)
    assert np.mean(losses) == pytest.approx(expected, abs=4 * np.std(losses) / math.sqrt(20_000))


def test_stops_at_the_first_iterate_at_the_noise_level():
    rng = np.random.default_rng(32)
    theta = rng.normal(size=CYCLE.num_params)
    ms = table_measurements(CYCLE, theta, 2000.0, Gaussian(4.0), rng)
    level = expected_noise_loss(ms)
    fit = prox_pgm(ms, CYCLE, total_count=2000.0, stop="discrepancy")
    trace = np.asarray(fit.loss_trace)
    assert fit.converged and fit.extras["stopped_by"] == "discrepancy"
    assert fit.extras["method"] == "md" and fit.extras["discrepancy_level"] == level
    assert trace[-1] <= level < trace[-2] and np.all(trace[:-1] > level)
    # the same path, from the uniform start, run for as many iterations without the rule
    path = prox_pgm(ms, CYCLE, total_count=2000.0, method="md", tol=0.0,
                    init=jnp.zeros(CYCLE.num_params), max_iters=fit.iterations)
    for clique in CYCLE.cliques:
        np.testing.assert_allclose(np.asarray(fit.extras["marginals"][clique]),
                                   np.asarray(path.extras["marginals"][clique]), rtol=1e-12)


def test_where_the_noise_level_is_out_of_reach_it_is_the_optimum():
    """Two measurements of one table that disagree by far more than their noise: no table
    explains them to the noise level, so the tolerance rule ends the fit at the certified
    optimum."""
    net = MarkovNetwork({"a": 3}, [("a",)])
    ms = [Measurement(("a",), np.array([60.0, 30.0, 10.0]), Gaussian(1.0)),
          Measurement(("a",), np.array([20.0, 30.0, 50.0]), Gaussian(1.0))]
    fit = prox_pgm(ms, net, total_count=100.0, stop="discrepancy", max_iters=20000)
    assert fit.converged and fit.extras["stopped_by"] == "tolerance"
    assert float(fit.loss_trace[-1]) == pytest.approx(certified_l2(net.domain, ms, 100.0),
                                                      rel=1e-7)


def test_bad_stop_rules():
    ms = table_measurements(CYCLE, np.zeros(CYCLE.num_params), 100.0, Gaussian(1.0))
    with pytest.raises(ValueError,
                       match="unknown stop 'early'; use 'auto', 'optimum', 'discrepancy' or "
                             "'risk'"):
        prox_pgm(ms, CYCLE, stop="early")
    with pytest.raises(ValueError, match="needs the measurements' noise"):
        prox_pgm(ms, CYCLE, stop="discrepancy",
                 loss=lambda tables: 0.0 * sum(t.sum() for t in tables.values()))
