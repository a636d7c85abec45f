"""The command line's persistent compilation cache (``numpyro_dpgm.cli._compilation_cache``).

* Where it goes: ``DPGM_COMPILATION_CACHE`` (a folder, or ``off``), JAX's own
  ``JAX_COMPILATION_CACHE_DIR`` left as it is, every program cached.
* End to end, in fresh processes: ``dpgm fit`` writes its programs to the folder, and a second
  run that loads them writes the same model as the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED_DATA  # noqa: E402

from numpyro_dpgm.cli._compilation_cache import ENV, enable_compilation_cache


@pytest.mark.parametrize("off", ["off", "0", "False", " no "])
def test_off_sets_nothing(off):
    env = {ENV: off}
    assert enable_compilation_cache(env) is None
    assert env == {ENV: off}


def test_a_folder_sets_jax_s_variables(tmp_path):
    env = {ENV: str(tmp_path / "c")}
    assert enable_compilation_cache(env) == tmp_path / "c"
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "c")
    assert float(env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == 0.0
    assert set(env) == {ENV, "JAX_COMPILATION_CACHE_DIR",
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"}


def test_the_default_folder_is_the_user_cache_and_jax_s_own_wins(tmp_path):
    import platformdirs

    env: dict[str, str] = {}
    folder = enable_compilation_cache(env)
    assert folder == tmp_path.__class__(platformdirs.user_cache_dir("numpyro_dpgm")) / "jax"
    mine = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path)}
    assert enable_compilation_cache(mine) == tmp_path
    assert mine == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path)}


def _dpgm(*args, env):
    return subprocess.run([sys.executable, "-m", "numpyro_dpgm.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, check=True)


def test_a_second_fit_loads_the_programs_and_writes_the_same_model(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env[ENV] = str(tmp_path / "cache")
    meas = tmp_path / "m.json"
    _dpgm("release", SHARED_DATA / "titanic.csv", "--domain", SHARED_DATA / "titanic-domain.json",
          "--epsilon", "1", "--clique", "Sex,Survived", "--clique", "Pclass,Survived",
          "--seed", "0", "-o", meas, env=env)
    _dpgm("fit", meas, "--method", "naive", "-o", tmp_path / "a.json", env=env)
    written = list((tmp_path / "cache").iterdir())
    assert len(written) > 0
    _dpgm("fit", meas, "--method", "naive", "-o", tmp_path / "b.json", env=env)
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert len(a["theta"]["data"]) > 0
    np.testing.assert_array_equal(np.asarray(a["theta"]["data"]), np.asarray(b["theta"]["data"]))



def test_bench_leaves_the_cache_off(monkeypatch):
    """The commands that time compilation run without the cache; the others with it."""
    from typer.testing import CliRunner

    from numpyro_dpgm import cli

    calls = []
    monkeypatch.setattr(cli, "enable_compilation_cache", lambda: calls.append(True))
    runner = CliRunner()
    for command in ("bench", "fit", "release"):
        calls.clear()
        result = runner.invoke(cli.app, [command, "--help"])
        assert result.exit_code == 0, result.output
        assert bool(calls) == (command not in cli.MEASURING), command
