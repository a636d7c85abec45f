"""CGM-EM compiles once per structure, says so when an E-step fails, and never ends worse than
its start.

The references are exact: the L1 projection of ``y`` onto ``N·M`` (a linear programme, see
``test_cgm_em``), the closed-form MLE of exact counts, and the loss of the naive start computed
by :func:`~numpyro_dpgm.estimation.losses.measurement_nll` from the naive estimator's own fit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_cgm_em import CHAIN, L1_CASES, identity_measurements, l1_problem

from numpyro_dpgm.estimation import cgm_em, naive_mle
from numpyro_dpgm.estimation.cgm_em import CGMEMWarning
from numpyro_dpgm.estimation.losses import measurement_nll
from numpyro_dpgm.infer import em_program as ep
from numpyro_dpgm.measurements import Gaussian, Laplace


def cache_sizes() -> tuple[int, int]:
    return ep.em_start_state._cache_size(), ep.em_block._cache_size()


def test_refit_of_a_known_structure_does_not_recompile() -> None:
    y, _, N = l1_problem(0, 1.0)
    fit = cgm_em(identity_measurements(CHAIN, y, Laplace(1.0)), CHAIN, total_count=N)
    sizes = cache_sizes()
    # new values, total, noise scale, iteration limits, tolerances, smoothing and a warm start
    y2, _, _ = l1_problem(1, 4.0, N=350.0)
    other = identity_measurements(CHAIN, y2, Laplace(4.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGMEMWarning)
        cgm_em(other, CHAIN, total_count=350.0, max_iters=37, tol=1e-4, inner_iters=20,
               inner_tol=1e-5)
        cgm_em(other, CHAIN, max_iters=200, init=fit.model, smoothing=0.1)
        cgm_em(other, CHAIN, total_count=350.0, max_iters=3, init="zeros")
        seen = []
        res = cgm_em(other, CHAIN, total_count=350.0, max_iters=4, tol=0.0,
                     max_halvings=3, callback=lambda t, loss: seen.append((t, loss)))
    assert cache_sizes() == sizes
    # one call per iteration (an E-step that moved θ), with that iteration's loss
    assert [t for t, _ in seen] == list(range(1, res.iterations + 1))
    np.testing.assert_array_equal([loss for _, loss in seen], res.loss_trace[1:])


def test_a_long_run_crosses_blocks_with_the_same_answer() -> None:
    """More iterations than one call of the compiled loop holds: the records join up."""
    y, opt, N = l1_problem(1, 4.0)
    meas = identity_measurements(CHAIN, y, Laplace(4.0))
    steps = ep.BLOCK + 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGMEMWarning)
        # small steps, so that every one of the E-steps moves θ (measured: 70 of 70)
        res = cgm_em(meas, CHAIN, total_count=N, max_iters=steps, inner_iters=2, damping=0.02,
                     tol=0.0, init="zeros")
        seen = []
        cb = cgm_em(meas, CHAIN, total_count=N, max_iters=steps, inner_iters=2, damping=0.02,
                    tol=0.0, init="zeros", callback=lambda t, loss: seen.append(loss))
    assert res.iterations == steps and len(res.loss_trace) == steps + 1
    assert res.extras["stop_reason"] == "iteration limit" and not res.converged
    np.testing.assert_array_equal(cb.loss_trace, res.loss_trace)
    np.testing.assert_array_equal(seen, res.loss_trace[1:])
    np.testing.assert_array_equal(cb.model.theta, res.model.theta)
    # the loss of a free natural M-step never rises and stays above the L1 optimum
    assert np.all(np.diff(res.loss_trace) <= 1e-12 * res.loss_trace[0])
    assert res.loss_trace[-1] >= opt / 4.0 - 1e-9


def test_an_estep_with_only_non_finite_iterates_is_not_a_fit() -> None:
    """Gaussian evidence with σ = 1e-153: the linearised evidence overflows at every iterate.
    EM keeps its start, but says that it did no iteration, that it failed, and what to do."""
    y = 20.0 + np.random.default_rng(0).normal(0.0, 2.0, CHAIN.num_params)
    meas = identity_measurements(CHAIN, y, Gaussian(1e-153))
    with pytest.warns(CGMEMWarning, match=r"non-finite.*Lower damping"):
        res = cgm_em(meas, CHAIN, total_count=120.0, init="zeros")
    assert not res.converged and res.iterations == 0
    assert res.extras["stop_reason"] == "failed"
    np.testing.assert_array_equal(res.extras["estep_nonfinite"], [15])  # inner_iters
    assert len(res.loss_trace) == 1
    np.testing.assert_array_equal(res.model.theta, np.zeros(CHAIN.num_params))


@pytest.mark.parametrize(("seed", "b"), L1_CASES)
def test_em_ends_no_worse_than_its_naive_start(seed: int, b: float) -> None:
    y, opt, N = l1_problem(seed, b)
    meas = identity_measurements(CHAIN, y, Laplace(b))
    res = cgm_em(meas, CHAIN, total_count=N)
    start = naive_mle(meas, CHAIN, total_count=N)
    nll = measurement_nll(CHAIN, meas, N)
    assert res.loss_trace[0] == pytest.approx(nll(start.model.theta), rel=1e-12)
    assert res.loss_trace[-1] == pytest.approx(nll(res.model.theta), rel=1e-9)
    assert np.all(np.diff(res.loss_trace) <= 1e-12 * res.loss_trace[0])
    assert opt / b - 1e-9 <= res.loss_trace[-1] <= res.loss_trace[0]
    assert not res.extras["kept_start"]


def test_the_start_is_kept_when_em_would_end_worse() -> None:
    """From the L1 projection (the loss's minimiser), Huber-smoothed EM moves to a point of
    larger L1 loss: the fit returns the projection and says so."""
    y, opt, N = l1_problem(0, 1.0)
    meas = identity_measurements(CHAIN, y, Laplace(1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGMEMWarning)
        proj = cgm_em(meas, CHAIN, total_count=N, max_iters=300, inner_iters=500, init="zeros",
                      tol=1e-10)
    assert proj.loss_trace[-1] == pytest.approx(opt, abs=1e-3)
    res = cgm_em(meas, CHAIN, total_count=N, init=proj.model, smoothing=2.0, max_iters=20)
    assert res.extras["kept_start"] and not res.converged
    assert "the start is returned" in res.extras["safeguard"]
    assert res.loss_trace[-1] > res.loss_trace[0]  # the run's own trace is kept
    nll = measurement_nll(CHAIN, meas, N)
    assert nll(res.model.theta) == pytest.approx(res.loss_trace[0], rel=1e-12)
    assert nll(res.model.theta) == pytest.approx(opt, abs=1e-3)

