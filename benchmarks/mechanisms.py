"""MST and AIM side by side with mbi's mechanisms: workload error and wall time.

Contenders: this library's :func:`~numpyro_dpgm.mst` and :func:`~numpyro_dpgm.aim` (seeded JAX
samplers, so that runs repeat) and mbi's ``MST`` and ``AIM`` (private-pgm's
``mechanisms/mst.py`` and ``aim.py`` at the repository's head, defaults untouched: AIM with
``max_model_size = 80`` and ``max_iters = 1000``, MST with 10,000 final iterations). Every run
is a fresh subprocess (no warm compilation caches; the import is not timed): ours through
``python -m benchmarks mechanisms --one ...``, mbi's through ``benchmarks/_mbi_mechanisms.py``
under the Python of an environment with mbi installed (``--mbi-python``). Each run's time
covers the mechanism and the synthetic data it returns.

Our synthetic data are made as ``--sampling`` says: ``round`` (default; the mechanisms'
``synthesize`` default, and what mbi's ``synthetic_data`` does) rounds the model's expected
counts, ``sample`` draws the records at random. ``--epsilons`` and ``--seeds`` narrow the plan.

Workload: all 3-way marginals with at most 10,000 cells; error: the mean over the workload of
``½‖p̂ − p‖₁`` between the synthetic data's and the real data's marginals (the figure mbi's
scripts print); budget ``(ε, 1e-9)``. Data: Adult and Titanic from ``shared/data``.

mbi at its head does not run on current numpy, pandas and JAX; :data:`MBI_PATCHES` lists the
three changes ``--setup-mbi`` applies before installing it (none touches what the mechanisms
compute).

``--update`` adds this call's runs to those already in ``--out`` (a run repeated replaces the
earlier one), so a grid can be completed (``--missing`` runs only what has no successful run
yet) or one contender rerun after a change; every run keeps its own load average.
``--plan full`` runs the whole grid (2 data sets × ε ∈ {0.1, 1, 10} × 5 seeds × 4
contenders); ``--plan reduced`` a small grid (Titanic: every ε, 2 seeds, all four; Adult:
ε = 1, 1 seed, all but mbi's AIM). A run that exceeds ``--timeout`` is
recorded as a timeout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .workloads import SHARED_DATA, shared_dataset

DESCRIPTION = "MST and AIM against mbi's: workload error (3-way) and wall time"

OURS = ("ours-mst", "ours-aim")
MBI = ("mbi-mst", "mbi-aim")
DELTA = 1e-9

#: (file under src/mbi, old text, new text, why): what mbi's head needs to run here.
MBI_PATCHES = (
    ("markov_random_field.py", "            counts *= total / counts.sum()",
     "            counts = counts * (total / counts.sum())",
     "synthetic_data scaled a read-only array (a JAX array seen by numpy) in place"),
    ("factor.py", "        if isinstance(other, chex.Numeric) and jnp.ndim(other) == 0:",
     "        if not isinstance(other, Factor) and jnp.ndim(other) == 0:",
     "a traced scalar is no chex.Numeric on current JAX, so Factor + scalar failed under jit"),
    ("markov_random_field.py", """            def foo(group):
                idx = group.name
                vals = synthetic_col(marg[idx], group.shape[0])
                group[col] = vals
                return group

            if len(proj) >= 1:
                df = df.groupby(list(proj), group_keys=False).apply(foo)""",
     """            if len(proj) >= 1:
                column = df.columns.get_loc(col)
                for idx, rows in df.groupby(list(proj)).indices.items():
                    idx = idx if isinstance(idx, tuple) else (idx,)
                    df.iloc[rows, column] = synthetic_col(marg[idx], len(rows))""",
     "pandas 3's groupby.apply drops the grouping columns, so synthetic_data lost them"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", choices=["full", "reduced"], default="full")
    parser.add_argument("--contenders", nargs="+", default=list(OURS + MBI),
                        choices=list(OURS + MBI))
    parser.add_argument("--data", nargs="+", default=["titanic", "adult"],
                        choices=["titanic", "adult"], help="data sets of the plan to run")
    parser.add_argument("--mbi-python", default="/tmp/mbi-venv/bin/python",
                        help="Python of an environment with mbi installed")
    parser.add_argument("--mbi-repo", type=Path, default=Path("/tmp/mbi-src"),
                        help="private-pgm checkout (its mechanisms/ folder is used)")
    parser.add_argument("--setup-mbi", type=Path, default=None, metavar="CHECKOUT",
                        help="copy this private-pgm checkout to --mbi-repo, apply MBI_PATCHES, "
                             "and pip-install it into the environment of --mbi-python")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds per run before it is recorded as a timeout")
    parser.add_argument("--sampling", choices=["round", "sample"], default="round",
                        help="how our synthetic records are made (see synthesize)")
    parser.add_argument("--epsilons", nargs="+", type=float, default=None,
                        help="only the plan's runs at these ε")
    parser.add_argument("--seeds", type=int, default=None,
                        help="only the plan's runs with seed < SEEDS")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--update", action="store_true",
                        help="keep the runs already in OUT/mechanisms-cpu.json, replacing those "
                             "this call repeats (same data, contender, ε and seed)")
    parser.add_argument("--missing", action="store_true",
                        help="with --update: run only what OUT has no successful run of (to "
                             "complete a grid)")
    parser.add_argument("--one", nargs=5, metavar=("DATA", "MECH", "EPS", "SEED", "OUT"),
                        help=argparse.SUPPRESS)


def plan(name: str) -> list[tuple[str, str, float, int]]:
    """``(data, contender, ε, seed)`` of every run of a plan."""
    if name == "full":
        return [(d, c, e, s) for d, e, s, c in itertools.product(
            ("titanic", "adult"), (0.1, 1.0, 10.0), range(5), OURS + MBI)]
    runs = [("titanic", c, e, s) for e, s, c in itertools.product(
        (0.1, 1.0, 10.0), range(2), OURS + MBI)]
    return runs + [("adult", c, 1.0, 0) for c in ("ours-mst", "ours-aim", "mbi-mst")]


def setup_mbi(checkout: Path, repo: Path, python: str) -> None:
    """Copy ``checkout`` to ``repo``, apply :data:`MBI_PATCHES`, install it with pip."""
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(checkout, repo)
    for name, old, new, _ in MBI_PATCHES:
        path = repo / "src" / "mbi" / name
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"mbi patch does not apply to {path}: {old.splitlines()[0]!r}")
        path.write_text(text.replace(old, new))
    subprocess.run([python, "-m", "pip", "install", "-q", str(repo), "matplotlib"], check=True)


def run_ours(data: str, mech: str, eps: float, seed: int,
             sampling: str = "round") -> dict[str, Any]:
    """One run of our MST or AIM in this process, its synthetic data made by ``sampling``."""
    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dpgm import ApproxDP, count, synthesize
    from numpyro_dpgm.mechanisms import aim, all_marginals, mst, workload_error

    records, domain = shared_dataset(data)
    workload = [c for c, _ in all_marginals(domain, 3)]
    start = time.perf_counter()
    args = {"budget": ApproxDP(eps, DELTA), "sampler": "jax", "rng_key": seed}
    fit = mst(records, domain, **args) if mech == "mst" else aim(records, domain, **args)
    synth = synthesize(fit, len(records), rng_key=seed + 1000, sampling=sampling)
    seconds = time.perf_counter() - start
    error = workload_error(count(synth, workload, domain), count(records, workload, domain))
    costs = fit.extras["costs"]
    return {"error": error, "seconds": seconds,
            "rounds": len(fit.extras.get("rounds", fit.extras.get("selected", ()))),
            "fits": len(costs), "new_structures": sum(c["new_structure"] for c in costs),
            "fit_seconds": sum(c["seconds"] for c in costs),
            "compile_seconds": sum(c["compile_seconds"] for c in costs)}


def _subprocess(cmd: list[str], out: Path, timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": timeout}
    if proc.returncode != 0 or not out.exists():
        return {"status": "error", "message": (proc.stderr or proc.stdout)[-2000:]}
    return {"status": "ok", **json.loads(out.read_text())}


def run(data: str, contender: str, eps: float, seed: int, args: argparse.Namespace,
        tmp: Path) -> dict[str, Any]:
    """One run in a fresh subprocess, with the load average around it."""
    out = tmp / f"{data}-{contender}-{eps}-{seed}.json"
    lib, mech = contender.split("-")
    if lib == "ours":
        cmd = [sys.executable, "-m", "benchmarks", "mechanisms", "--sampling", args.sampling,
               "--one", data, mech, str(eps), str(seed), str(out)]
    else:
        cmd = [args.mbi_python, str(Path(__file__).parent / "_mbi_mechanisms.py"),
               str(args.mbi_repo / "mechanisms"), str(SHARED_DATA / f"{data}.csv"),
               str(SHARED_DATA / f"{data}-domain.json"), mech, str(eps), str(DELTA),
               str(seed), str(out)]
    load = os.getloadavg()
    result = _subprocess(cmd, out, args.timeout)
    return {"data": data, "contender": contender, "epsilon": eps, "seed": seed,
            "loadavg_start": [round(x, 2) for x in load],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()], **result}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sd of the error and the time per data set, ε and contender."""
    rows = []
    keys = sorted({(r["data"], r["epsilon"], r["contender"]) for r in runs})
    for data, eps, contender in keys:
        group = [r for r in runs if (r["data"], r["epsilon"], r["contender"]) ==
                 (data, eps, contender)]
        ok = [r for r in group if r["status"] == "ok"]
        err = np.array([r["error"] for r in ok])
        sec = np.array([r["seconds"] for r in ok])
        rows.append({"data": data, "epsilon": eps, "contender": contender, "runs": len(group),
                     "ok": len(ok), "timeouts": sum(r["status"] == "timeout" for r in group),
                     "error_mean": float(err.mean()) if ok else None,
                     "error_sd": float(err.std(ddof=1)) if len(ok) > 1 else None,
                     "seconds_mean": float(sec.mean()) if ok else None,
                     "timeout_seconds": min((r["seconds"] for r in group
                                             if r["status"] == "timeout"), default=None),
                     "load_mean": float(np.mean([r["loadavg_start"][0] for r in group]))})
    return rows


