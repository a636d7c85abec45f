"""Side-by-side benchmarks of numpyro_dpgm against peer libraries.

Run one with ``python -m benchmarks <name> [options]``, or all of them with their defaults with
``python -m benchmarks`` (``python -m benchmarks --list`` names them,
``python -m benchmarks <name> --help`` gives its options). Results go to JSON and CSV
under ``bench-results/`` unless ``--out`` says otherwise; ``benchmarks/results/`` keeps copies
of reference runs with the machine they ran on.

A benchmark is a module of this package that defines

- ``DESCRIPTION``: one line for the listing,
- ``add_arguments(parser)``: its command-line options (an :class:`argparse.ArgumentParser`),
- ``main(args) -> int``: the run, given the parsed options; returns an exit status.

To add one, write the module: every module of this package that defines ``DESCRIPTION`` at its
top level is a benchmark named after the module.

What benchmarks share is in two modules that are not benchmarks: :mod:`benchmarks.harness`
(the machine, the load average, the JSON record and the ``NAME.json`` / ``NAME.csv`` files, the
timing of first and later calls, the ``--out`` option) and :mod:`benchmarks.workloads` (the
Adult cliques, seed 002's synthetic releases). A benchmark imports those, never another
benchmark's module.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

__all__ = ["BENCHMARKS", "load"]


def _discover() -> dict[str, str]:
    """Modules of this folder that assign ``DESCRIPTION`` at top level (read, not imported)."""
    found = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "DESCRIPTION" for t in node.targets)
               for node in tree.body):
            found[path.stem] = f"{__name__}.{path.stem}"
    return found


#: Benchmark name -> module that implements it (imported only when that benchmark runs).
BENCHMARKS: dict[str, str] = _discover()


def load(name: str) -> ModuleType:
    """Import the module of benchmark ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`BENCHMARKS`.

    Returns
    -------
    module
        With ``DESCRIPTION``, ``add_arguments`` and ``main``.
    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; available: {sorted(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])
