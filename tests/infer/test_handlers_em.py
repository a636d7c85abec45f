"""The ``nlbp`` effect handler and ``EM`` over NumPyro models.

The handler must give exactly what :func:`nlbp_map` gives for the equivalent evidence written by
hand; ``EM`` must match :func:`cgm_em` on the same problem; the general (L-BFGS) M-step must
reach the maximiser of ``θ(params)·n̂ − N·A(θ(params))``, checked by brute-force enumeration
and scipy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from oracles.brute_force import BruteForce, features
from oracles.certified import newton_minimize
from scipy.special import logsumexp

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions import CollectiveGraphicalModel, GaussianNoise, LaplaceNoise
from numpyro_dpgm.estimation import cgm_em
from numpyro_dpgm.infer import EM, nlbp
from numpyro_dpgm.infer.em import EMConvergenceWarning
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.oracles.nlbp import nlbp_map

CHAIN = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
N = 150.0
ITERS = 300




def truth(net: MarkovNetwork, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-1, 1, net.num_params)
    bf = BruteForce(net, theta)
    return theta, N * features(net, bf.records()).T @ bf.probs()


THETA0 = np.random.default_rng(99).uniform(-0.5, 0.5, CHAIN.num_params)
_, N_TRUE = truth(CHAIN, 0)
Y = N_TRUE + np.random.default_rng(1).laplace(0, 2.0, CHAIN.num_params)
# one-way table of "a" from the (a, b) table, as a linear query of n
Q_A = np.kron(np.eye(2), np.ones((1, 3))) @ np.eye(CHAIN.num_params)[CHAIN.slice_of(("a", "b"))]
Y_A = Q_A @ N_TRUE + np.array([6.0, -4.0])


def laplace_model(y, b):
    theta = numpyro.param("theta", jnp.asarray(THETA0))
    n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
    numpyro.sample("y", LaplaceNoise(n, b), obs=y)


def gaussian_model(y, s):
    theta = numpyro.param("theta", jnp.asarray(THETA0))
    n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
    numpyro.sample("y", GaussianNoise(n, s), obs=y)


def query_model(y, q, b):
    theta = numpyro.param("theta", jnp.asarray(THETA0))
    n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
    numpyro.sample("y", LaplaceNoise(q @ n, b), obs=y)


def l1(n, y, b):
    return -jnp.sum(jnp.abs(y - n)) / b


def l2(n, y, s):
    return -jnp.sum((y - n) ** 2) / (2 * s**2)


def l1_query(n, y, q, b):
    return -jnp.sum(jnp.abs(y - q @ n)) / b


CASES = {
    # name: (model, model args, hand-written evidence, its args, constant log p(y|n) − evidence)
    "laplace": (laplace_model, (Y, 2.0), l1, (Y, 2.0), -12 * math.log(4.0)),
    "gaussian": (gaussian_model, (Y, 3.0), l2, (Y, 3.0), -6 * math.log(2 * math.pi * 9.0)),
    "query": (query_model, (Y_A, Q_A, 2.0), l1_query, (Y_A, Q_A, 2.0), -2 * math.log(4.0)),
}


# ------------------------------------------------------------------------------------------------
# the handler
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("space", ["natural", "counts"])
def test_handler_equals_nlbp_map(name: str, space: str) -> None:
    model, args, evidence, ev_args, const = CASES[name]
    handler = nlbp(model, latent="n", space=space, max_iters=ITERS)
    tr = handlers.trace(handler).get_trace(*(jnp.asarray(a) for a in args))
    direct = nlbp_map(CHAIN, jnp.asarray(THETA0), N, evidence,
                      tuple(jnp.asarray(a) for a in ev_args), space=space, max_iters=ITERS)
    got = handler.results["n"]
    np.testing.assert_allclose(np.asarray(tr["n"]["value"]), np.asarray(direct.n),
                               rtol=1e-10, atol=1e-9)
    assert tr["n"]["infer"]["nlbp"] is got
    assert int(got.iterations) == int(direct.iterations)
    # the model's log p(y|n) carries the normalising constant of the noise density
    np.testing.assert_allclose(float(got.objective) - float(direct.objective), const,
                               rtol=1e-10, atol=1e-8)
    # the observed site sees the MAP value
    np.testing.assert_allclose(
        np.asarray(tr["y"]["fn"].base_dist.loc),
        np.asarray(direct.n) if name != "query" else Q_A @ np.asarray(direct.n),
        rtol=1e-10, atol=1e-9)


def test_handler_sees_upstream_sample_sites() -> None:
    """Sites before the CGM site keep their values inside the evidence (no resampling)."""

    def model(y):
        b = numpyro.sample("b", dist.Uniform(1.0, 4.0))
        theta = numpyro.param("theta", jnp.asarray(THETA0))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
        numpyro.sample("y", LaplaceNoise(n, b), obs=y)

    handler = nlbp(model, latent="n", max_iters=ITERS)
    tr = handlers.trace(handlers.seed(handler, 3)).get_trace(jnp.asarray(Y))
    b = float(tr["b"]["value"])
    direct = nlbp_map(CHAIN, jnp.asarray(THETA0), N, l1, (jnp.asarray(Y), b), max_iters=ITERS)
    np.testing.assert_allclose(np.asarray(tr["n"]["value"]), np.asarray(direct.n),
                               rtol=1e-10, atol=1e-9)


def test_latent_site_after_the_cgm_is_an_error() -> None:
    def model(y):
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
        shift = numpyro.sample("shift", dist.Normal(0.0, 1.0))
        numpyro.sample("y", LaplaceNoise(n + shift, 2.0), obs=y)

    with pytest.raises(ValueError, match="latent"):
        handlers.trace(handlers.seed(nlbp(model, latent="n", max_iters=5), 0)).get_trace(
            jnp.asarray(Y))


def test_wrong_site_distribution_is_a_type_error() -> None:
    def model(y):
        n = numpyro.sample("n", dist.Normal(jnp.zeros(CHAIN.num_params), 1.0).to_event(1))
        numpyro.sample("y", LaplaceNoise(n, 2.0), obs=y)

    with pytest.raises(TypeError, match="CollectiveGraphicalModel"):
        handlers.trace(handlers.seed(nlbp(model, latent="n"), 0)).get_trace(jnp.asarray(Y))


def test_observed_cgm_site_and_bad_options_are_errors() -> None:
    def model(y, n_obs):
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N), obs=n_obs)
        numpyro.sample("y", LaplaceNoise(n, 2.0), obs=y)

    with pytest.raises(ValueError, match="observed"):
        handlers.trace(nlbp(model, latent="n")).get_trace(jnp.asarray(Y), jnp.asarray(N_TRUE))
    with pytest.raises(ValueError, match="smoothing"):
        nlbp(laplace_model, latent="n", smoothing=0.0)


# ------------------------------------------------------------------------------------------------
# EM
# ------------------------------------------------------------------------------------------------
def _counted(ref) -> np.ndarray:
    """Which of ``cgm_em``'s E-steps are iterations: those that moved ``θ``, and the last."""
    counted = np.array(ref.extras["estep_moved"], dtype=bool)
    counted[-1] = True
    return counted


