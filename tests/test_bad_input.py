"""Bad-input corpus: every public entry point fed malformed input raises a clear error.

Each case names the call, the exception type and a fragment of its message (what is wrong and,
where the library says it, what to do). Inputs: wrong shapes, dtypes, NaN/inf, negative
counts, unknown attributes, mismatched domains, ε ≤ 0, δ ∉ (0, 1), float32 where float64 is
needed. The checks run before any program is compiled, so the corpus is cheap.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from numpyro_dpgm import CliqueTables, Domain, MarkovNetwork, MarkovRandomField, count, metrics
from numpyro_dpgm._precision import Float32Warning
from numpyro_dpgm.data import count_file
from numpyro_dpgm.distributions import CollectiveGraphicalModel, GaussianNoise, LaplaceNoise
from numpyro_dpgm.estimation import cgm_em, naive_mle, prox_pgm
from numpyro_dpgm.infer.bayes import ConditionalDirichlet, conditional_coding
from numpyro_dpgm.learners import learn_ising, learn_pairwise, private_frank_wolfe
from numpyro_dpgm.measurements import Gaussian, Laplace, Measurement
from numpyro_dpgm.mechanisms import mwem_pgm
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.privacy import (
    ZCDP,
    ApproxDP,
    BudgetExceededError,
    PrivacyBudget,
    PrivacyLedger,
    PureDP,
    release,
    simulate_release,
)

D = Domain({"a": 2, "b": 3, "c": 2})
NET = MarkovNetwork(D, [("a", "b"), ("b", "c")])
X = np.array([[0, 1, 0], [1, 2, 1], [0, 0, 1], [1, 1, 0]])
KEY = jax.random.key(0)
THETA = jnp.zeros(NET.num_params)
OTHER = Domain({"a": 2, "b": 2, "c": 2})


def _meas(clique: tuple[str, ...] = ("a", "b"), values: Any = None, noise: Any = None) -> Any:
    values = np.zeros(D.size(clique)) if values is None else values
    return Measurement(clique, values, Laplace(1.0) if noise is None else noise)


def _good() -> list[Measurement]:
    return [_meas(("a", "b")), _meas(("b", "c"))]


def _nan_records() -> np.ndarray:
    x = X.astype(float)
    x[2, 1] = np.nan
    return x


def _overspend() -> None:
    ledger = PrivacyLedger(1.0)
    release(X, NET, 0.6, domain=D, ledger=ledger)
    release(X, NET, 0.6, domain=D, ledger=ledger)


EPS_MSG = "epsilon must be a positive finite number"
DELTA_MSG = "delta must lie strictly between 0 and 1"

# (id, call, exception type, message fragment as a regex)
CASES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    # Domain
    ("domain-list", lambda: Domain([("a", 2)]), TypeError, "expects a mapping"),
    ("domain-zero", lambda: Domain({"a": 0}), ValueError, "must be at least 1, got 0"),
    ("domain-negative", lambda: Domain({"a": -2}), ValueError, "must be at least 1"),
    ("domain-float", lambda: Domain({"a": 2.5}), TypeError, "must be an integer, got 2.5"),
    ("domain-nan", lambda: Domain({"a": float("nan")}), TypeError, "must be an integer"),
    ("domain-name", lambda: Domain({"": 2}), TypeError, "non-empty strings"),
    # MarkovNetwork
    ("net-unknown-attr", lambda: MarkovNetwork(D, [("a", "z")]), KeyError,
     r"unknown attribute\(s\) \['z'\]"),
    ("net-empty-clique", lambda: MarkovNetwork(D, [()]), ValueError, "empty clique"),
    ("net-repeated-attr", lambda: MarkovNetwork(D, [("a", "a")]), ValueError, "repeats"),
    ("net-string-cliques", lambda: MarkovNetwork(D, "ab"), TypeError,
     "sequence of tuples"),
    ("net-flatten-shape", lambda: NET.flatten({("a", "b"): np.zeros((3, 2)),
                                               ("b", "c"): np.zeros((3, 2))}),
     ValueError, r"has shape \(3, 2\); expected"),
    ("net-unflatten-length", lambda: NET.unflatten(np.zeros(5)), ValueError,
     r"shape \(5,\); the network expects \(\.\.\., 12\)"),
    # CliqueTables
    ("tables-not-mapping", lambda: CliqueTables([1, 2]), TypeError, "expects a mapping"),
    ("tables-axes", lambda: CliqueTables({("a", "b"): np.zeros(2)}), ValueError,
     "has 1 axes; it needs one per attribute"),
    ("tables-mismatched", lambda: CliqueTables({("a",): np.ones(2)}) + CliqueTables(
        {("b",): np.ones(3)}), ValueError, "different cliques"),
    # count
    ("count-shape", lambda: count(np.zeros((4, 2), int), NET.cliques, D), ValueError,
     r"shape \(4, 2\); expected \(num_records, 3\)"),
    ("count-nan", lambda: count(_nan_records(), NET.cliques, D), ValueError,
     r"column 'b' has 1 missing or non-finite"),
    ("count-inf", lambda: count(np.where(X == 2, np.inf, X), NET.cliques, D), ValueError,
     "column 'b' has 1 missing or non-finite"),
    ("count-out-of-domain", lambda: count(X, NET.cliques, OTHER), ValueError,
     r"column 'b' has 1 code\(s\) outside 0..1"),
    ("count-negative-code", lambda: count(-X, NET.cliques, D), ValueError, "outside 0..1"),
    ("count-fraction", lambda: count(X + 0.5, NET.cliques, D), ValueError, "non-integer value"),
    ("count-strings", lambda: count(X.astype(str), NET.cliques, D), TypeError,
     "column 'a' has dtype <U"),
    ("count-unknown-attr", lambda: count(X, [("a", "z")], D), KeyError, "'z'"),
    ("count-missing-column", lambda: count(pd.DataFrame(X[:, :2], columns=["a", "b"]),
                                           NET.cliques, D), KeyError, "no column 'c'"),
    ("count-negative-weights", lambda: count(X, NET.cliques, D, weights=-np.ones(4)),
     ValueError, "non-negative"),
    ("count-nan-weights", lambda: count(X, NET.cliques, D, weights=[1, np.nan, 1, 1]),
     ValueError, "finite"),
    ("count-weights-shape", lambda: count(X, NET.cliques, D, weights=np.ones(3)), ValueError,
     r"weights have shape \(3,\); expected \(4,\)"),
    ("count-file-missing", lambda: count_file("/nonexistent/records.csv", NET.cliques, D),
     FileNotFoundError, "no such file"),
    # release / simulate_release
    ("release-eps-zero", lambda: release(X, NET, 0.0, domain=D), ValueError, EPS_MSG),
    ("release-eps-negative", lambda: release(X, NET, -1.0, domain=D), ValueError, EPS_MSG),
    ("release-eps-nan", lambda: release(X, NET, float("nan"), domain=D), ValueError, EPS_MSG),
    ("release-eps-inf", lambda: release(X, NET, float("inf"), domain=D), ValueError, EPS_MSG),
    ("release-delta-zero", lambda: release(X, NET, ApproxDP(1.0, 0.0), domain=D,
                                           mechanism="gaussian"), ValueError, DELTA_MSG),
    ("release-delta-one", lambda: release(X, NET, ApproxDP(1.0, 1.0), domain=D,
                                          mechanism="gaussian"), ValueError, DELTA_MSG),
    ("release-delta-negative", lambda: ApproxDP(1.0, -1e-6), ValueError, DELTA_MSG),
    ("release-unknown-attr", lambda: release(X, [("a", "z")], 1.0, domain=D), KeyError,
     r"unknown attribute\(s\) \['z'\]"),
    ("release-mismatched-domain", lambda: release(X, MarkovNetwork(OTHER, [("a", "b")]), 1.0),
     ValueError, r"column 'b' has 1 code\(s\) outside 0..1"),
    ("release-mechanism", lambda: release(X, NET, 1.0, domain=D, mechanism="exponential"),
     ValueError, "unknown mechanism 'exponential'"),
    ("release-nan-records", lambda: release(_nan_records(), NET, 1.0, domain=D), ValueError,
     "missing or non-finite"),
    ("release-weight-above-bound", lambda: release(X, NET, 1.0, domain=D,
                                                   weights=[1, 2, 1, 1]),
     ValueError, "per-person bound"),
    ("simulate-no-key", lambda: simulate_release(X, NET, 1.0, None, domain=D), ValueError,
     "needs rng_key=, a JAX PRNG key"),
    ("simulate-sampler", lambda: simulate_release(X, NET, 1.0, KEY, domain=D, sampler="jax"),
     TypeError, "fixes sampler='jax'"),
    # budgets and ledger
    ("budget-negative", lambda: PrivacyBudget(-1.0), ValueError, EPS_MSG),
    ("pure-nan", lambda: PureDP(float("nan")), ValueError, EPS_MSG),
    ("zcdp-negative", lambda: ZCDP(-0.1), ValueError, "rho .* must be a positive finite"),
    ("ledger-zero", lambda: PrivacyLedger(0.0), ValueError, EPS_MSG),
    ("ledger-overspend", _overspend, BudgetExceededError,
     "costs ε = 0.6 but only ε = 0.4 is left. Nothing was charged"),
    # MarkovRandomField
    ("mrf-theta-shape", lambda: MarkovRandomField(NET, jnp.zeros(3)), ValueError,
     r"theta has shape \(3,\); this network needs \(\.\.\., 12\)"),
    ("mrf-theta-nan", lambda: MarkovRandomField(NET, jnp.full(NET.num_params, jnp.nan)),
     ValueError, "invalid theta"),
    ("mrf-theta-inf", lambda: MarkovRandomField(NET, jnp.full(NET.num_params, jnp.inf)),
     ValueError, "invalid theta"),
    ("mrf-network-type", lambda: MarkovRandomField("net", THETA), TypeError,
     "network must be a MarkovNetwork, got str"),
    ("mrf-record-width", lambda: MarkovRandomField(NET, THETA).log_prob(jnp.array([0, 1])),
     ValueError, r"records have shape \(2,\); expected \(\.\.\., 3\)"),
    ("mrf-record-float", lambda: MarkovRandomField(NET, THETA).log_prob(jnp.array([0.5, 1, 0])),
     TypeError, "records must be integer codes"),
    ("mrf-marginal-unknown", lambda: MarkovRandomField(NET, THETA).marginal(("z",)), KeyError,
     "unknown attribute"),
    # CollectiveGraphicalModel
    ("cgm-negative-total", lambda: CollectiveGraphicalModel(NET, THETA, -5), ValueError,
     "total_count must be a non-negative integer, got -5"),
    ("cgm-nan-total", lambda: CollectiveGraphicalModel(NET, THETA, float("nan")), ValueError,
     "total_count must be a non-negative integer"),
    ("cgm-fractional-total", lambda: CollectiveGraphicalModel(NET, THETA, 2.5), ValueError,
     "non-negative integer, got 2.5"),
    ("cgm-theta-shape", lambda: CollectiveGraphicalModel(NET, jnp.zeros(2), 10), ValueError,
     r"theta has shape \(2,\)"),
    # noise models and specs
    ("laplace-negative-scale", lambda: LaplaceNoise(jnp.zeros(3), -1.0), ValueError,
     "invalid scale"),
    ("laplace-zero-scale", lambda: LaplaceNoise(jnp.zeros(3), 0.0), ValueError,
     "invalid scale"),
    ("laplace-nan-loc", lambda: LaplaceNoise(jnp.array([0.0, jnp.nan]), 1.0), ValueError,
     "invalid loc"),
    ("gaussian-negative-scale", lambda: GaussianNoise(jnp.zeros(3), -1.0), ValueError,
     "invalid scale"),
    ("gaussian-scalar-loc", lambda: GaussianNoise(0.0, 1.0), ValueError, "needs a vector loc"),
    ("spec-laplace-negative", lambda: Laplace(-1.0), ValueError,
     "scale must be a positive finite number"),
    ("spec-gaussian-nan", lambda: Gaussian(float("nan")), ValueError, "positive finite"),
    ("measurement-nan", lambda: _meas(values=np.full(6, np.nan)), ValueError,
     "has non-finite values"),
    ("measurement-noise-type", lambda: Measurement(("a", "b"), np.zeros(6), 1.0), TypeError,
     "noise must be a NoiseSpec"),
    # estimators
    ("naive-negative-total", lambda: naive_mle(_good(), NET, total_count=-10), ValueError,
     "total_count must be a positive finite number"),
    ("naive-nan-total", lambda: naive_mle(_good(), NET, total_count=float("nan")), ValueError,
     "total_count must be a positive finite number"),
    ("naive-no-measurements", lambda: naive_mle([], NET, total_count=10), ValueError,
     "at least one measurement"),
    ("naive-mismatched-cells", lambda: naive_mle([_meas(values=np.zeros(4))], NET, total_count=10),
     ValueError, "covers 4 cells; the domain gives that clique 6 cells"),
    ("naive-unknown-clique",
     lambda: naive_mle([_meas(("a", "z"), np.zeros(6))], NET, total_count=10), KeyError,
     "unknown attribute"),
    ("naive-negative-l2", lambda: naive_mle(_good(), NET, total_count=10, l2=-1.0), ValueError,
     "l2 must be finite and non-negative"),
    ("cgm-em-negative-total", lambda: cgm_em(_good(), NET, total_count=-10), ValueError,
     "total_count must be a positive finite number"),
    ("cgm-em-iterations", lambda: cgm_em(_good(), NET, total_count=10, max_iters=-1), ValueError,
     "max_iters must be a positive integer"),
    ("cgm-em-init", lambda: cgm_em(_good(), NET, total_count=10, init="random"), ValueError,
     "unknown init 'random'"),
    ("cgm-em-halvings", lambda: cgm_em(_good(), NET, total_count=10, max_halvings=-1),
     ValueError, "max_halvings must be a non-negative integer, got -1"),
    ("cgm-em-half-a-halving", lambda: cgm_em(_good(), NET, total_count=10, max_halvings=2.5),
     ValueError, "max_halvings must be a non-negative integer, got 2.5"),
    ("prox-negative-total", lambda: prox_pgm(_good(), NET, total_count=-10, max_iters=5),
     ValueError,
     "total_count must be a positive finite number"),
    ("prox-inf-total",
     lambda: prox_pgm(_good(), NET, total_count=float("inf"), max_iters=5), ValueError,
     "total_count must be a positive finite number"),
    ("prox-iterations", lambda: prox_pgm(_good(), NET, total_count=10, max_iters=0), ValueError,
     "max_iters must be a positive integer"),
    ("prox-oracle",
     lambda: prox_pgm(_good(), NET, total_count=10, max_iters=5, oracle="bp"), ValueError,
     "unknown oracle 'bp'"),
    ("prox-mismatched-domain",
     lambda: prox_pgm(_good(), MarkovNetwork(OTHER, [("a", "b")]), total_count=10, max_iters=5),
     ValueError,
     "has 6 values; an identity query of that clique has 4 cells"),
    ("mwem-eps-zero", lambda: mwem_pgm(X, D, workload=[("a", "b")], budget=0.0, rounds=2,
                                       rng_key=KEY), ValueError,
     EPS_MSG),
    ("mwem-rounds", lambda: mwem_pgm(X, D, workload=[("a", "b")], budget=1.0, rounds=0,
                                     rng_key=KEY), ValueError,
     "rounds must be a positive integer"),
    ("mwem-unknown-attr", lambda: mwem_pgm(X, D, workload=[("a", "z")], budget=1.0, rounds=2,
                                           rng_key=KEY), KeyError,
     "unknown attribute"),
    ("ising-rho-negative",
     lambda: learn_ising(np.ones((10, 3)), budget=-1.0, width=1.0, rng_key=KEY), ValueError,
     "must be a positive finite number"),
    ("ising-not-binary",
     lambda: learn_ising(np.full((10, 3), 2), budget=1.0, width=1.0, rng_key=KEY), ValueError,
     "Ising data must be binary"),
    ("ising-nan", lambda: learn_ising(np.full((10, 3), np.nan), budget=1.0, width=1.0, rng_key=KEY),
     ValueError, "must be binary"),
    ("ising-width", lambda: learn_ising(np.ones((10, 3)), budget=1.0, width=-1.0, rng_key=KEY),
     ValueError, "width .* must be > 0"),
    ("pairwise-rho-negative", lambda: learn_pairwise(np.zeros((10, 3), int), budget=-1.0, width=1.0,
                                                     rng_key=KEY, domain=2),
     ValueError, "must be a positive finite number"),
    ("frank-wolfe-labels-shape", lambda: private_frank_wolfe(np.zeros((10, 3)), np.ones(9), 1.0,
                                                             radius=1.0, rng_key=KEY),
     ValueError, r"labels must have shape \(10,\), got \(9,\)"),
    ("frank-wolfe-labels", lambda: private_frank_wolfe(np.zeros((10, 3)), np.zeros(10), 1.0,
                                                       radius=1.0, rng_key=KEY),
     ValueError, "labels must be −1 or \\+1"),
    # junction-tree oracle
    ("oracle-theta-shape", lambda: jt.log_partition(NET, jnp.zeros(4)), ValueError,
     r"theta has shape \(4,\); the network expects \(12,\)"),
    ("oracle-method", lambda: jt.marginals(NET, THETA, method="greedy"), ValueError,
     "unknown triangulation method 'greedy'"),
    # metrics
    ("kl-domains", lambda: metrics.kl_divergence(
        MarkovRandomField(NET, THETA),
        MarkovRandomField(MarkovNetwork(Domain({"a": 2}), [("a",)]), jnp.zeros(2))),
     ValueError, "different domains"),
    ("kl-type", lambda: metrics.kl_divergence(THETA, THETA), TypeError,
     "expects MarkovRandomField"),
    ("tv-shapes", lambda: metrics.total_variation(jnp.ones(3), jnp.ones(4)), ValueError,
     r"different shapes \(3,\) and \(4,\)"),
    ("tv-nan", lambda: metrics.total_variation(jnp.array([jnp.nan, 1.0]), jnp.ones(2)),
     ValueError, "non-finite"),
    ("l1-unknown-attr", lambda: metrics.marginal_l1_error(
        MarkovRandomField(NET, THETA), CliqueTables({("z",): np.ones(2)})), KeyError,
     "unknown attribute"),
    ("l1-negative-table", lambda: metrics.marginal_l1_error(
        MarkovRandomField(NET, THETA), CliqueTables({("a",): np.array([-1.0, 2.0])})),
     ValueError, "non-negative with a positive sum"),
    ("l1-zero-table", lambda: metrics.marginal_l1_error(
        MarkovRandomField(NET, THETA), CliqueTables({("a",): np.zeros(2)})), ValueError,
     "positive sum"),
    ("l1-wrong-shape", lambda: metrics.marginal_l1_error(
        MarkovRandomField(NET, THETA), CliqueTables({("a",): np.ones(3)})), ValueError,
     "different shapes"),
]


@pytest.mark.parametrize("call,error,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(call: Callable[[], Any], error: type, message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message="Out-of-support")  # the error follows
        with pytest.raises(error, match=message):
            call()


@pytest.mark.filterwarnings("ignore:Out-of-support")
def test_out_of_domain_records_have_probability_zero() -> None:
    """Validated or not, a record outside the domain gets log-probability -inf (not garbage)."""
    mrf = MarkovRandomField(NET, THETA)
    lp = np.asarray(mrf.log_prob(jnp.array([[0, 3, 0], [0, -1, 1], [1, 2, 1]])))
    assert lp[0] == lp[1] == -np.inf
    assert lp[2] == pytest.approx(-np.log(12))
    with pytest.warns(UserWarning, match="Out-of-support"):
        lp = MarkovRandomField(NET, THETA, validate_args=True).log_prob(jnp.array([0, 5, 0]))
    assert float(lp) == -np.inf


def test_counts_are_float64_whatever_the_input_dtype() -> None:
    for dtype in (np.int8, np.int32, np.float32, np.float64):
        tables = count(X.astype(dtype), NET.cliques, D)
        assert all(t.dtype == np.float64 for t in tables.values())
        np.testing.assert_array_equal(tables[("a", "b")].sum(), 4)


@pytest.fixture
def float32_mode():
    """JAX's 64-bit mode off for one test (restored afterwards)."""
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", True)


