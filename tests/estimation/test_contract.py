"""Every registered estimator from measurements keeps one contract.

``f(measurements, network_or_domain, *, total_count=None, rng_key=None, init=None,
max_iters=..., callback=None, **options) -> Result`` (:mod:`numpyro_dpgm.estimation.contract`),
checked on a tiny chain ``a - b - c`` with small iteration counts.
"""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.domain import Domain
from numpyro_dpgm.estimation import ESTIMATORS, Result
from numpyro_dpgm.estimation.losses import measurement_nll
from numpyro_dpgm.measurements import Laplace, Measurement
from numpyro_dpgm.network import MarkovNetwork

DOMAIN = Domain({"a": 2, "b": 3, "c": 2})
NET = MarkovNetwork(DOMAIN, [("a", "b"), ("b", "c")])
N = 150.0
KEY = jax.random.key(0)
NAMES = ["naive", "cgm-em", "prox-pgm", "mcem", "variational-em", "posterior-mean"]
STOCHASTIC = {"mcem", "variational-em", "posterior-mean"}

#: Small settings per estimator (the main loop's length and the inner work).
OPTIONS = {
    "naive": dict(max_iters=50),
    "cgm-em": dict(max_iters=3),
    "prox-pgm": dict(max_iters=50, stop="optimum"),
    "mcem": dict(max_iters=2, num_warmup=20, first_draws=10, last_draws=20, chunk=10,
                 max_tree_depth=4),
    "variational-em": dict(max_iters=2, first_steps=40, steps=20, mean_draws=16),
    "posterior-mean": dict(max_iters=40, svi_draws=16),
}

def _measurements() -> list[Measurement]:
    rng = np.random.default_rng(0)
    ab = np.array([30.0, 20.0, 10.0, 15.0, 25.0, 50.0])
    bc = np.array([20.0, 25.0, 30.0, 15.0, 40.0, 20.0])
    return [Measurement(("a", "b"), ab + rng.normal(0, 2, 6), Laplace(2.0)),
            Measurement(("b", "c"), bc + rng.normal(0, 2, 6), Laplace(2.0))]


MS = _measurements()


def _fit(name: str, ms=MS, network=NET, **kwargs):
    options = dict(OPTIONS[name], **kwargs)
    if name in STOCHASTIC:
        options.setdefault("rng_key", KEY)
    return ESTIMATORS[name](ms, network, **options)


@pytest.fixture(scope="module")
def base_fits() -> dict[str, Result]:
    return {name: _fit(name, total_count=N) for name in NAMES}


