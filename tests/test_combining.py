"""Combining rules for fully synthetic data against hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from numpyro_dpgm.combining import analyse, normal_interval, rubin

# q = (1, 2, 3, 6), u = (0.5, 0.5, 1, 1): m = 4, q̄ = 3, b = (4 + 1 + 0 + 9)/3 = 14/3, ū = 3/4,
# (1 + 1/4) b = 35/6, T_s = 35/6 − 3/4 = 61/12, ν = 3 (1 − (3/4)/(35/6))² = 3 (61/70)²
Q = [1.0, 2.0, 3.0, 6.0]
U = [0.5, 0.5, 1.0, 1.0]


def test_rubin_matches_the_hand_computation():
    r = rubin(Q, U)
    assert r.num_datasets == 4 and not r.adjusted
    assert r.estimate == pytest.approx(3.0, abs=1e-14)
    assert r.between == pytest.approx(14 / 3, rel=1e-14)
    assert r.within == pytest.approx(0.75, rel=1e-14)
    assert r.variance == pytest.approx(61 / 12, rel=1e-14)
    assert r.df == pytest.approx(3 * (61 / 70) ** 2, rel=1e-14)  # 2.278163...
    lo, hi = r.conf_int(0.9)
    half = stats.t.ppf(0.95, 3 * (61 / 70) ** 2) * np.sqrt(61 / 12)
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), rel=1e-12)
    # t quantile at ν ≈ 2.278 is far wider than the normal one
    assert half > 1.645 * np.sqrt(61 / 12) * 1.3


def test_non_negative_variant_when_between_variance_is_small():
    # q = (1, 1.1), u = (1, 1): b = 0.005, (1 + 1/2) b = 0.0075, T_s = 0.0075 − 1 = −0.9925
    r = rubin([1.0, 1.1], [1.0, 1.0], size_ratio=0.5)
    assert r.adjusted
    assert r.variance == pytest.approx(0.5, rel=1e-14)  # (n_syn / n) ū
    assert r.df == pytest.approx((1 - 1 / 0.0075) ** 2, rel=1e-12)  # 132.33² = 17512.1
    plain = rubin([1.0, 1.1], [1.0, 1.0], nonnegative=False)
    assert plain.variance == pytest.approx(-0.9925, rel=1e-12) and not plain.adjusted
    with pytest.raises(ValueError, match="not positive"):
        plain.conf_int(0.9)


def test_zero_between_variance_gives_the_normal_reference():
    r = rubin([2.0, 2.0, 2.0], [0.3, 0.3, 0.3])
    assert r.df == np.inf and r.adjusted and r.variance == pytest.approx(0.3)
    lo, hi = r.conf_int(0.9)
    assert hi - 2.0 == pytest.approx(stats.norm.ppf(0.95) * np.sqrt(0.3), rel=1e-12)


def test_vector_estimates_are_combined_per_component():
    q = np.stack([Q, np.array(Q) * 2], axis=1)
    u = np.stack([U, np.array(U) * 4], axis=1)
    r = rubin(q, u)
    assert r.estimate.shape == (2,)
    np.testing.assert_allclose(r.variance, [61 / 12, 4 * 61 / 12], rtol=1e-14)
    np.testing.assert_allclose(r.df, [3 * (61 / 70) ** 2] * 2, rtol=1e-14)


def test_analyse_maps_the_analysis_over_data_sets():
    frames = [pd.DataFrame({"x": v}) for v in ([0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1])]

    def share(df):
        p = df["x"].mean()
        return p, p * (1 - p) / len(df)

    # shares 3/4, 1/2, 1/4: q̄ = 1/2, b = 1/16, ū = (3/64 + 4/64 + 3/64)/3 = 5/96
    r = analyse(frames, share)
    assert r.estimate == pytest.approx(0.5)
    assert r.between == pytest.approx(1 / 16)
    assert r.within == pytest.approx(5 / 96)
    assert r.variance == pytest.approx(4 / 3 / 16 - 5 / 96)
    with pytest.raises(TypeError, match="must return \\(estimate, variance\\)"):
        analyse(frames, lambda df: df["x"].mean())


def test_normal_interval_and_bad_input():
    lo, hi = normal_interval(1.0, 4.0, 0.9)
    assert hi - 1.0 == pytest.approx(2 * 1.6448536269514722, rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        rubin([1.0], [1.0])
    with pytest.raises(ValueError, match="same shape"):
        rubin([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        rubin([1.0, np.nan], [1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        rubin([1.0, 2.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="size_ratio"):
        rubin([1.0, 2.0], [1.0, 1.0], size_ratio=0)
    with pytest.raises(ValueError, match="level"):
        rubin(Q, U).conf_int(90)
