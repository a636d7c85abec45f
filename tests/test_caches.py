"""Module-level registries of models and compiled engines are bounded LRU caches: filling one
beyond its bound evicts the least recently used entry, and a fit after an eviction (its model
and engine rebuilt) equals the fit from a fresh cache."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm._cache import LRUCache
from numpyro_dpgm.measurements import Laplace, Measurement

# the modules (the packages re-export functions of the same names)
posterior_mean_module = importlib.import_module("numpyro_dpgm.estimation.posterior_mean")
variational_em_module = importlib.import_module("numpyro_dpgm.estimation.variational_em")
em_module = importlib.import_module("numpyro_dpgm.infer.em")
estep_module = importlib.import_module("numpyro_dpgm.infer.estep")

NET = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
TABLE = np.array([8.0, 5.0, 4.0, 3.0])


def release(scale: float, table: np.ndarray = TABLE) -> list[Measurement]:
    return [Measurement(("a", "b"), table, Laplace(scale))]


# ------------------------------------------------------------------------------------------------
# the helper
# ------------------------------------------------------------------------------------------------
def test_lru_cache_keeps_its_bound_and_evicts_the_least_recently_used() -> None:
    cache = LRUCache(maxsize=3)
    for i in range(10):
        cache[i] = str(i)
        assert len(cache) == min(i + 1, 3)
    assert list(cache) == [7, 8, 9]
    assert cache.get(7) == "7"  # 7 is now the most recently used
    cache[10] = "10"
    assert list(cache) == [9, 7, 10]
    assert cache.setdefault(9, "other") == "9"  # a hit: 9 is now the most recently used
    assert cache.setdefault(11, "11") == "11"
    assert list(cache) == [10, 9, 11] and len(cache) == 3
    assert cache.get(7) is None and 7 not in cache
    with pytest.raises(KeyError):
        cache[7]
    with pytest.raises(TypeError):  # like a dict: the callers rely on it to skip caching
        cache.get([1, 2])
    cache.clear()
    assert len(cache) == 0


@pytest.mark.parametrize("maxsize", [0, -1, 2.5])
def test_lru_cache_rejects_a_bad_bound(maxsize) -> None:
    with pytest.raises(ValueError):
        LRUCache(maxsize)


@pytest.mark.parametrize(("module", "name"), [
    (estep_module, "_ENGINES"), (em_module, "_M_STEPS"),
    (variational_em_module, "_MODELS"), (posterior_mean_module, "_MODELS"),
])
def test_module_level_registries_are_bounded(module, name) -> None:
    cache = getattr(module, name)
    assert isinstance(cache, LRUCache) and 1 <= cache.maxsize <= 64


# ------------------------------------------------------------------------------------------------
# the registries in use
# ------------------------------------------------------------------------------------------------
def test_estep_engines_evict_beyond_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(estep_module, "_ENGINES", LRUCache(2))
    models = [variational_em_module.latent_counts_model(NET, release(s), 20)
              for s in (1.0, 2.0)]
    options = {"num_warmup": 10, "first_draws": 4, "last_draws": 8}
    engines = [estep_module.estep_engine("mcmc", m, "n", options) for m in models]
    assert estep_module.estep_engine("mcmc", models[0], "n", options) is engines[0]  # a hit
    for k in (5, 6, 7):  # other options: new engines, the oldest ones evicted
        estep_module.estep_engine("mcmc", models[0], "n", {**options, "chunk": k})
        assert len(estep_module._ENGINES) == 2
    rebuilt = estep_module.estep_engine("mcmc", models[0], "n", options)
    assert rebuilt is not engines[0] and len(estep_module._ENGINES) == 2


def test_posterior_mean_models_evict_and_rebuild_the_same_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(posterior_mean_module, "_MODELS", LRUCache(2))
    first, y = posterior_mean_module._bayes_model(NET, release(1.0), 20, 3.0)
    for scale in (2.0, 3.0, 4.0):  # each release's scales key a model of its own
        posterior_mean_module._bayes_model(NET, release(scale), 20, 3.0)
        assert len(posterior_mean_module._MODELS) == 2
    again, y_again = posterior_mean_module._bayes_model(NET, release(1.0), 20, 3.0)
    assert again is not first  # evicted, then rebuilt
    params = {"phi": jnp.array([0.3, -0.2, 0.5]), "n": jnp.array([7.0, 6.0, 4.0, 3.0])}
    expected, _ = log_density(first, (), {"y": y}, params)
    got, _ = log_density(again, (), {"y": y_again}, params)
    assert float(got) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.filterwarnings(
    "ignore::numpyro_dpgm.distributions.relaxation.RelaxationWarning")  # tiny N, on purpose
def test_variational_em_after_eviction_equals_a_fresh_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one model and one engine, fitting another release structure evicts the
    first; refitting the first (model and engine rebuilt) gives the fit of a fresh cache."""
    monkeypatch.setattr(variational_em_module, "_MODELS", LRUCache(1))
    monkeypatch.setattr(estep_module, "_ENGINES", LRUCache(1))
    opts = dict(max_iters=2, init="zeros", first_steps=50, steps=50, mean_draws=16,
                rng_key=jax.random.key(3))
    fresh = variational_em_module.variational_em(release(1.0), NET, total_count=20, **opts)
    other_net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    other = [Measurement(("a", "b"), np.arange(1.0, 7.0), Laplace(1.0))]
    variational_em_module.variational_em(other, other_net, total_count=21, **opts)
    assert len(variational_em_module._MODELS) == 1 and len(estep_module._ENGINES) == 1
    refit = variational_em_module.variational_em(release(1.0), NET, total_count=20, **opts)
    np.testing.assert_allclose(np.asarray(refit.model.theta), np.asarray(fresh.model.theta),
                               atol=1e-8)


