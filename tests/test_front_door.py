"""The package namespace is the front door: ``import numpyro_dpgm as dpgm`` gives the names a
user needs, ``__all__`` lists them (sorted, each one resolving), and importing the package sets
no global JAX flag."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import numpyro_dpgm as dpgm

#: The front door: the workflow's names, at most 40 (the rest live in the subpackages).
PROMISED = {
    # core types, noise specs and data
    "Domain", "MarkovNetwork", "Measurement", "Laplace", "Gaussian", "DiscreteLaplace",
    "DiscreteGaussian", "MarkovRandomField", "Dataset", "CliqueTables", "load_demo", "count",
    "encode", "decode", "read_domain",
    # releases and accounting
    "release", "simulate_release", "PureDP", "ZCDP", "ApproxDP", "PrivacyLedger",
    "BudgetExceededError",
    # every registered estimator from measurements
    "naive_mle", "cgm_em", "prox_pgm", "mcem", "variational_em", "posterior_mean", "Result",
    # mechanisms
    "mst", "aim",
    # outputs
    "synthesize", "rubin", "save_model", "load_model", "save_measurements", "load_measurements",
}

SUBPACKAGES = ("distributions", "infer", "oracles", "estimation", "learners", "mechanisms",
               "privacy", "io", "metrics")


def test_all_is_sorted_and_without_duplicates() -> None:
    assert list(dpgm.__all__) == sorted(set(dpgm.__all__))


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in dpgm.__all__ if not hasattr(dpgm, name)]
    assert not missing, f"__all__ names that do not resolve: {missing}"
    assert set(dpgm.__all__) <= set(dir(dpgm))


def test_the_front_door_is_the_workflow() -> None:
    assert set(dpgm.__all__) == PROMISED and len(PROMISED) <= 40


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_subpackages_are_attributes(name: str) -> None:
    module = getattr(dpgm, name)
    assert isinstance(module, types.ModuleType)
    assert module.__name__ == f"numpyro_dpgm.{name}"
    assert name in dir(dpgm) and name not in dpgm.__all__


def test_reexports_are_the_defining_objects() -> None:
    """The front door re-exports, it does not wrap: each name is its module's own object."""
    assert dpgm.naive_mle is dpgm.estimation.naive_mle
    assert dpgm.release is dpgm.privacy.release
    assert dpgm.PrivacyLedger is dpgm.privacy.PrivacyLedger
    assert dpgm.MarkovRandomField is dpgm.distributions.MarkovRandomField
    assert dpgm.estimation.estimate_total is dpgm.privacy.estimate_total
    assert dpgm.Result is dpgm.estimation.Result


def test_every_registered_estimator_is_at_the_front_door_and_the_command_line() -> None:
    """Adding an estimator is its module and its registry entry: the front door and ``dpgm fit
    --method`` must then offer it (each under the name it is registered or defined with)."""
    from numpyro_dpgm.cli._fit import ESTIMATOR_NAMES
    from numpyro_dpgm.estimation import ESTIMATORS

    for name, fn in ESTIMATORS.items():
        assert getattr(dpgm, fn.__name__) is fn, name
        assert fn.__name__ in dpgm.__all__, name
    assert set(ESTIMATOR_NAMES) == set(ESTIMATORS)


def test_a_name_off_the_front_door_says_where_it_lives() -> None:
    import importlib

    for name, where in dpgm._ELSEWHERE.items():
        assert name not in dpgm.__all__
        assert hasattr(importlib.import_module(f"numpyro_dpgm.{where}"), name), name
    with pytest.raises(AttributeError, match=r"lives in numpyro_dpgm\.learners \(from "):
        dpgm.learn_ising  # noqa: B018


def test_star_import_gives_all() -> None:
    namespace: dict = {}
    exec("from numpyro_dpgm import *", namespace)
    assert set(dpgm.__all__) <= set(namespace)


def test_import_does_not_flip_x64() -> None:
    """In a fresh interpreter (this one runs with float64 on, see ``conftest``)."""
    code = ("import jax\n"
            "before = bool(jax.config.jax_enable_x64)\n"
            "import numpyro_dpgm\n"
            "import numpyro_dpgm.estimation, numpyro_dpgm.privacy, numpyro_dpgm.infer\n"
            "print(before, bool(jax.config.jax_enable_x64))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env())
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def _env() -> dict:
    """The current environment, with the package under test first on the path and the JAX
    float64 switch left to its default."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64",)}
    root = str(Path(dpgm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env