def test_float32_mode_warns(float32_mode) -> None:
    """Without 64-bit mode, the routines that need float64 say so (and how to fix it)."""
    theta = jnp.zeros(NET.num_params)
    assert theta.dtype == jnp.float32
    for call in (lambda: MarkovRandomField(NET, theta),
                 lambda: CollectiveGraphicalModel(NET, theta, 10),
                 lambda: jt.log_partition(NET, theta),
                 lambda: ConditionalDirichlet(conditional_coding(NET), 0.5)):
        with pytest.warns(Float32Warning, match="numpyro.enable_x64"):
            call()


# ------------------------------------------------------------------------------------------------
# Command line: one-line errors with exit code 2
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    t = tmp_path_factory.mktemp("cli")
    df = pd.DataFrame({"a": [0, 1, 1, 0], "b": [0, 2, 1, 1]})
    df.to_csv(t / "x.csv", index=False)
    (t / "dom.json").write_text('{"a": 2, "b": 3}')
    nan = df.astype(float)
    nan.loc[1, "b"] = np.nan
    nan.to_csv(t / "nan.csv", index=False)
    df.assign(b=[0, 5, 1, 1]).to_csv(t / "oor.csv", index=False)
    (t / "junk.json").write_text("not json")
    (t / "list-domain.json").write_text("[]")
    (t / "taken.json").write_text("keep me")
    (t / "taken.csv").write_text("keep me")
    (t / "demo").mkdir()
    (t / "demo" / "summary.json").write_text("keep me")
    # a release recorded in its ledger (as `dpgm release` writes it)
    from numpyro_dpgm.io import save_measurements

    ledger = PrivacyLedger(PureDP(1.0))
    ledger.debit(PureDP(1.0), "laplace release of (a)")
    save_measurements(t / "released.json", [Measurement(("a",), np.zeros(2), Laplace(1.0))],
                      {"a": 2, "b": 3}, ledger=ledger)
    return t