def test_registry_names() -> None:
    assert sorted(ESTIMATORS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_signature(name: str) -> None:
    params = list(inspect.signature(ESTIMATORS[name]).parameters.values())
    head = [(p.name, p.kind) for p in params[:7]]
    assert head == [
        ("measurements", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("network_or_domain", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("total_count", inspect.Parameter.KEYWORD_ONLY),
        ("rng_key", inspect.Parameter.KEYWORD_ONLY),
        ("init", inspect.Parameter.KEYWORD_ONLY),
        ("max_iters", inspect.Parameter.KEYWORD_ONLY),
        ("callback", inspect.Parameter.KEYWORD_ONLY),
    ]
    for p in params[:2]:
        assert p.default is inspect.Parameter.empty
    for p in params[2:]:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
    for p in (params[2], params[3], params[4], params[6]):
        assert p.default is None, p.name
    default = params[5].default  # a count, None, or a rule that chooses it from the release
    assert default is None or default == "risk" or default >= 1
    doc = inspect.getdoc(ESTIMATORS[name])
    for p in params[1:7]:
        assert p.name in doc, f"{name} does not document {p.name}"


@pytest.mark.parametrize("name", NAMES)
def test_result(name: str, base_fits: dict[str, Result]) -> None:
    calls = []
    fit = _fit(name, total_count=N, callback=lambda i, loss: calls.append((i, loss)))
    assert isinstance(fit, Result) and isinstance(fit.model, MarkovRandomField)
    assert fit.model.network == NET and fit.params == {"theta": fit.model.theta}
    trace = np.asarray(fit.loss_trace)
    assert trace.shape == (fit.iterations + 1,) and np.all(np.isfinite(trace))
    assert 1 <= fit.iterations <= OPTIONS[name]["max_iters"]
    assert fit.extras["total_count"] == N and fit.extras["total_count_estimated"] is False
    assert calls, "the callback was never called"
    assert all(isinstance(i, int) and np.isfinite(loss) for i, loss in calls)
    assert calls[-1][0] == fit.iterations
    np.testing.assert_allclose(calls[-1][1], trace[-1], rtol=1e-12)
    # the same call again gives the same fit (stochastic ones: the same key)
    np.testing.assert_allclose(np.asarray(fit.model.theta),
                               np.asarray(base_fits[name].model.theta), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_total_count_estimated(name: str) -> None:
    fit = _fit(name)
    assert fit.extras["total_count_estimated"] is True
    assert 100 < fit.extras["total_count"] < 200  # the tables sum to about 150


@pytest.mark.parametrize("name", NAMES)
def test_domain_input(name: str, base_fits: dict[str, Result]) -> None:
    fit = _fit(name, network=DOMAIN, total_count=N)
    assert fit.model.network == NET  # the maximal measured cliques
    np.testing.assert_allclose(np.asarray(fit.model.theta),
                               np.asarray(base_fits[name].model.theta), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_inputs_resolved_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # cgm-em's default stopping rule fits naive starts to perturbed releases: they reuse the
    # release resolved on entry, so N is estimated, the network built and the sparse cliques
    # warned about once per call, not once per inner fit
    from numpyro_dpgm import _warnings
    from numpyro_dpgm.estimation import contract

    calls = {"estimate_total": 0, "network_from_measurements": 0}

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls[fn.__name__] += 1
            return fn(*args, **kwargs)
        return wrapper

    for fn in (contract.estimate_total, contract.network_from_measurements):
        monkeypatch.setattr(contract, fn.__name__, counted(fn))
    tiny = [Measurement(m.clique, m.values / 30.0, Laplace(0.1)) for m in MS]  # N ~ 5 < 6 cells
    options = {"max_iters": "risk"} if name == "cgm-em" else {}
    with pytest.warns(_warnings.SparseTableWarning) as record:
        _fit(name, ms=tiny, network=DOMAIN, **options)
    sparse = [w for w in record if issubclass(w.category, _warnings.SparseTableWarning)]
    assert len(sparse) == len(NET.cliques)
    assert calls["estimate_total"] == 1
    # prox-pgm builds its own network from the measured cliques (possibly not decomposable)
    assert calls["network_from_measurements"] == (name != "prox-pgm")


@pytest.mark.parametrize("name", NAMES)
def test_bad_input(name: str) -> None:
    with pytest.raises(ValueError, match="at least one measurement"):
        _fit(name, ms=[], total_count=N)
    outside = [*MS, Measurement(("c", "z"), np.ones(4), Laplace(1.0))]
    with pytest.raises(ValueError, match="unknown attribute"):
        _fit(name, ms=outside, total_count=N)
    with pytest.raises(ValueError, match="max_iters must be a positive integer"):
        _fit(name, total_count=N, max_iters=0)
    for bad in (0.0, -10.0):
        with pytest.raises(ValueError, match="total_count must be a positive"):
            _fit(name, total_count=bad)
    with pytest.raises(TypeError, match="network_or_domain"):
        _fit(name, network=["a", "b", "c"], total_count=N)


@pytest.mark.parametrize("name", ["naive", "cgm-em", "prox-pgm"])
def test_warm_start_from_a_converged_fit_is_faster(name: str) -> None:
    long = {"naive": 500, "cgm-em": 300, "prox-pgm": 5000}[name]
    tol = {"naive": 1e-8, "cgm-em": 1e-6, "prox-pgm": 1e-10}[name]
    # CGM-EM's default start, the naive fit, is already at EM's fixed point on these nearly
    # consistent tables (one confirming E-step): start it from the uniform model instead
    cold = {"cgm-em": {"init": "zeros"}}.get(name, {})
    first = _fit(name, total_count=N, max_iters=long, tol=tol, **cold)
    assert first.converged, name
    warm = _fit(name, total_count=N, max_iters=long, tol=tol, init=first.model)
    assert warm.converged and warm.iterations < first.iterations, (warm.iterations,
                                                                    first.iterations)
    assert warm.extras.get("init", "given") == "given"
    np.testing.assert_allclose(np.asarray(warm.loss_trace)[0], np.asarray(first.loss_trace)[-1],
                               rtol=1e-6)
    # θ works as well as the model
    again = _fit(name, total_count=N, max_iters=long, tol=tol, init=first.model.theta)
    assert again.iterations == warm.iterations


@pytest.mark.parametrize("name", ["mcem", "variational-em"])
def test_warm_start_is_used_by_the_stochastic_em(name: str, base_fits: dict[str, Result]) -> None:
    previous = base_fits[name]
    warm = _fit(name, total_count=N, init=previous.model)
    assert warm.extras["init"] == "given"
    nll = measurement_nll(NET, MS, N)
    # the trace starts at the previous fit's model, not at the naive start
    assert np.asarray(warm.loss_trace)[0] == pytest.approx(nll(previous.model.theta), rel=1e-9)
    assert np.asarray(warm.loss_trace)[0] == pytest.approx(np.asarray(previous.loss_trace)[-1],
                                                           rel=1e-9)


def test_warm_start_of_posterior_mean() -> None:
    settings = dict(method="nuts", num_warmup=20, max_iters=20, total_count=N)
    start = _fit("naive", total_count=N).model
    uniform = _fit("posterior-mean", **settings)
    warm = _fit("posterior-mean", init=start, **settings)
    assert warm.extras["init"] == "given" and uniform.extras["init"] == "uniform"
    assert not np.allclose(np.asarray(warm.model.theta), np.asarray(uniform.model.theta))
    with pytest.raises(ValueError, match="method='nuts'"):
        _fit("posterior-mean", total_count=N, init=start)  # the SVI guide has one start


@pytest.mark.parametrize("name", NAMES)
def test_one_spelling(name: str) -> None:
    """Everything after the network is a keyword: ``total_count`` by position is a TypeError,
    and so is a keyword outside the contract and the estimator's own settings."""
    with pytest.raises(TypeError, match="positional"):
        ESTIMATORS[name](MS, NET, N)
    with pytest.raises(TypeError, match="key"):
        ESTIMATORS[name](MS, NET, total_count=N, key=KEY)


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_stochastic_estimators_want_a_key(name: str) -> None:
    with pytest.raises(TypeError, match=r"is stochastic: pass rng_key=jax\.random\.key"):
        ESTIMATORS[name](MS, NET, total_count=N, **OPTIONS[name])


@pytest.mark.parametrize("name", sorted(set(NAMES) - STOCHASTIC))
def test_deterministic_estimators_ignore_the_key(name: str, base_fits: dict[str, Result]) -> None:
    fit = _fit(name, total_count=N, rng_key=jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(fit.model.theta),
                                  np.asarray(base_fits[name].model.theta))


# ------------------------------------------------------------------------------------------------
# learners from records: f(data, domain, *, budget, rng_key, ledger=None, **options)
# ------------------------------------------------------------------------------------------------
LEARNERS = {"learn_ising": dict(width=1.0, iterations=20),
            "learn_pairwise": dict(width=1.0, iterations=20),
            "learn_twise": dict(order=2, width=1.0, iterations=20)}


def _learner(name: str):
    from numpyro_dpgm.learners import private_mrf

    return getattr(private_mrf, name)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_learner_signature(name: str) -> None:
    params = list(inspect.signature(_learner(name)).parameters.values())
    assert [(p.name, p.kind) for p in params[:5]] == [
        ("data", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("domain", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("budget", inspect.Parameter.KEYWORD_ONLY),
        ("rng_key", inspect.Parameter.KEYWORD_ONLY),
        ("ledger", inspect.Parameter.KEYWORD_ONLY),
    ]
    assert params[2].default is inspect.Parameter.empty and params[4].default is None
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:])


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_learner_takes_the_domain_second_and_the_rest_by_keyword(name: str) -> None:
    codes = np.random.default_rng(0).integers(0, 2, size=(200, 3))
    data = codes if name == "learn_pairwise" else 1 - 2 * codes
    f, options = _learner(name), dict(LEARNERS[name])
    if name == "learn_pairwise":
        options["domain"] = 2  # it needs the alphabet: 2 values per attribute
    new = f(data, budget=1.0, rng_key=KEY, **options)
    with pytest.raises(TypeError, match="budget"):
        f(data, rng_key=KEY, **options)  # the budget is required, by keyword
    with pytest.raises(TypeError, match="key"):
        f(data, budget=1.0, key=KEY, **options)
    # the domain in second place names the attributes
    domain = Domain({f"v{i}": 2 for i in range(3)})
    options.pop("domain", None)
    named = f(data, domain if name == "learn_pairwise" else list(domain.attrs), budget=1.0,
              rng_key=KEY, **options)
    assert tuple(named.model.network.domain.attrs) == ("v0", "v1", "v2")
    np.testing.assert_array_equal(np.asarray(named.model.theta), np.asarray(new.model.theta))


@pytest.mark.parametrize(("name", "second"), [("learn_structure", "domain"),
                                              ("psgd", "network")])
def test_other_learners_share_the_contract(name: str, second: str) -> None:
    """The structure learner takes a domain in second place; DP-SGD learns the parameters of a
    given structure, so it takes the network there. The rest is the learners' contract."""
    import numpyro_dpgm.learners as learners

    params = list(inspect.signature(getattr(learners, name)).parameters.values())
    assert [p.name for p in params[:5]] == ["data", second, "budget", "rng_key", "ledger"]
    assert params[2].default is inspect.Parameter.empty and params[4].default is None
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:])


def test_mwem_pgm_shares_the_learners_contract() -> None:
    from numpyro_dpgm.mechanisms import mwem_pgm
    from numpyro_dpgm.privacy import ZCDP

    params = list(inspect.signature(mwem_pgm).parameters.values())
    assert [p.name for p in params[:5]] == ["data", "domain", "budget", "rng_key", "ledger"]
    records = np.random.default_rng(1).integers(0, 2, size=(300, 3))
    domain = Domain({"a": 2, "b": 2, "c": 2})
    with pytest.raises(TypeError, match="positional"):
        mwem_pgm(records, domain, [("a", "b")], ZCDP(0.5), 1, rng_key=3, iters=10)


def test_measurement_nll_compiles_once_per_structure() -> None:
    """A new release of the same structure reuses the program; its value is the loss."""
    from numpyro_dpgm.estimation import losses

    theta = np.zeros(NET.num_params)
    measurement_nll(NET, MS, N)(theta)
    size = losses._nll._cache_size()
    shifted = [Measurement(m.clique, np.asarray(m.values) + 1.0, m.noise) for m in MS]
    value = measurement_nll(NET, shifted, 2 * N)(theta)
    assert losses._nll._cache_size() == size
    # θ = 0 is the uniform model: every cell of a measured table expects 2N/cells records
    terms, data = losses.build_terms(NET, shifted, "auto")
    expected = sum(
        (float(np.sum(np.abs(r)) * float(d.weight)) if t.kind == "l1"
         else 0.5 * float(d.weight) * float(np.sum(r ** 2)))
        for t, d in zip(terms, data, strict=True)
        for r in [np.full(np.size(d.values), 2 * N / NET.domain.size(t.clique))
                  - np.asarray(d.values)])
    assert value == pytest.approx(expected, rel=1e-12)


def test_a_refit_with_another_iteration_count_lowers_no_program(keep_programs) -> None:
    """The fits' traces are cut to their length on the host: a refit of a known structure
    whose iteration count differs lowers no new XLA program (a slice of a device array would
    be one program per length)."""
    from numpyro_dpgm.estimation import cgm_em, naive_mle

    lowered: list[str] = []

    def count(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        first = [naive_mle(MS, NET, total_count=N), cgm_em(MS, NET, total_count=N, max_iters=3)]
        shifted = [Measurement(m.clique, np.asarray(m.values)[::-1] * 1.5, m.noise) for m in MS]
        lowered.clear()
        second = [naive_mle(shifted, NET, total_count=N),
                  cgm_em(shifted, NET, total_count=N, max_iters=2)]
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert [f.iterations for f in first] != [f.iterations for f in second]
    assert lowered == []
