"""The front-end jobs of ``dpgm``: ``demo`` and ``bench`` (the benchmarks of a source
checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ._common import Force, check_folder, console, enable_x64, fail, input_errors
from ._progress import show_stage

#: The demo's own output folder: the README's demo command rewrites it on every run.
DEMO_OUT = Path("outputs/demo")


def demo(
    epsilon: Annotated[float, typer.Option(help="privacy budget ε of the release")] = 1.0,
    out: Annotated[Path | None, typer.Option(
        help="folder for summary.json and the figures (default outputs/demo, the demo's own "
             "folder, rewritten by every run; any other folder keeps its files unless "
             "--force)")] = None,
    seed: Annotated[int | None, typer.Option(
        help="simulate the release with the seeded JAX sampler (default: OpenDP's sampler)",
    )] = None,
    em_iters: Annotated[int, typer.Option(help="CGM-EM iterations")] = 10,
    prox_iters: Annotated[int, typer.Option(help="Prox-PGM iterations")] = 3000,
    force: Force = False,
) -> None:
    """Release noisy Adult marginals, fit three estimators, report errors, write plots."""
    if epsilon <= 0:
        fail(f"--epsilon must be positive, got {epsilon}")
    own_folder = out is None
    out = DEMO_OUT if own_folder else out
    with input_errors():
        check_folder(out, ("summary.json", "errors.png", "age_marginal.png"),
                     force or own_folder)
    enable_x64()
    from ..demo import run_demo

    with show_stage("demo") as status:
        summary = run_demo(epsilon, out, seed, em_iters, prox_iters, progress=status)
    table = Table(title=f"Adult, {summary['records']} records, ε = {epsilon} "
                        f"({summary['sampler']})")
    table.add_column("method")
    table.add_column("L1 error, released marginals", justify="right")
    table.add_column("L1 error, 2-way outside model", justify="right")
    table.add_column("seconds", justify="right")
    table.add_row("noisy tables", f"{summary['noisy_tables_l1']:.4f}", "–", "–")
    for name, m in summary["methods"].items():
        table.add_row(name, f"{m['l1_in_model']:.4f}", f"{m['l1_out_of_model']:.4f}",
                      f"{m['seconds']:.2f}")
    console.print(table)
    console.print(f"wrote {out / 'summary.json'}, {out / 'errors.png'}, {out / 'age_marginal.png'}")


def _source_root() -> Path:
    """The folder that holds the package (the root of a source checkout)."""
    return Path(__file__).resolve().parents[2]


def bench(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(
        help="benchmark name (none: all of them); further options go to the benchmark")] = None,
) -> None:
    """Run the benchmarks of a source checkout (``python -m benchmarks``)."""
    root = _source_root()
    if not (root / "benchmarks" / "__main__.py").is_file():
        fail(f"dpgm bench runs the benchmarks/ folder of a source checkout, and there is none "
             f"beside the installed package ({root}); clone the repository and run it there")
    args = ([name] if name else []) + list(ctx.args)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    code = subprocess.call([sys.executable, "-m", "benchmarks", *args], cwd=root, env=env)
    raise typer.Exit(code)