def _out(t: Any, out: str, *more: str) -> list[str]:
    """A good release of x.csv, written to ``out``."""
    return ["release", str(t / "x.csv"), "--domain", str(t / "dom.json"), "--clique", "a,b",
            "--epsilon", "1", "--seed", "0", "--out", str(t / out), *more]


def _release(t: Any, data: str = "x.csv", clique: str = "a,b") -> list[str]:
    return ["release", str(t / data), "--out", str(t / "m.json"), "--domain", str(t / "dom.json"),
            "--clique", clique]


CLI_CASES: list[tuple[str, Callable[[Any], list[str]], str]] = [
    ("release-eps-zero", lambda t: _release(t) + ["--epsilon", "0"],
     "--epsilon must be positive, got 0.0"),
    ("release-eps-negative", lambda t: _release(t) + ["--epsilon", "-1"],
     "--epsilon must be positive"),
    ("release-eps-nan", lambda t: _release(t) + ["--epsilon", "nan"], "must be positive, got nan"),
    ("release-delta-above-one", lambda t: _release(t) + ["--epsilon", "1", "--delta", "1.5",
                                                         "--mechanism", "gaussian"], DELTA_MSG),
    ("release-delta-zero", lambda t: _release(t) + ["--epsilon", "1", "--delta", "0",
                                                    "--mechanism", "gaussian"], DELTA_MSG),
    ("release-unknown-attr", lambda t: _release(t, clique="a,z") + ["--epsilon", "1"],
     r"unknown attribute\(s\) \['z'\]"),
    ("release-missing-file", lambda t: _release(t, data="none.csv") + ["--epsilon", "1"],
     "does not exist"),
    ("release-nan", lambda t: _release(t, data="nan.csv") + ["--epsilon", "1"],
     r"column 'b' has 1 missing value\(s\)"),
    ("release-out-of-domain", lambda t: _release(t, data="oor.csv") + ["--epsilon", "1"],
     "column 'b' has code 5 .* outside its domain"),
    ("release-overspend", lambda t: _release(t) + ["--epsilon", "1", "--ledger",
                                                   str(t / "ledger.json"), "--budget", "0.5"],
     "privacy budget exceeded"),
    ("release-no-cliques", lambda t: ["release", str(t / "x.csv"), "--out", str(t / "m.json"),
                                      "--epsilon", "1"], "no cliques"),
    ("fit-missing-file", lambda t: ["fit", str(t / "none.json"), "--out", str(t / "f.json")],
     "does not exist"),
    ("fit-corrupt-file", lambda t: ["fit", str(t / "junk.json"), "--out", str(t / "f.json")],
     "corrupt or not a measurements file"),
    ("fit-method", lambda t: ["fit", str(t / "junk.json"), "--out", str(t / "f.json"),
                              "--method", "mcmc"], "unknown --method 'mcmc'"),
    ("fit-iters", lambda t: ["fit", str(t / "junk.json"), "--out", str(t / "f.json"),
                             "--iters", "0"], "--iters must be at least 1"),
    ("fit-total", lambda t: ["fit", str(t / "junk.json"), "--out", str(t / "f.json"),
                             "--total", "-5"], "--total must be positive"),
    ("synth-records", lambda t: ["synth", str(t / "junk.json"), "--out", str(t / "s.csv"),
                                 "--records", "0"], "--records must be a positive integer"),
    ("synth-corrupt-model", lambda t: ["synth", str(t / "junk.json"), "--out", str(t / "s.csv")],
     "corrupt or not a model file"),
    ("synth-suffix", lambda t: ["synth", str(t / "junk.json"), "--out", str(t / "s.txt")],
     "expected a file name ending in .csv"),
    ("synth-missing-model", lambda t: ["synth", str(t / "none.json"), "--out", str(t / "s.csv")],
     "does not exist"),
    # outputs: no silent overwrite, never an input, never a recorded release
    ("release-out-exists", lambda t: _out(t, "taken.json"),
     r"output .*taken.json exists; give --force"),
    ("release-out-is-data", lambda t: _out(t, "x.csv", "--force"),
     r"output .*x.csv is the input file .*even with --force"),
    ("release-out-is-domain", lambda t: _out(t, "dom.json", "--force"), "is the input file"),
    ("release-out-is-ledger", lambda t: _out(t, "l.json", "--ledger", str(t / "l.json"),
                                             "--budget", "2"), "is the input file"),
    ("release-out-recorded", lambda t: _out(t, "released.json", "--force"),
     r"records 1 release\(s\) \(last: laplace release of \(a\)\).*even with --force"),
    ("fit-out-exists", lambda t: ["fit", str(t / "released.json"), "--out", str(t / "taken.json")],
     "taken.json exists; give --force"),
    ("fit-out-is-input", lambda t: ["fit", str(t / "junk.json"), "--force", "--out",
                                    str(t / "junk.json")], "is the input file"),
    ("fit-out-recorded", lambda t: ["fit", str(t / "junk.json"), "--force", "--out",
                                    str(t / "released.json")], "refusing to overwrite"),
    ("synth-out-exists", lambda t: ["synth", str(t / "junk.json"), "--out",
                                    str(t / "taken.csv")], "taken.csv exists; give --force"),
    ("synth-out-is-input", lambda t: ["synth", str(t / "x.csv"), "--force", "--out",
                                      str(t / "x.csv")], "is the input file"),
    ("demo-out-exists", lambda t: ["demo", "--out", str(t / "demo")],
     "already holds summary.json; give --force"),
    ("demo-out-is-file", lambda t: ["demo", "--out", str(t / "x.csv")], "is a file"),
    # brackets in messages are printed, not read as markup
    ("release-domain-brackets", lambda t: ["release", str(t / "x.csv"), "--domain",
                                           str(t / "list-domain.json"), "--clique", "a",
                                           "--epsilon", "1", "--out", str(t / "m.json")],
     r'\{"attr": number of values or \[labels\], \.\.\.\}'),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_gives_a_one_line_error(cli_files: Any, argv: Callable, message: str) -> None:
    from typer.testing import CliRunner

    from numpyro_dpgm.cli import app

    result = CliRunner().invoke(app, argv(cli_files))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.strip().splitlines()
             if not line.startswith("progress: ")]  # stage lines (not a terminal)
    assert lines[0].startswith("error:")
    assert re.search(message, " ".join(lines)), result.output
    # nothing written: the files of the fixture are as they were
    assert (cli_files / "taken.json").read_text() == "keep me"
    assert (cli_files / "taken.csv").read_text() == "keep me"
    assert (cli_files / "demo" / "summary.json").read_text() == "keep me"
    assert not (cli_files / "m.json").exists() and not (cli_files / "l.json").exists()


