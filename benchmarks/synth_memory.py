"""Peak memory of drawing synthetic data: m posterior data sets of N records on Adult's tree.

Each configuration runs in a fresh Python process, so its peak resident memory
(``ru_maxrss``) is that of the draw alone (plus the interpreter, JAX and the model). The model
is Adult's demo network (``numpyro_dpgm.demo.ADULT_TREE`` plus every one-way marginal, the real
domain), with a batch of ``m`` log-potential vectors standing in for posterior draws; memory
depends on the cliques and the number of records, not on the values of ``θ``.

Writes ``synth_memory-<device>.{json,csv}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

from .harness import add_out_argument, load_1min, write_results

DESCRIPTION = "peak memory of synthesize: m posterior data sets of N records on Adult's tree"

CHILD = r"""
import json, resource, sys, time
import jax, numpyro
numpyro.enable_x64()
from numpyro_dpgm import MarkovNetwork, MarkovRandomField, load_demo, synthesize
from numpyro_dpgm.demo import ADULT_TREE
from numpyro_dpgm.synthesis import iter_synthetic, iter_synthetic_chunks
records, datasets, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
domain = load_demo("adult").domain
net = MarkovNetwork(domain, list(ADULT_TREE) + [(a,) for a in domain.attrs])
theta = jax.random.normal(jax.random.key(0), (datasets, net.num_params))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
model = MarkovRandomField(net, theta)
if mode == "list":  # synthesize: every data set held at once
    rows = sum(len(s) for s in synthesize(model, records, num_datasets=datasets, rng_key=1))
elif mode == "iter":  # iter_synthetic, each data set dropped before the next
    rows = sum(len(s) for s in iter_synthetic(model, records, num_datasets=datasets, rng_key=1))
else:  # iter_synthetic_chunks, each chunk dropped before the next (as dpgm synth writes them)
    rows = sum(len(c.frame) for c in iter_synthetic_chunks(model, records, num_datasets=datasets,
                                                           rng_key=1))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": mode, "records": records, "datasets": datasets, "rows": rows,
                  "peak_mb": peak / 1024, "before_draw_mb": base / 1024, "seconds": seconds}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, nargs="+", default=[48_842, 250_000, 1_000_000],
                        help="records per data set (default: Adult's size, 250,000 and 10⁶)")
    parser.add_argument("--datasets", type=int, default=10, help="data sets m (default 10)")
    parser.add_argument("--modes", nargs="+", default=["list", "iter", "chunks"],
                        choices=["list", "iter", "chunks"],
                        help="list: synthesize (all data sets held); iter: iter_synthetic, one "
                             "data set at a time; chunks: iter_synthetic_chunks, one chunk of "
                             "records at a time (what dpgm synth does)")
    add_out_argument(parser, "synth_memory-cpu")


def main(args: argparse.Namespace) -> int:
    rows = []
    for mode, records in [(m, r) for m in args.modes for r in args.records]:
        load = load_1min()
        done = subprocess.run([sys.executable, "-c", CHILD, str(records), str(args.datasets), mode],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1]) | {"load_average": load}
        print(f"{mode}: N = {records:,}, m = {args.datasets}: peak {row['peak_mb']:.0f} MB "
              f"({row['before_draw_mb']:.0f} MB before the draw), {row['seconds']:.1f} s, "
              f"load {load:.1f}")
        rows.append(row)
    meta = {"machine": platform.machine(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    paths = write_results(args.out, "synth_memory-cpu", {"meta": meta, "rows": rows}, rows,
                          indent=2)
    print("wrote " + ", ".join(map(str, paths)))
    return 0
