"""The certified reference solvers (``tests/oracles/certified.py``) against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from oracles.certified import newton_minimize, project_simplex_bisection, simplex_qp


def test_bisection_projection_closed_forms() -> None:
    # two points with |v0 − v1| < t: w = ((t + v0 − v1)/2, (t − v0 + v1)/2)
    np.testing.assert_allclose(project_simplex_bisection(np.array([0.4, 0.1])), [0.65, 0.35],
                               atol=1e-15)
    np.testing.assert_allclose(project_simplex_bisection(np.array([0.4, 0.1]), 3.0),
                               [1.65, 1.35], atol=1e-14)
    # one dominant entry: a vertex; equal entries: uniform
    np.testing.assert_allclose(project_simplex_bisection(np.array([5.0, 0.0, -1.0])),
                               [1.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(project_simplex_bisection(np.full(4, -3.0), 2.0),
                               np.full(4, 0.5), atol=1e-15)
    # a point of the simplex is its own projection
    np.testing.assert_allclose(project_simplex_bisection(np.array([0.2, 0.3, 0.5])),
                               [0.2, 0.3, 0.5], atol=1e-15)


def test_newton_solves_a_quadratic_and_a_logistic_problem() -> None:
    rng = np.random.default_rng(0)
    m = rng.normal(size=(5, 5))
    h, b = m @ m.T + np.eye(5), rng.normal(size=5)

    def quadratic(x):
        return 0.5 * x @ h @ x - b @ x, h @ x - b, h

    x, _ = newton_minimize(quadratic, np.zeros(5), gtol=1e-12)
    np.testing.assert_allclose(x, np.linalg.solve(h, b), atol=1e-10)

    # log(1 + e^x) − x/4 has its minimum where the logistic function is 1/4: x = −log 3
    def logistic(x):
        s = 1.0 / (1.0 + np.exp(-x[0]))
        return (np.logaddexp(0.0, x[0]) - x[0] / 4, np.array([s - 0.25]),
                np.array([[s * (1 - s)]]))

    x, _ = newton_minimize(logistic, np.array([5.0]), gtol=1e-13)
    assert x[0] == pytest.approx(-np.log(3.0), abs=1e-12)


def test_newton_refuses_an_uncertified_answer() -> None:
    def unbounded(x):  # e^{-x}: convex, no minimiser, the gradient never vanishes in 3 steps
        return np.exp(-x[0]), np.array([-np.exp(-x[0])]), np.array([[np.exp(-x[0])]])

    with pytest.raises(AssertionError, match="not certified"):
        newton_minimize(unbounded, np.array([0.0]), gtol=1e-12, max_iters=3)


def test_simplex_qp_projects_when_a_is_the_identity() -> None:
    # A = I, unit weights: the minimiser of ½‖p − y‖² over the simplex is the projection of y
    y = np.array([0.9, -0.2, 0.5, 0.45, 0.0])
    p, f = simplex_qp(np.eye(5), y, np.ones(5), gap_tol=1e-13)
    want = project_simplex_bisection(y)
    np.testing.assert_allclose(p, want, atol=1e-10)
    assert f == pytest.approx(0.5 * np.sum((want - y) ** 2), abs=1e-12)


def test_simplex_qp_on_a_rank_deficient_map_reaches_the_common_optimum() -> None:
    # both coordinates read together: every p gives A p = 1, so f* = ½ (1 − y)² for any p
    p, f = simplex_qp(np.ones((1, 2)), np.array([3.0]), np.ones(1))
    assert f == pytest.approx(2.0, abs=1e-12) and p.sum() == pytest.approx(1.0)
    with pytest.raises(AssertionError, match="not certified"):
        simplex_qp(np.diag([1.0, 0.1, 1.0]), np.array([0.9, 0.5, 0.3]), np.ones(3),
                   gap_tol=1e-14, max_iters=2)
