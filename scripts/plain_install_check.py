"""Check an installed wheel of numpyro_dpgm with no extras (run by ``bash scripts/dev.sh plain``).

Run from outside the source tree, with the interpreter of a fresh virtual environment that holds
the wheel and its runtime dependencies only. It fails (non-zero exit, the reason on stderr) if

1. the package is imported from anywhere but that environment's site-packages, or a
   development-only package (pytest, mbi, pyspark, statsmodels, mkdocs) is present;
2. any module of the package fails to import;
3. a tiny fit (a 3-attribute chain released with OpenDP's Laplace sampler, fitted by
   Prox-PGM) misses the true marginals by more than the noise allows;
4. the command line, from a CSV to synthetic data (``dpgm release`` → ``fit`` → ``synth``),
   fails or writes a CSV without the original columns and categories.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

DEV_ONLY = ("pytest", "mbi", "pyspark", "statsmodels", "mkdocs", "hypothesis", "nbclient")


def check_environment() -> None:
    import numpyro_dpgm

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(numpyro_dpgm.__file__).resolve()
    if site not in where.parents:
        sys.exit(f"numpyro_dpgm was imported from {where}, not from the wheel in {site}")
    present = [name for name in DEV_ONLY if importlib.util.find_spec(name) is not None]
    if present:
        sys.exit(f"not a plain install: development packages present: {present}")


def import_every_module() -> int:
    import numpyro_dpgm

    names = [numpyro_dpgm.__name__] + [
        info.name for info in pkgutil.walk_packages(numpyro_dpgm.__path__, "numpyro_dpgm.")
    ]
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # report every failure, not only the first
            failed.append(f"{name}: {type(err).__name__}: {err}")
    if failed:
        sys.exit("modules that do not import with the runtime dependencies alone:\n  "
                 + "\n  ".join(failed))
    return len(names)


def tiny_fit() -> float:
    import numpy as np
    import numpyro
    import pandas as pd

    from numpyro_dpgm import MarkovNetwork, count
    from numpyro_dpgm.estimation import prox_pgm
    from numpyro_dpgm.privacy import release

    numpyro.enable_x64()
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 5000)
    b = (a + (rng.random(5000) < 0.2)) % 3
    c = (b + rng.integers(0, 2, 5000)) % 2
    records = pd.DataFrame({"a": a, "b": b, "c": c})
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    tables = count(records, net.cliques, net.domain)
    measurements = release(records, net, 1.0, domain=net.domain)  # OpenDP's sampler
    fit = prox_pgm(measurements, net, total_count=5000.0)
    err = max(float(np.abs(np.asarray(fit.model.marginal(cl)) * 5000.0
                           - np.asarray(tables[cl])).sum()) for cl in net.cliques)
    if not err < 100.0:  # Laplace b = 2·#cliques/ε = 4 per cell: L1 ≈ 6·4 per table
        sys.exit(f"tiny fit: L1 error {err:.1f} counts on a 5,000-record table")
    return err


def command_line(work: Path) -> int:
    import pandas as pd

    dpgm = Path(sys.executable).with_name("dpgm")
    rows = [("low", "no", "x"), ("high", "yes", "y"), ("low", "yes", "x"), ("mid", "no", "y")]
    pd.DataFrame(rows * 50, columns=["income", "owner", "region"]).to_csv(
        work / "people.csv", index=False)
    (work / "domain.json").write_text(
        '{"income": ["low", "mid", "high"], "owner": ["no", "yes"], "region": ["x", "y"]}')
    steps = [
        [dpgm, "release", work / "people.csv", "--domain", work / "domain.json",
         "--clique", "income,owner", "--clique", "owner,region", "--epsilon", "1",
         "--seed", "0", "-o", work / "meas.json"],
        [dpgm, "fit", work / "meas.json", "--method", "prox-pgm", "-o", work / "model.json"],
        [dpgm, "synth", work / "model.json", "--records", "300", "--seed", "0",
         "-o", work / "synth.csv"],
    ]
    for step in steps:
        done = subprocess.run([str(s) for s in step], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"`{' '.join(str(s) for s in step[1:2])}` failed ({done.returncode}):\n"
                     f"{done.stdout}\n{done.stderr}")
    synth = pd.read_csv(work / "synth.csv")
    if list(synth.columns) != ["income", "owner", "region"] or len(synth) != 300:
        sys.exit(f"synthetic CSV has columns {list(synth.columns)} and {len(synth)} rows")
    if not set(synth["income"]) <= {"low", "mid", "high"}:
        sys.exit(f"synthetic CSV has categories {sorted(set(synth['income']))}")
    return len(synth)


def main() -> None:
    check_environment()
    modules = import_every_module()
    err = tiny_fit()
    with tempfile.TemporaryDirectory() as tmp:
        rows = command_line(Path(tmp))
    print(f"plain install ok: Python {sys.version.split()[0]}, {modules} modules imported, "
          f"tiny fit L1 {err:.1f} counts, dpgm release → fit → synth wrote {rows} rows")


if __name__ == "__main__":
    main()
