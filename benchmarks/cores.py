"""How a CPU's cores are best spent on the collapsed density: one process, or one per core.

The collapsed path's NUTS steps (:mod:`numpyro_dpgm.infer.bayes.collapse`) evaluate the value
and gradient of the release's density along the junction tree, about 1,350 small XLA
operations each on Adult's 842-cell tree. This benchmark measures the gradients per second
that the machine delivers in five arrangements of the same compiled program, a loop of
``--steps`` values and gradients in ``φ`` (the tree pass of :mod:`~numpyro_dpgm.infer.bayes.
collapsed_tree` at the Laplace noise's prior-mean variances, from the released log odds):

- ``one-process``: one process on every core (what ``run_nuts`` does today: its chains run one
  after another, XLA's runtime free to use every core);
- ``one-process-one-core``: the same process pinned to one core (``os.sched_setaffinity``);
- ``process-per-core``: one pinned process per core, all running at once (what chains in worker
  processes would get);
- ``threads``: one process, a Python thread per core calling the program at once;
- ``host-devices``: one process with a host device per core
  (``--xla_force_host_platform_device_count``), the program ``pmap``-ed over them (NumPyro's
  ``chain_method="parallel"``).

Each arrangement runs in fresh processes (``--rounds`` times, the arrangements interleaved);
the workers build the release (:func:`benchmarks.workloads.adult_release`, ``--edges``),
compile, report ready, and start timing together. A row: the arrangement, its processes and
threads, the wall seconds of the timed calls (the slowest worker's), the gradients computed
in all, gradients per second, milliseconds per gradient of each worker's thread or device,
CPU seconds, the load average before and after.

Run ``python -m benchmarks cores [--edges mid] [--steps 100] [--repeats 10] [--rounds 2]``;
writes ``cores-cpu.json`` (``--tag``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from .harness import add_out_argument, load_average, new_record, write_results

DESCRIPTION = ("gradients per second of the collapsed density: one process on every core "
               "against a process per core, threads and host devices")

#: The arrangements this benchmark measures (see the module's docstring).
ARRANGEMENTS = ("one-process", "one-process-one-core", "process-per-core", "threads",
                "host-devices")


def _program(edges: str, steps: int, seed: int) -> tuple[Any, Any]:
    """``(loop, start)``: a compiled loop of ``steps`` values and gradients of the collapsed
    density in ``φ`` on Adult's release ``edges``, and the released log odds it starts from."""
    import jax
    import jax.numpy as jnp

    from numpyro_dpgm.infer.bayes.collapse import collapse_plan
    from numpyro_dpgm.infer.bayes.collapsed_tree import TreeReleaseNormal
    from numpyro_dpgm.infer.bayes.paths import released_log_odds

    from .workloads import adult_release

    jax.config.update("jax_enable_x64", True)
    model, _, _ = adult_release(0, 1.0, seed, edges)
    y, v = jnp.asarray(model.y), 2.0 * jnp.asarray(model.noise_scales) ** 2
    site = collapse_plan(model.with_cgm(False), (), {"y": model.y}).sites[0]

    def density(phi: Any) -> Any:
        theta = model.latent_theta(model.coding.to_theta(phi))
        conds = site.functions.conditionals(theta, model.normalized)
        law = TreeReleaseNormal(site.tree, conds, site.total, v, functions=site.functions.tree)
        return law.log_prob(y)

    def loop(phi: Any) -> Any:
        def body(_: Any, carry: Any) -> Any:
            value, grad = jax.value_and_grad(density)(carry[0])
            return carry[0] + 1e-9 * grad, carry[1] + value

        return jax.lax.fori_loop(0, steps, body, (phi, jnp.zeros((), phi.dtype)))

    return loop, released_log_odds(model)