def _assert_same_fit(fit, ref) -> None:
    """``EM``'s fit and ``cgm_em``'s agree: iterations, convergence, the marginal change of
    every iteration (``cgm_em`` also records the damping's retries, :func:`_counted`), the last
    E-step's counts and the fitted marginals."""
    assert fit.iterations == ref.iterations and fit.converged == ref.converged
    np.testing.assert_allclose(fit.extras["marginal_change"],
                               np.asarray(ref.extras["marginal_change"])[_counted(ref)],
                               rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(fit.extras["n"]), np.asarray(ref.extras["n_hat"]),
                               rtol=1e-9, atol=1e-8)
    for c in CHAIN.cliques:
        np.testing.assert_allclose(np.asarray(fit.model.marginal(c)),
                                   np.asarray(ref.model.marginal(c)), rtol=1e-9, atol=1e-10)


def test_em_equals_cgm_em() -> None:
    b = 2.0

    def model(y, scale):
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
        numpyro.sample("y", LaplaceNoise(n, scale), obs=y)

    iters, inner = 6, 40
    # init="param": EM's default start is the noisy tables' naive fit; this one is cgm_em's zeros
    fit = EM(model, latent="n", init="param", max_iters=iters, inner_iters=inner).run(
        jax.random.key(0), jnp.asarray(Y), b)
    meas = [Measurement(c, Y[CHAIN.slice_of(c)], Laplace(b)) for c in CHAIN.cliques]
    ref = cgm_em(meas, CHAIN, total_count=N, max_iters=iters, inner_iters=inner, init="zeros")
    # here both stop early, converged: after 4 iterations sign(y − n̂) is a gauge direction, so
    # n̂ is an L1 projection of y onto N·M (a MAP-EM fixed point)
    _assert_same_fit(fit, ref)
    # cgm_em's E-step objective omits the noise constant −m·log(2b) (both gauge-fix θ)
    np.testing.assert_allclose(np.asarray(fit.loss_trace) + 12 * math.log(2 * b),
                               ref.extras["estep_objective"][_counted(ref)],
                               rtol=1e-10)
    # moment matching: the fitted model's marginals are the last E-step's counts / N
    bf = BruteForce(CHAIN, np.asarray(fit.params["theta"]))
    mu = features(CHAIN, bf.records()).T @ bf.probs()
    np.testing.assert_allclose(N * mu, np.asarray(fit.extras["n"]), rtol=1e-9, atol=1e-8)


