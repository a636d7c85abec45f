"""Run one of mbi's mechanisms (MST or AIM) once; a helper of ``benchmarks/mechanisms.py``.

Runs under a Python environment that has mbi installed (not numpyro_dpgm's): the benchmark
starts it as a subprocess,

    python _mbi_mechanisms.py MECHANISMS_DIR DATA.csv DOMAIN.json mst|aim EPS DELTA SEED OUT.json

with ``MECHANISMS_DIR`` the ``mechanisms/`` folder of the private-pgm repository (it holds
``mst.py``, ``aim.py``, ``mechanism.py`` and ``cdp2adp.py``). The workload is all 3-way
marginals with at most 10,000 cells (the default of mbi's scripts); the error is the mean of
``½‖p̂ − p‖₁`` over it, from the synthetic data, as mbi's scripts print it. Writes
``{"error", "seconds", "rounds"}`` to ``OUT.json``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import sys
import time

import numpy as np


def main(argv: list[str]) -> int:
    mech_dir, data_path, domain_path, name, eps, delta, seed, out = argv
    sys.path.insert(0, mech_dir)
    from mbi import Dataset  # noqa: PLC0415 - available in mbi's environment only

    data = Dataset.load(data_path, domain_path)
    workload = [c for c in itertools.combinations(data.domain.attrs, 3)
                if data.domain.size(c) <= 10_000]
    np.random.seed(int(seed))  # noqa: NPY002 - mbi draws from the global generator
    start = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        if name == "mst":
            from mst import MST  # noqa: PLC0415

            synth = MST(data, float(eps), float(delta))
        else:
            from aim import AIM  # noqa: PLC0415

            mech = AIM(float(eps), float(delta))
            _, synth = mech.run(data, [(c, 1.0) for c in workload])
    seconds = time.perf_counter() - start
    errors = []
    for c in workload:
        x = data.project(c).datavector()
        y = synth.project(c).datavector()
        errors.append(0.5 * np.abs(x / x.sum() - y / y.sum()).sum())
    rounds = log.getvalue().count("Measuring Clique")
    with open(out, "w") as f:
        json.dump({"error": float(np.mean(errors)), "seconds": seconds, "rounds": rounds}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
