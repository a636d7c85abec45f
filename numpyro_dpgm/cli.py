"""The ``dpgm`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Differentially private learning of graphical models (numpyro_dpgm).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()


def _enable_x64() -> None:
    import numpyro

    numpyro.enable_x64()


@app.callback()
def main() -> None:
    """Differentially private learning of graphical models."""


@app.command()
def demo(
    epsilon: Annotated[float, typer.Option(help="privacy budget ε of the release")] = 1.0,
    out: Annotated[Path, typer.Option(help="folder for summary.json and the figures")] = Path(
        "outputs/demo"),
    seed: Annotated[int | None, typer.Option(
        help="simulate the release with the seeded JAX sampler (default: OpenDP's sampler)",
    )] = None,
    em_iters: Annotated[int, typer.Option(help="CGM-EM iterations")] = 10,
    prox_iters: Annotated[int, typer.Option(help="Prox-PGM iterations")] = 3000,
) -> None:
    """Release noisy Adult marginals, fit three estimators, report errors, write plots."""
    if epsilon <= 0:
        console.print(f"[red]error:[/red] --epsilon must be positive, got {epsilon}")
        raise typer.Exit(2)
    _enable_x64()
    from .experiments.demo import run_demo

    with console.status("working") as status:
        summary = run_demo(epsilon, out, seed, em_iters, prox_iters,
                           progress=lambda msg: status.update(msg))
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
    return [n for n in names if find_spec(f"{__package__}.experiments.{n}") is not None]


EXPERIMENTS = _experiments()


@app.command()
def reproduce(
    experiment: Annotated[str, typer.Argument(help=f"one of {sorted(EXPERIMENTS)}")],
    quick: Annotated[bool, typer.Option(help="a small version that runs in minutes")] = False,
    out: Annotated[Path | None, typer.Option(
        help="output folder (default outputs/reproduce/EXPERIMENT)")] = None,
) -> None:
    """Reproduce a paper's experiments: CSV tables and PNG figures."""
    import importlib

    if experiment not in EXPERIMENTS:
        console.print(f"[red]error:[/red] unknown experiment {experiment!r}; "
                      f"choose one of {sorted(EXPERIMENTS)}")
        raise typer.Exit(2)
    module = importlib.import_module(f".experiments.{experiment}", __package__)
    _enable_x64()
    out = out or Path("outputs/reproduce") / experiment
    with console.status(f"reproducing {experiment}{' (quick)' if quick else ''}"):
        written = module.run(out, quick=quick)
    console.print(f"wrote {out}" if written is None else f"wrote {written}")


if __name__ == "__main__":  # pragma: no cover
    app()