def test_em_on_a_model_of_your_own_is_cgm_em_s_compiled_loop() -> None:
    """Two releases of the tables (Laplace and Gaussian) and a noise scale read from a param
    upstream of the CGM: EM runs the compiled loop of ``cgm_em`` (``infer.em_program``) with
    the model's own observed sites as its evidence, so it reaches the same fit as ``cgm_em`` on
    the equivalent measurements; its callback sees every iteration's params, and a refit with
    new values, total and scales (arrays: the program's arguments; a Python number is part of
    the program) compiles nothing new."""
    from numpyro_dpgm.infer import em_program
    from numpyro_dpgm.measurements import Gaussian

    def model(y1, y2, total, sigma):
        b = numpyro.param("b", 2.0, constraint=dist.constraints.positive)
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, total))
        numpyro.sample("y1", LaplaceNoise(n, b), obs=y1)
        numpyro.sample("y2", GaussianNoise(n, sigma), obs=y2)

    y2 = N_TRUE + np.random.default_rng(2).normal(0, 3.0, CHAIN.num_params)
    seen = []
    em = EM(model, latent="n", init="param", max_iters=8, inner_iters=40)
    with pytest.warns(EMConvergenceWarning, match="iteration limit"):
        fit = em.run(jax.random.key(0), jnp.asarray(Y), jnp.asarray(y2), jnp.asarray(N),
                     jnp.asarray(3.0), callback=lambda t, params: seen.append((t, params["theta"])))
    meas = [Measurement(c, Y[CHAIN.slice_of(c)], Laplace(2.0)) for c in CHAIN.cliques]
    meas += [Measurement(c, y2[CHAIN.slice_of(c)], Gaussian(3.0)) for c in CHAIN.cliques]
    ref = cgm_em(meas, CHAIN, total_count=N, max_iters=8, inner_iters=40, init="zeros")
    # one E-step found nothing better than its start and was retried with half the damping:
    # cgm_em records that retry, EM counts iterations only
    assert fit.extras["damping_halvings"] == 1 and not ref.extras["estep_moved"].all()
    _assert_same_fit(fit, ref)
    assert [t for t, _ in seen] == list(range(1, fit.iterations + 1))
    np.testing.assert_array_equal(np.asarray(seen[-1][1]), np.asarray(fit.params["theta"]))
    assert float(fit.params["b"]) == 2.0  # the free M-step moves θ only
    sizes = em_program.em_start_state._cache_size(), em_program.em_block._cache_size()
    with pytest.warns(EMConvergenceWarning):  # cut short at three iterations
        em3 = EM(model, latent="n", init="param", max_iters=3, inner_iters=20, tol=1e-9)
        em3.run(jax.random.key(1), jnp.asarray(Y) + 1.0, jnp.asarray(y2) - 1.0,
                jnp.asarray(2 * N), jnp.asarray(1.5))
    assert (em_program.em_start_state._cache_size(), em_program.em_block._cache_size()) == sizes