# ------------------------------------------------------------------------------------------------
# no quiet wrong answers: observations, records by name, combining rules
# ------------------------------------------------------------------------------------------------
QUIET_NET = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])


def _em_model(y: Any, total: float, scale: float) -> None:
    import numpyro

    theta = numpyro.param("theta", jnp.zeros(QUIET_NET.num_params))
    n = numpyro.sample("n", CollectiveGraphicalModel(QUIET_NET, theta, total_count=total))
    numpyro.sample("y", LaplaceNoise(n, scale), obs=y)


def _em_run(y: Any) -> Any:
    from numpyro_dpgm.infer import EM

    return EM(_em_model, latent="n", max_iters=2).run(jax.random.key(0), y, 100.0, 1.0)


@pytest.mark.parametrize("bad, message", [
    (np.where(np.arange(12) == 3, np.nan, 8.0), r"1 NaN or infinite value\(s\), the first at "
                                                 r"index \(3,\)"),
    (np.where(np.arange(12) == 5, np.inf, 8.0), r"index \(5,\)"),
    (np.full(11, 8.0), r"shape \(11,\); its distribution has shape \(12,\)"),
], ids=["nan", "inf", "length"])
def test_em_refuses_observations_that_would_give_a_quiet_answer(bad: Any, message: str) -> None:
    # before: NaN gave the uniform model (θ = 0, converged=False) without an error
    with pytest.raises(ValueError, match=message):
        _em_run(jnp.asarray(bad))


