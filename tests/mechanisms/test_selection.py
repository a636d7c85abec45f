"""The exponential mechanism: exact probabilities, selection frequencies, OpenDP, accounting."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from scipy import stats

from numpyro_dpgm.mechanisms import exponential_mechanism, selection_epsilon
from numpyro_dpgm.privacy import ZCDP, BudgetExceededError, PrivacyLedger, PureDP

SCORES = np.array([1.0, 3.0, 2.0, 0.5, 2.5])


def exact(scores: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    w = np.exp(epsilon * scores / (2.0 * sensitivity))
    return w / w.sum()


def test_probabilities_are_the_softmax_of_eps_score_over_two_delta():
    sel = exponential_mechanism(SCORES, 1.5, 0.5, sampler="jax", rng_key=0)
    np.testing.assert_allclose(sel.probabilities, exact(SCORES, 1.5, 0.5), rtol=1e-12)
    assert 0 <= sel.index < SCORES.size


def test_jax_selection_frequencies_match_the_exact_probabilities():
    # 4,000 seeded draws: the chi-square test against the exact probabilities passes at the
    # 0.1% level and every frequency is within 4.5 standard errors (fixed keys: deterministic)
    draws = 4000
    p = exact(SCORES, 2.0, 1.0)
    picks = [exponential_mechanism(SCORES, 2.0, 1.0, sampler="jax",
                                   rng_key=jax.random.key(k)).index for k in range(draws)]
    counts = np.bincount(picks, minlength=SCORES.size)
    assert stats.chisquare(counts, draws * p).pvalue > 1e-3
    se = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(counts / draws - p) <= 4.5 * se)


def test_opendp_selects_a_valid_index_with_the_exact_distribution_and_map():
    ledger = PrivacyLedger(ZCDP(1.0))
    sel = exponential_mechanism(SCORES, 2.0, 1.0, ledger=ledger, label="pick")
    assert 0 <= sel.index < SCORES.size
    entry = ledger.history[0]
    assert entry.charge == pytest.approx(2.0**2 / 8, rel=1e-12)
    assert entry.details["opendp_map"] == pytest.approx(0.5, rel=1e-9)
    assert entry.details["sampler"] == "opendp"
    # unseeded draws: every frequency within 5 standard errors (fails with probability ~1e-6)
    draws = 2000
    p = exact(SCORES, 2.0, 1.0)
    counts = np.bincount([exponential_mechanism(SCORES, 2.0, 1.0).index for _ in range(draws)],
                         minlength=SCORES.size)
    assert np.all(np.abs(counts / draws - p) <= 5 * np.sqrt(p * (1 - p) / draws))


def test_ledger_charges_eps_squared_over_eight_in_zcdp_and_eps_when_pure():
    zcdp, pure = PrivacyLedger(ZCDP(1.0)), PrivacyLedger(PureDP(1.0))
    exponential_mechanism(SCORES, 0.8, 1.0, sampler="jax", rng_key=1, ledger=zcdp)
    exponential_mechanism(SCORES, 0.8, 1.0, sampler="jax", rng_key=1, ledger=pure)
    assert zcdp.spent == pytest.approx(0.08, rel=1e-12)
    assert pure.spent == pytest.approx(0.8, rel=1e-12)
    assert selection_epsilon(0.08) == pytest.approx(0.8, rel=1e-12)


def test_a_ledger_that_cannot_pay_refuses_before_drawing():
    ledger = PrivacyLedger(ZCDP(0.01))
    with pytest.raises(BudgetExceededError):
        exponential_mechanism(SCORES, 1.0, 1.0, sampler="jax", rng_key=0, ledger=ledger)
    assert ledger.history == ()


def test_large_epsilon_always_picks_the_best():
    picks = {exponential_mechanism(SCORES, 200.0, 1.0, sampler="jax", rng_key=k).index
             for k in range(30)}
    assert picks == {1}


@pytest.mark.parametrize("args, kwargs, match", [
    (([1.0, 2.0], 0.0, 1.0), {"sampler": "jax", "rng_key": 0}, "epsilon"),
    (([1.0, 2.0], math.inf, 1.0), {"sampler": "jax", "rng_key": 0}, "epsilon"),
    (([1.0, 2.0], 1.0, 0.0), {"sampler": "jax", "rng_key": 0}, "sensitivity"),
    (([], 1.0, 1.0), {"sampler": "jax", "rng_key": 0}, "scores"),
    (([1.0, np.nan], 1.0, 1.0), {"sampler": "jax", "rng_key": 0}, "scores"),
    (([1.0, 2.0], 1.0, 1.0), {"sampler": "jax"}, "rng_key"),
    (([1.0, 2.0], 1.0, 1.0), {"rng_key": 0}, "cannot be seeded"),
    (([1.0, 2.0], 1.0, 1.0), {"sampler": "numpy"}, "sampler"),
])
def test_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        exponential_mechanism(*args, **kwargs)