def _stiff_model(y, s):
    theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
    n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
    numpyro.sample("y", GaussianNoise(n, s), obs=y)


def test_em_does_not_call_a_stalled_e_step_convergence() -> None:
    """Stiff Gaussian evidence (N/σ² = 600) and no halving allowed: NLBP at its default
    damping finds nothing better than its warm start, so θ stops moving at once; that is not
    an EM fixed point, and EM says so. From the uniform start (init="param"; the default start
    is the tables' naive fit)."""
    with pytest.warns(EMConvergenceWarning, match="last E-step had not converged"):
        fit = EM(_stiff_model, latent="n", init="param", max_iters=20, inner_iters=30,
                 max_halvings=0).run(jax.random.key(0), jnp.asarray(N_TRUE), 0.5)
    assert fit.iterations == 1 and fit.extras["marginal_change"][0] == 0.0
    assert not fit.converged and fit.extras["damping_halvings"] == 0
    # the model is still uniform, far from the data's marginals
    assert np.max(np.abs(np.asarray(fit.extras["n"]) - N_TRUE)) > 1.0


def test_em_retries_a_stalled_e_step_with_half_the_damping() -> None:
    """The same evidence with the default halvings: EM reaches its fixed point, which for
    consistent tables ``y ∈ N·M`` and Gaussian noise is ``n̂ = y`` (``θ`` moment-matched to
    ``y`` makes ``n = y`` stationary), so the fitted model's marginals are ``y / N``. From the
    uniform start (init="param"), where the first E-step stalls."""
    fit = EM(_stiff_model, latent="n", init="param", max_iters=300, inner_iters=30,
             tol=1e-12).run(jax.random.key(0), jnp.asarray(N_TRUE), 0.5)
    assert fit.converged and fit.extras["damping_halvings"] > 0
    bf = BruteForce(CHAIN, np.asarray(fit.params["theta"]))
    np.testing.assert_allclose(N * features(CHAIN, bf.records()).T @ bf.probs(), N_TRUE,
                               rtol=0, atol=1e-6)


# time-homogeneous chain: one pairwise potential ψ shared by (a, b) and (b, c)
TIED = MarkovNetwork({"a": 3, "b": 3, "c": 3}, [("a", "b"), ("b", "c")])


def tied_model(y, scale):
    psi = numpyro.param("psi", jnp.zeros(9))
    theta = jnp.concatenate([psi, psi])
    n = numpyro.sample("n", CollectiveGraphicalModel(TIED, theta, N))
    numpyro.sample("y", LaplaceNoise(n, scale), obs=y)


def _tied_data() -> np.ndarray:
    rng = np.random.default_rng(5)
    psi = rng.uniform(-1.5, 1.5, 9)
    bf = BruteForce(TIED, np.concatenate([psi, psi]))
    n = N * features(TIED, bf.records()).T @ bf.probs()
    return n + rng.laplace(0, 1.0, n.shape)