@pytest.mark.parametrize("halvings", [-1, 2.5])
def test_em_refuses_a_negative_or_fractional_number_of_halvings(halvings: Any) -> None:
    from numpyro_dpgm.infer import EM

    with pytest.raises(ValueError, match=f"max_halvings must be a non-negative integer, got "
                                         f"{halvings}"):
        EM(_em_model, latent="n", max_halvings=halvings)


def test_em_accepts_a_pandas_series_as_the_observation() -> None:
    y = np.full(12, 8.0) + np.arange(12)
    from_series = _em_run(pd.Series(y))  # before: a JAX tracer error
    from_array = _em_run(jnp.asarray(y))
    np.testing.assert_allclose(np.asarray(from_series.params["theta"]),
                               np.asarray(from_array.params["theta"]), atol=1e-12)


def test_log_prob_reads_dataframe_columns_by_name() -> None:
    mrf = MarkovRandomField(QUIET_NET, jnp.asarray(np.random.default_rng(0).normal(size=12)))
    df = pd.DataFrame({"a": [0, 1], "b": [2, 0], "c": [1, 1]})
    want = mrf.log_prob(df[["a", "b", "c"]].to_numpy())
    # before: a DataFrame in another column order was read by position (−8.46 for −1.61)
    np.testing.assert_allclose(mrf.log_prob(df[["c", "b", "a"]]), want, atol=1e-12)
    np.testing.assert_allclose(mrf.log_prob(df.assign(extra=7)), want, atol=1e-12)
    with pytest.raises(ValueError, match=r"lack column\(s\) \['c'\]"):
        mrf.log_prob(df[["a", "b"]])


