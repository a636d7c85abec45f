"""The front-end jobs of ``dpgm``: ``demo``, ``reproduce`` (the papers' reproductions) and
``bench`` (the benchmarks of a source checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ._common import Force, _check_folder, _enable_x64, _fail, _input_errors, console
from ._progress import _stage

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
        _fail(f"--epsilon must be positive, got {epsilon}")
    own_folder = out is None
    out = DEMO_OUT if own_folder else out
    with _input_errors():
        _check_folder(out, ("summary.json", "errors.png", "age_marginal.png"),
                      force or own_folder)
    _enable_x64()
    from ..experiments.demo import run_demo

    with _stage("demo") as status:
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


def _experiments() -> list[str]:
    """Reproductions shipped (experiments modules with ``run(out, quick)``)."""
    from importlib.util import find_spec

    names = ("bernstein2017", "mckenna2021", "zhang2020")
    return [n for n in names if find_spec(f"..experiments.{n}", __package__) is not None]


EXPERIMENTS = _experiments()


def _setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: the value as a Python literal (``10``, ``1e4``, ``inf``,
    ``exact``), a comma-separated one as a tuple of them."""
    import ast

    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        _fail(f"--set expects KEY=VALUE, e.g. --set epsilons=10, got {text!r}")

    def literal(item: str) -> object:
        item = item.strip()
        try:
            return ast.literal_eval(item)
        except (ValueError, SyntaxError):
            try:
                return float(item)  # inf, nan
            except ValueError:
                return item  # a name, e.g. exact

    items = [literal(v) for v in value.split(",") if v.strip()]
    if not items:
        _fail(f"--set {key.strip()}= has no value")
    return key.strip(), tuple(items) if "," in value else items[0]


def reproduce(
    experiment: Annotated[str, typer.Argument(help=f"one of {sorted(EXPERIMENTS)}")],
    quick: Annotated[bool, typer.Option(help="a small version that runs in minutes")] = False,
    out: Annotated[Path | None, typer.Option(
        help="output folder (default outputs/reproduce/EXPERIMENT); it must be new or empty "
             "unless --force")] = None,
    force: Force = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="replace one setting of the run, for a bounded run (repeatable; commas make a "
             "list), e.g. --set epsilons=10,100 --set oracles=exact --set iters_exact=1000 "
             "--set parts=adult (mckenna2021: the keys of mckenna2021.settings)")] = None,
) -> None:
    """Reproduce a paper's experiments: CSV tables and PNG figures."""
    import importlib

    if experiment not in EXPERIMENTS:
        _fail(f"unknown experiment {experiment!r}; choose one of {sorted(EXPERIMENTS)}")
    out = out or Path("outputs/reproduce") / experiment
    module = importlib.import_module(f"..experiments.{experiment}", __package__)
    overrides = dict(_setting(text) for text in set_ or ())
    if overrides and not hasattr(module, "settings"):
        _fail(f"{experiment} has no settings to replace: run it without --set")
    with _input_errors():
        _check_folder(out, None, force)
        if overrides:
            module.settings(quick, **overrides)
    _enable_x64()
    with _stage(f"reproducing {experiment}{' (quick)' if quick else ''}"):
        written = module.run(out, quick=quick, **overrides)
    console.print(f"wrote {out}" if written is None else f"wrote {written}")


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
        _fail(f"dpgm bench runs the benchmarks/ folder of a source checkout, and there is none "
              f"beside the installed package ({root}); clone the repository and run it there")
    args = ([name] if name else []) + list(ctx.args)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    code = subprocess.call([sys.executable, "-m", "benchmarks", *args], cwd=root, env=env)
    raise typer.Exit(code)