@pytest.mark.parametrize("space", ["natural", "counts"])
def test_general_m_step_maximises_the_tied_objective(space: str) -> None:
    y = _tied_data()
    # two iterations, from the uniform start (θ is no param of its own: no noisy start)
    with pytest.warns(EMConvergenceWarning, match="max_iters=2"):
        fit = EM(tied_model, latent="n", max_iters=2, inner_iters=60, space=space).run(
            jax.random.key(0), jnp.asarray(y), 1.0)
    assert fit.extras["init"] == "param"
    n_hat = np.asarray(fit.extras["n"])
    psi = np.asarray(fit.params["psi"])
    phi = features(TIED, BruteForce(TIED, np.zeros(18)).records())
    tied = np.vstack([np.eye(9), np.eye(9)])  # θ = tied @ ψ

    def neg_q(p: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        s = phi @ (tied @ p)
        log_z = logsumexp(s)
        prob = np.exp(s - log_z)
        mu = phi.T @ prob
        cov = phi.T @ (prob[:, None] * phi) - np.outer(mu, mu)
        return (-(tied @ p) @ n_hat + N * log_z, -tied.T @ (n_hat - N * mu),
                N * tied.T @ cov @ tied)

    value, grad, _ = neg_q(psi)
    # the gradient of θ(ψ)·n̂ − N·A(θ(ψ)) vanishes at the M-step's answer
    assert np.max(np.abs(grad)) <= 1e-6 * N, grad
    # a second algorithm: Newton's method by enumeration, certified by its own gradient (convex)
    _, ref_fun = newton_minimize(neg_q, np.zeros(9), gtol=1e-10 * N)
    assert value <= ref_fun + 1e-8 * abs(ref_fun)
    assert value - ref_fun <= 1e-8 * abs(ref_fun)
    # the model is still the tied family
    theta = np.asarray(fit.model.theta)
    np.testing.assert_allclose(theta[:9], theta[9:], rtol=0, atol=0)


def test_general_m_step_reaches_moment_matching_with_its_proximal_term() -> None:
    """``θ·1`` hides the param from the moment-matching M-step, so the general (L-BFGS) M-step
    runs on the over-complete layout, where ``Q`` is flat along the gauge. With its proximal
    term it must give the same models as moment matching, iteration by iteration, and keep
    ``θ`` near its start along the gauge (fixed points are unchanged by the term). On this
    small model L-BFGS does not drift without the term either; the drift it prevents was
    measured on a 10-node ER graph (``EM``'s ``m_step_prox``)."""
    b = 2.0

    def model(y, scale):
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta, N))
        numpyro.sample("y", LaplaceNoise(n, scale), obs=y)

    def hidden(y, scale):
        theta = numpyro.param("theta", jnp.zeros(CHAIN.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(CHAIN, theta * 1.0, N))
        numpyro.sample("y", LaplaceNoise(n, scale), obs=y)

    for iters in (1, 3):
        with pytest.warns(EMConvergenceWarning, match="iteration limit"):
            ref = EM(model, latent="n", init="param", max_iters=iters, inner_iters=40).run(
                jax.random.key(0), jnp.asarray(Y), b)
            fit = EM(hidden, latent="n", max_iters=iters, inner_iters=40).run(
                jax.random.key(0), jnp.asarray(Y), b)
        for c in CHAIN.cliques:
            np.testing.assert_allclose(np.asarray(fit.model.marginal(c)),
                                       np.asarray(ref.model.marginal(c)), atol=1e-7)
        assert np.max(np.abs(np.asarray(fit.params["theta"]))) < 10.0
    with pytest.raises(ValueError, match="m_step_prox"):
        EM(hidden, latent="n", m_step_prox=-1.0)


def test_em_errors() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EM(laplace_model, latent="n", max_iters=0)
    with pytest.raises(ValueError, match="at least 1"):
        EM(laplace_model, latent="n", inner_iters=0)