def table(summary: list[dict[str, Any]]) -> str:
    """A Markdown table: per data set and ε, each contender's error (mean ± sd, runs) and
    mean seconds."""
    names = [c for c in OURS + MBI if any(r["contender"] == c for r in summary)]
    lines = ["| data | ε | " + " | ".join(f"{c} error | {c} s" for c in names) + " |",
             "|---|---|" + "---|---|" * len(names)]
    for data, eps in sorted({(r["data"], r["epsilon"]) for r in summary},
                            key=lambda k: (k[0] != "titanic", k[1])):
        cells = []
        for c in names:
            row = next((r for r in summary if (r["data"], r["epsilon"], r["contender"]) ==
                        (data, eps, c)), None)
            if row is None or row["error_mean"] is None:
                cells += (["–", "–"] if not (row and row["timeouts"]) else
                          [f"timeout ({row['timeouts']})", f"> {row['timeout_seconds']:.0f}"])
                continue
            sd = f" ± {row['error_sd']:.3f}" if row["error_sd"] is not None else ""
            late = f", {row['timeouts']} timeout" if row["timeouts"] else ""
            cells += [f"{row['error_mean']:.3f}{sd} ({row['ok']}{late})",
                      f"{row['seconds_mean']:.0f}"]
        lines.append(f"| {data} | {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.one:
        data, mech, eps, seed, out = args.one
        result = run_ours(data, mech, float(eps), int(seed), args.sampling)
        Path(out).write_text(json.dumps(result))
        return 0
    if args.setup_mbi is not None:
        setup_mbi(args.setup_mbi, args.mbi_repo, args.mbi_python)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = _earlier(args.out) if args.update else []
    done = {_key(r) for r in runs if r["status"] == "ok"} if args.missing else set()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for data, contender, eps, seed in plan(args.plan):
            if contender not in args.contenders or data not in args.data or (
                    args.epsilons is not None and eps not in args.epsilons) or (
                    args.seeds is not None and seed >= args.seeds) or (
                    (data, contender, eps, seed) in done):
                continue
            r = run(data, contender, eps, seed, args, Path(tmp))
            runs = [q for q in runs if _key(q) != _key(r)] + [r]
            print(f"{data:8s} {contender:9s} eps={eps:<5g} seed={seed} {r['status']:7s} "
                  f"error={r.get('error', float('nan')):.4f} "
                  f"seconds={r.get('seconds', float('nan')):.1f} "
                  f"load={r['loadavg_start'][0]:.1f}", flush=True)
            _write(args, runs, start)
    print(table(summarise(runs)))
    return 0


def _key(r: dict[str, Any]) -> tuple[str, str, float, int]:
    return r["data"], r["contender"], float(r["epsilon"]), int(r["seed"])


def _earlier(out: Path) -> list[dict[str, Any]]:
    """The runs of an earlier call's ``mechanisms-cpu.json`` in ``out`` (none if absent)."""
    path = out / "mechanisms-cpu.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def _write(args: argparse.Namespace, runs: list[dict[str, Any]], start: float) -> None:
    meta = {"plan": args.plan, "sampling": args.sampling, "delta": DELTA,
            "workload": "all 3-way, <= 10,000 cells",
            "machine": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "wall_seconds": time.perf_counter() - start,
            "mbi_patches": [why for *_, why in MBI_PATCHES]}
    summary = summarise(runs)
    (args.out / "mechanisms-cpu.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    fields = ["data", "contender", "epsilon", "seed", "status", "error", "seconds", "rounds",
              "fit_seconds", "compile_seconds", "loadavg_start", "loadavg_end"]
    lines = [",".join(fields)]
    for r in runs:
        lines.append(",".join(
            "|".join(map(str, r[f])) if isinstance(r.get(f), list) else str(r.get(f, ""))
            for f in fields))
    (args.out / "mechanisms-cpu.csv").write_text("\n".join(lines) + "\n")
