"""The fast approximate path (:func:`numpyro_dpgm.infer.bayes.run_laplace`): its mode and
curvature against a closed form of the collapsed posterior, its draws against that normal law
and the tables' exact conditional, the library's model against the same model written by hand,
and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.optimize
from scipy import stats

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
from numpyro_dpgm.infer import run_laplace
from numpyro_dpgm.infer.bayes import conditional_coding, noisy_marginals_model
from numpyro_dpgm.measurements import Laplace, Measurement

numpyro.enable_x64()

NET1, TOTAL1, B1 = MarkovNetwork({"a": 2}, [("a",)]), 1000, 20.0
Y1 = np.array([310.0, 655.0])


def one_binary(y):
    t = numpyro.sample("t", dist.Normal(0.0, 1.0))
    n = numpyro.sample("n", CollectiveGraphicalModel(NET1, jnp.stack([0.0, t]), TOTAL1))
    numpyro.sample("y", LaplaceNoise(n, B1), obs=y)


def closed_form(t: float) -> tuple[float, np.ndarray, np.ndarray]:
    """``log p(t) + log N(y; (N − Np, Np), Np(1−p) [[1, −1], [−1, 1]] + 2b² I)``: the collapsed
    posterior's log density with the noise Gaussian of the Laplace noise's variance, and the
    mean and covariance of ``y`` given ``t``."""
    p = 1.0 / (1.0 + np.exp(-t))
    mean = np.array([TOTAL1 * (1 - p), TOTAL1 * p])
    cov = TOTAL1 * p * (1 - p) * np.array([[1.0, -1.0], [-1.0, 1.0]]) + 2 * B1**2 * np.eye(2)
    return (stats.norm.logpdf(t) + stats.multivariate_normal.logpdf(Y1, mean, cov)), mean, cov


def test_mode_and_curvature_match_the_closed_form():
    """``ẑ`` and ``H⁻¹`` of one binary attribute's collapsed posterior (N = 1,000, b = 20)
    against a direct optimisation and a finite-difference second derivative of (1)'s closed
    form; the draws of ``t`` follow ``N(ẑ, H⁻¹)`` and ``n₁`` its conditional given ``t``."""
    found = scipy.optimize.minimize_scalar(lambda t: -closed_form(t)[0], bounds=(-2, 3),
                                           method="bounded", options={"xatol": 1e-10})
    h = 1e-4
    curvature = -(closed_form(found.x + h)[0] - 2 * closed_form(found.x)[0]
                  + closed_form(found.x - h)[0]) / h**2
    fit = run_laplace(one_binary, jax.random.key(0), Y1, num_samples=20_000)
    assert fit.path == "laplace" and fit.converged and "'n'" in fit.path_reason
    assert abs(float(fit.laplace.mode["t"]) - found.x) < 1e-6
    np.testing.assert_allclose(float(fit.laplace.inverse_mass_matrix[0, 0]), 1 / curvature,
                               rtol=1e-4)
    t = np.asarray(fit.samples["t"])
    sd = np.sqrt(1 / curvature)
    assert abs(t.mean() - found.x) < 5 * sd / np.sqrt(t.size)
    assert abs(t.std() / sd - 1) < 0.03  # the sd of 20,000 normal draws: within 5 % of 0.5 %
    # n₁ given t: the Gaussian conditional of n₁ given y (v = 2b²), averaged over the draws
    n = np.asarray(fit.samples["n"])
    assert n.shape == (20_000, 2) and np.allclose(n.sum(1), TOTAL1)
    expected = []
    for ti in t[:2000]:
        _, mean, cov = closed_form(ti)
        p = 1.0 / (1.0 + np.exp(-ti))
        cross = TOTAL1 * p * (1 - p) * np.array([-1.0, 1.0])  # Cov(n₁, y)
        expected.append(TOTAL1 * p + cross @ np.linalg.solve(cov, Y1 - mean))
    assert abs(n[:2000, 1].mean() - np.mean(expected)) < 5 * n[:2000, 1].std() / np.sqrt(2000)


def test_library_model_and_the_same_model_by_hand_share_the_mode():
    """The library's model (its search started at the released log odds) and the same model
    written with the public distributions (started at ``φ = 0``), both through the
    :class:`~numpyro_dpgm.infer.bayes.collapse.collapse` handler: the same mode in ``φ``."""
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    rng = np.random.default_rng(0)
    ab = np.array([[400.0, 100, 300], [200, 600, 400]])
    bc = np.array([[500.0, 100], [300, 400], [200, 500]])
    ms = [Measurement(("a", "b"), ab + rng.laplace(0, 2, ab.shape), Laplace(2.0)),
          Measurement(("b", "c"), bc + rng.laplace(0, 2, bc.shape), Laplace(2.0))]
    lib = noisy_marginals_model(net, ms, 2000)
    coding = lib.coding
    assert type(coding) is type(conditional_coding(net))  # the public coding
    y = np.concatenate([np.ravel(m.values) for m in ms])

    def by_hand(y):
        phi = numpyro.sample("phi", dist.Normal(0.0, lib.prior_scale).expand([coding.dim])
                             .to_event(1))
        theta = numpyro.deterministic("theta", coding.to_theta(phi))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, 2000, normalized=True))
        numpyro.sample("y", LaplaceNoise(lib.predict(n), 2.0), obs=y)

    ours = run_laplace(lib, jax.random.key(0), num_samples=100)
    yours = run_laplace(by_hand, jax.random.key(0), y, num_samples=100)
    phi_lib = np.asarray(ours.samples["phi"])
    assert phi_lib.shape == (100, coding.dim) and ours.samples["n"].shape == (100, net.num_params)
    # the same mode within the searches' tolerance: a thousandth of a posterior sd
    gap = np.abs(np.asarray(ours.laplace.mode["phi"]) - np.asarray(yours.laplace.mode["phi"]))
    assert np.all(gap <= 1e-3 * phi_lib.std(0)), (gap, phi_lib.std(0))


def test_errors_say_what_is_wrong():
    def no_tables(y):
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(x, 1.0), obs=y)

    with pytest.raises(ValueError, match="run_laplace integrates the tables out"):
        run_laplace(no_tables, jax.random.key(0), 1.0)
    with pytest.raises(ValueError, match="num_samples must be at least 2"):
        run_laplace(one_binary, jax.random.key(0), Y1, num_samples=1)


def test_arviz_names_the_cells_and_the_path():
    """``to_inference_data(fit, network)`` of a model of your own: one chain of the fit's draws,
    the tables' cells as coordinates, the path in the posterior's attributes."""
    from numpyro_dpgm.infer.diagnostics import to_inference_data

    fit = run_laplace(one_binary, jax.random.key(1), Y1, num_samples=50)
    tree = to_inference_data(fit, NET1)
    n = tree["posterior"]["n"]
    assert n.shape == (1, 50, 2) and "cell" in n.dims
    assert tree["posterior"].attrs["cgm_path"] == "laplace"
    np.testing.assert_allclose(n.values[0], np.asarray(fit.samples["n"]))
