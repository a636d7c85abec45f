"""The command line's start-up with and without JAX's persistent compilation cache.

Every ``dpgm`` command is a fresh process that compiles its programs; the command line keeps
them in JAX's persistent compilation cache (``DPGM_COMPILATION_CACHE``, :mod:`numpyro_dpgm.cli`).
For each workload a release of the bundled Adult data is written with ``dpgm release`` (the
seeded simulation sampler, ε = 1), then ``dpgm fit --method M`` is timed as a whole process
(wall clock from start to exit, compilation and imports included) in four conditions:

- ``off``: ``DPGM_COMPILATION_CACHE=off`` (every run compiles);
- ``cold``: the first run into an empty cache folder (compiles and writes the programs);
- ``warm``: the same command again (loads them);
- ``warm, new release``: a second release of the same tables (another seed), fitted with the
  cache the first release filled: the case of a data holder's next release.

Workloads (``--workloads``): ``small``, four two-way tables of Adult (age × sex, sex × income,
education-num × income, race × sex); ``tree``, the demo's tree (27 two-way tables, 20,774 cells
with the one-way tables). Each condition is run ``--repeats`` times (a fresh folder for each
``cold`` run) and every row records the 1-minute load average before it.

Run ``python -m benchmarks cli_cache [--workloads small,tree] [--methods naive,cgm-em,prox-pgm]
[--repeats 2]``; writes ``cli_cache-cpu.json`` and ``cli_cache-cpu.csv``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import add_out_argument, load_1min, new_record, write_results

DESCRIPTION = "dpgm fit's wall time as a process, with and without the compilation cache"

SMALL = ["age,sex", "sex,income>50K", "education-num,income>50K", "race,sex"]
DATA = Path(__file__).resolve().parents[1] / "numpyro_dpgm" / "datasets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default="small,tree")
    parser.add_argument("--methods", default="naive,cgm-em,prox-pgm")
    parser.add_argument("--repeats", type=int, default=2)
    add_out_argument(parser, "cli_cache-cpu")


def _cliques(workload: str) -> list[str]:
    if workload == "small":
        return SMALL
    if workload == "tree":
        from numpyro_dpgm.demo import ADULT_TREE

        return [",".join(c) for c in ADULT_TREE]
    raise ValueError(f"unknown workload {workload!r}; choose small or tree")


def _dpgm(args: list[Any], cache: str) -> float:
    """Wall seconds of one ``dpgm`` process with ``DPGM_COMPILATION_CACHE=cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["DPGM_COMPILATION_CACHE"] = cache
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "numpyro_dpgm.cli", *map(str, args)], env=env,
                   check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def _release(folder: Path, workload: str, seed: int) -> Path:
    out = folder / f"{workload}-{seed}.json"
    args = ["release", DATA / "adult.csv.gz", "--domain", DATA / "adult-domain.json",
            "--epsilon", "1", "--seed", seed, "-o", out]
    for clique in _cliques(workload):
        args += ["--clique", clique]
    _dpgm(args, "off")
    return out


def main(args: argparse.Namespace) -> int:
    record = new_record("cli_cache", vars(args) | {"out": str(args.out)}, rows=[])
    rows = record["rows"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for workload in args.workloads.split(","):
            first, second = _release(tmp, workload, 1), _release(tmp, workload, 2)
            for method in args.methods.split(","):
                fit = ["fit", "--method", method, "--force", "-o", tmp / "model.json"]
                times: dict[str, list[float]] = {}
                for _ in range(args.repeats):
                    cache = tmp / "cache"
                    shutil.rmtree(cache, ignore_errors=True)
                    for condition, release, folder in (
                            ("off", first, "off"), ("cold", first, cache),
                            ("warm", first, cache), ("warm, new release", second, cache)):
                        load = load_1min()
                        seconds = _dpgm([fit[0], release, *fit[1:]], str(folder))
                        times.setdefault(condition, []).append(seconds)
                        rows.append({"workload": workload, "method": method,
                                     "condition": condition, "seconds": seconds,
                                     "load_1min": load})
                print(f"{workload}, {method}: " + ", ".join(
                    f"{c} {statistics.median(t):.2f} s" for c, t in times.items()), flush=True)
    record["load_average_end"] = load_1min()
    paths = write_results(args.out, "cli_cache-cpu", record, rows)
    print("wrote " + ", ".join(map(str, paths)))
    return 0