def test_rubin_warns_when_the_interval_is_meaningless() -> None:
    from numpyro_dpgm.combining import CombiningWarning, rubin

    # b barely above ū: ν ≈ 0.3 and a 95 % half-width of hundreds of standard errors
    with pytest.warns(CombiningWarning, match=r"ν < 2 degrees of freedom \(smallest 0.32\)"):
        fit = rubin([1.0, 1.5, 2.0], [0.2, 0.2, 0.2])
    assert fit.df == pytest.approx(0.32)
    # T_s ≤ 0: the substitute variance leaves out the synthesis uncertainty
    with pytest.warns(CombiningWarning, match=r"T_s ≤ 0 and use \(n_syn / n\)·ū"):
        rubin([1.0, 1.001, 0.999], [1.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CombiningWarning)
        rubin([1.0, 3.0, 5.0, 2.0], [0.01, 0.01, 0.01, 0.01])  # ν ≈ 2.9: no warning


def test_analyse_takes_the_size_ratio_from_the_data_sets() -> None:
    from numpyro_dpgm.combining import CombiningWarning, analyse

    frames = [pd.DataFrame({"x": np.arange(50) % 2}) for _ in range(3)]
    for frame in frames:
        frame.attrs["total_count"] = 100.0  # 50 synthetic records of a release of 100
    frames[1].loc[0, "x"] = 1
    with pytest.warns(CombiningWarning, match="T_s ≤ 0"):
        fit = analyse(frames, lambda d: (d["x"].mean(), 0.01))
    assert bool(fit.adjusted) and fit.variance == pytest.approx(0.5 * 0.01)  # before: 1 · ū
    with pytest.warns(CombiningWarning):
        given = analyse(frames, lambda d: (d["x"].mean(), 0.01), size_ratio=1.0)
    assert given.variance == pytest.approx(0.01)


def test_synthesize_marks_data_sets_with_the_release_size() -> None:
    from numpyro_dpgm import synthesize
    from numpyro_dpgm.combining import _size_ratio
    from numpyro_dpgm.infer.bayes import noisy_marginals_model, run_svi

    ms = [Measurement(("a", "b"), np.full(6, 10.0), Laplace(1.0)),
          Measurement(("b", "c"), np.full(6, 10.0), Laplace(1.0))]
    fit = run_svi(noisy_marginals_model(QUIET_NET, ms, 60), jax.random.key(0), num_steps=5,
                  num_samples=4)
    sets = synthesize(fit, 30, num_datasets=2, rng_key=0)  # 30 records of a release of N = 60
    assert [s.attrs["total_count"] for s in sets] == [60.0, 60.0]
    assert _size_ratio(sets) == pytest.approx(0.5)
    # a point estimate does not know N: nothing is claimed
    point = synthesize(MarkovRandomField(QUIET_NET, jnp.zeros(12)), 30, rng_key=0)
    assert "total_count" not in point.attrs


def test_a_fit_warns_about_cliques_with_more_cells_than_records() -> None:
    from numpyro_dpgm import Laplace, Measurement, naive_mle
    from numpyro_dpgm.privacy import SparseTableWarning

    domain = Domain({"a": 10, "b": 10, "c": 2})
    sparse = [Measurement(("a", "b"), np.full(100, 0.5), Laplace(1.0)),
              Measurement(("c",), np.array([25.0, 25.0]), Laplace(1.0))]
    with pytest.warns(SparseTableWarning, match=r"clique \('a', 'b'\) has 100 cells, 2× the 50"):
        naive_mle(sparse, domain)
    dense = [Measurement(("a", "b"), np.full(100, 5.0), Laplace(1.0))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparseTableWarning)
        naive_mle(dense, domain, total_count=500.0)  # 100 cells, 500 records: no warning


def test_exact_inference_refuses_a_tree_larger_than_the_machine(monkeypatch) -> None:
    from numpyro_dpgm.oracles import memory
    from numpyro_dpgm.oracles.triangulation import build_junction_tree

    net = MarkovNetwork({"a": 10, "b": 10, "c": 10}, [("a", "b"), ("b", "c")])
    tree = build_junction_tree(net)
    # 200 clique cells + separators of 10 cells (b) and 1 (the root's, empty), 4 float64 copies
    assert memory.oracle_bytes(tree) == 4 * 8 * 211
    monkeypatch.setattr(memory, "physical_memory", lambda: 6_000)
    with pytest.raises(memory.JunctionTreeTooLargeError,
                       match=r"200 cells .* needs about .* more than this machine's"):
        memory.check_memory(tree)
    monkeypatch.setattr(memory, "physical_memory", lambda: 7_000)
    memory.check_memory(tree)  # fits
