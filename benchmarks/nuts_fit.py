"""``dpgm fit --method nuts`` with its defaults, as a user runs it, on releases of Adult.

For each model (``--models``: ``small``, 97 cells; ``mid``, 842 cells: networks of edges of the
demo's tree with their one-way tables, :data:`benchmarks.workloads.ADULT_EDGES`), each data set
(``--data``: ``adult``, the bundled 48,842 records; or a number of records drawn from the
junction-tree MLE of Adult's tables, e.g. ``250000``) and each ``--eps``, the records are written
to a CSV file, released with ``dpgm release`` (Laplace, the seeded simulation sampler;
``--release-options`` for others, e.g. ``"--mechanism gaussian --delta 1e-6"``) and fitted with
``dpgm fit --method nuts`` and no other option than ``--fit-options``: its defaults are 2 chains in
parallel of 500 warm-up + 500 draws, then batches of 500 more per chain until every parameter's
split R-hat is at most 1.01 and its bulk ESS at least 400, or until the next batch would end after
``--time-limit`` seconds (600). Each fit is timed as a whole process (imports, compilation,
warm-up, draws); the row keeps the figures the model file's provenance records (path, draws,
further batches, worst R-hat, smallest bulk ESS, draws at the maximum tree depth, divergences, how
the chains ran), whether it met the aim, and the 1-minute load average before and after.

Run ``python -m benchmarks nuts_fit [--models small,mid] [--data adult,250000] [--eps 1,0.1]``;
writes ``nuts_fit-cpu.json`` and ``nuts_fit-cpu.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import add_out_argument, load_1min, new_record, write_results
from .workloads import ADULT_EDGES, adult_data

DESCRIPTION = "dpgm fit --method nuts with its defaults on Adult releases: R-hat, ESS, wall time"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="small,mid")
    parser.add_argument("--data", default="adult,250000",
                        help="adult, or a number of records drawn from the model fitted to it")
    parser.add_argument("--eps", default="1,0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit-options", default="",
                        help="further options of dpgm fit, e.g. '--time-limit 300'")
    parser.add_argument("--release-options", default="",
                        help="further options of dpgm release, e.g. '--mechanism gaussian "
                             "--delta 1e-6' (default: Laplace)")
    add_out_argument(parser, "nuts_fit-cpu")


def _dpgm(args: list[Any]) -> tuple[float, str]:
    """Wall seconds and standard error of one ``dpgm`` process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["DPGM_COMPILATION_CACHE"] = "off"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "numpyro_dpgm.cli", *map(str, args)], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"dpgm {args[0]} failed:\n{done.stderr}")
    return seconds, done.stderr


def _write_data(folder: Path, model: str, data: str, seed: int) -> tuple[Path, Path, Any]:
    """The records of ``model``'s attributes as a CSV of codes and its domain file."""
    records = None if data == "adult" else int(data)
    dataset, network = adult_data(ADULT_EDGES[model], records, seed)
    csv, domain = folder / f"{model}-{data}.csv", folder / f"{model}-{data}-domain.json"
    dataset.records.to_csv(csv, index=False)
    domain.write_text(json.dumps(dict(dataset.domain)))
    return csv, domain, network


def main(args: argparse.Namespace) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)  # the records drawn from the fitted model
    record = new_record("nuts_fit", vars(args) | {"out": str(args.out)}, rows=[])
    rows = record["rows"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model in args.models.split(","):
            for data in args.data.split(","):
                csv, domain, network = _write_data(tmp, model, data, args.seed)
                for eps in args.eps.split(","):
                    meas, fitted = tmp / f"{model}-{data}-{eps}.json", tmp / "model.json"
                    release = ["release", csv, "--domain", domain, "--epsilon", eps, "--seed",
                               args.seed + 7, "--force", "-o", meas]
                    for clique in network.cliques:
                        release += ["--clique", ",".join(clique)]
                    release += args.release_options.split()
                    _dpgm(release)
                    load = load_1min()
                    seconds, stderr = _dpgm(["fit", meas, "--method", "nuts", "--force", "-o",
                                             fitted, *args.fit_options.split()])
                    options = json.loads(fitted.read_text())["provenance"]["options"]
                    row = {"model": model, "data": data, "eps": float(eps),
                           "release_options": args.release_options,
                           "cells": network.num_params, "seconds": seconds,
                           "met": options["max_rhat"] <= 1.01 and options["min_ess_bulk"] >= 400,
                           **{k: options.get(k) for k in (
                               "path", "chain_method", "chains", "draws", "batches",
                               "time_limit", "max_rhat", "min_ess_bulk", "max_depth_hits",
                               "divergences")},
                           "warned": "warning: run_nuts" in stderr,
                           "load_1min_before": load, "load_1min_after": load_1min()}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    record["load_average_end"] = load_1min()
    paths = write_results(args.out, "nuts_fit-cpu", record, rows)
    print("wrote " + ", ".join(map(str, paths)))
    return 0