def worker(args: argparse.Namespace) -> int:
    """One worker: build, compile, say ready, wait for ``go`` on stdin, time, report."""
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    import jax
    import jax.numpy as jnp

    began = time.perf_counter()
    loop, start = _program(args.edges, args.steps, args.seed)
    copies = 1
    if args.worker == "host-devices":
        copies = jax.local_device_count()
        program = jax.pmap(loop)
        start = jnp.stack([start] * copies)
    else:
        program = jax.jit(loop)
    jax.block_until_ready(program(start))
    print(json.dumps({"ready": time.perf_counter() - began}), flush=True)
    sys.stdin.readline()
    threads = args.threads if args.worker == "threads" else 1

    def calls() -> None:
        for _ in range(args.repeats):
            jax.block_until_ready(program(start))

    cpu, wall = time.process_time(), time.perf_counter()
    if threads == 1:
        calls()
    else:
        running = [threading.Thread(target=calls) for _ in range(threads)]
        for t in running:
            t.start()
        for t in running:
            t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "streams": threads * copies,
                      "gradients": args.repeats * args.steps * threads * copies}), flush=True)
    return 0


def _launch(args: argparse.Namespace, mode: str, pin: int | None, env: dict) -> Any:
    command = [sys.executable, "-m", "benchmarks", "cores", "--worker", mode, "--edges",
               args.edges, "--steps", str(args.steps), "--repeats", str(args.repeats),
               "--seed", str(args.seed), "--threads", str(args.cores)]
    if pin is not None:
        command += ["--pin", str(pin)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)


def _report(worker_process: Any) -> dict[str, Any]:
    """The worker's next line of JSON, or an error that says it ended without one."""
    line = worker_process.stdout.readline()
    if not line:
        raise RuntimeError(f"a cores worker ended without reporting (exit status "
                           f"{worker_process.wait()}); its error is printed above")
    return json.loads(line)


def arrangement(args: argparse.Namespace, name: str, cores: list[int]) -> dict[str, Any]:
    """Run one arrangement's workers together; its row."""
    env = dict(os.environ)
    if name == "host-devices":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                            f"{len(cores)}").strip()
    mode = {"threads": "threads", "host-devices": "host-devices"}.get(name, "loop")
    pins = {"one-process": [None], "one-process-one-core": [cores[0]],
            "process-per-core": cores}.get(name, [None])
    load_before = load_average()
    workers = [_launch(args, mode, pin, env) for pin in pins]
    ready = [_report(w)["ready"] for w in workers]
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    reports = [_report(w) for w in workers]
    for w in workers:
        w.wait()
    seconds = max(r["seconds"] for r in reports)
    gradients = sum(r["gradients"] for r in reports)
    return {"arrangement": name, "processes": len(workers),
            "threads_per_process": len(cores) if name == "threads" else 1,
            "pinned": [p for p in pins if p is not None], "setup_s": ready,
            "seconds": seconds, "gradients": gradients,
            "gradients_per_s": gradients / seconds,
            "ms_per_gradient_per_worker": [1e3 * r["seconds"] * r["streams"] / r["gradients"]
                                           for r in reports],
            "cpu_s": sum(r["cpu_seconds"] for r in reports),
            "load_before": load_before, "load_after": load_average()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--edges", default="mid",
                        help="the release: 'chain' (321 cells) or a key of "
                             "benchmarks.workloads.ADULT_EDGES ('mid': 842 cells)")
    parser.add_argument("--steps", type=int, default=100,
                        help="values and gradients per call of the compiled loop")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per worker")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each arrangement runs (interleaved)")
    parser.add_argument("--seed", type=int, default=0, help="the release's noise")
    parser.add_argument("--arrangements", nargs="+", choices=ARRANGEMENTS,
                        default=list(ARRANGEMENTS))
    parser.add_argument("--worker", choices=("loop", "threads", "host-devices"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    add_out_argument(parser, "cores-cpu")
    parser.add_argument("--tag", default="cores-cpu")


def main(args: argparse.Namespace) -> int:
    if not hasattr(os, "sched_setaffinity"):
        print("cores pins processes to cores with os.sched_setaffinity, which this platform "
              "lacks (Linux has it)", file=sys.stderr)
        return 2
    if args.worker is not None:
        return worker(args)
    cores = sorted(os.sched_getaffinity(0))
    args.cores = len(cores)
    record = new_record("cores", {k: v for k, v in vars(args).items()
                                  if k not in ("worker", "pin", "threads")} | {
                                      "out": str(args.out), "cores": cores}, rows=[])
    for r in range(args.rounds):
        for name in args.arrangements:
            row = {"round": r, **arrangement(args, name, cores)}
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
            write_results(args.out, args.tag, record, record["rows"])
    paths = write_results(args.out, args.tag, record, record["rows"])
    print("wrote " + ", ".join(map(str, paths)))
    return 0