# ------------------------------------------------------------------------------------------------
# compiled programs (numpyro_dpgm._jit): a bound on those held, all wrappers together
# ------------------------------------------------------------------------------------------------
def test_jit_wrappers_hold_at_most_max_programs_and_recompile_correctly(monkeypatch) -> None:
    from numpyro_dpgm import _jit

    monkeypatch.setattr(_jit, "MAX_PROGRAMS", 3)
    _jit.clear_programs()
    scale = _jit.jit_modes(lambda x, k: x * k, static_argnums=(1,))
    shift = _jit.jit_modes(lambda x: x + 1.0)
    for n in range(1, 8):  # a new static value and a new shape every call
        np.testing.assert_array_equal(scale(jnp.ones(n), n), np.full(n, float(n)))
        np.testing.assert_array_equal(shift(jnp.zeros(n), compile_mode="quick"), np.ones(n))
        held = scale._cache_size() + shift._cache_size()
        assert held == _jit.programs_held() <= 3
    # a call already held compiles nothing and counts nothing new
    before = (_jit.programs_held(), shift._cache_size())
    shift(jnp.zeros(7), compile_mode="quick")
    assert (_jit.programs_held(), shift._cache_size()) == before


def test_a_mechanism_after_its_programs_were_dropped_gives_the_same_fit(monkeypatch) -> None:
    from numpyro_dpgm import ZCDP, _jit, mst

    rng = np.random.default_rng(5)
    domain = {"a": 3, "b": 4, "c": 2, "d": 3}
    records = np.stack([rng.integers(0, k, 400) for k in domain.values()], axis=1)
    records[:, 1] = (records[:, 0] + rng.integers(0, 2, 400)) % 4  # a ~ b

    def run() -> np.ndarray:
        return np.asarray(mst(records, domain, budget=ZCDP(2.0), rng_key=3, sampler="jax",
                              iters=200, compress=False).model.theta)

    fresh = run()
    monkeypatch.setattr(_jit, "MAX_PROGRAMS", 2)  # every fit now drops the others' programs
    again = run()
    assert _jit.programs_held() <= 2
    assert sum(w._cache_size() for w in _jit._WRAPPERS) <= 2
    np.testing.assert_allclose(again, fresh, rtol=0, atol=1e-12)
