"""Write the package's layout page, ``docs/api/layout.md``: every module, one line each, by layer.

The layers and their order come from ``tests/test_layers.py`` (the test that keeps imports
pointing one way); each module's line is the first line of its docstring. Run
``python scripts/layout.py`` after adding, moving or splitting a module; ``--check`` exits with 1
when the page is out of date (the test suite runs the same check); ``--lines`` prints the page
with each module's line count instead of writing it.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api" / "layout.md"

TITLES = {
    1: "core: domains, tables, networks, measurements, data, accounting arithmetic",
    2: "oracles: marginal inference and its inverse",
    3: "distributions and accuracy measures",
    4: "infer: NumPyro handlers, Bayesian models, EM",
    5: "estimation: estimators from measurements, learners from records",
    6: "mechanisms and outputs: releases, select-measure-fit mechanisms, synthesis, files",
    7: "front ends: the package namespace, the command line, the experiments",
}


def _layers() -> dict[str, int]:
    spec = importlib.util.spec_from_file_location("_layers", ROOT / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.LAYERS)


def _path(name: str) -> Path:
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.replace("|", "\\|")


def render(with_lines: bool = False) -> str:
    """The page's text (``with_lines``: a column of line counts, for reports, not the page)."""
    layers = _layers()
    out = ["# Package layout", "",
           "Every module of `numpyro_dpgm`, by layer, bottom to top. A module imports only from "
           "its own layer or the layers below (`tests/test_layers.py` fails on any import that "
           "points up); a package's `__init__` sits in the layer of the highest module it "
           "re-exports. Written by `python scripts/layout.py`.", ""]
    for layer, title in TITLES.items():
        names = sorted(n for n, k in layers.items() if k == layer)
        head = ["| module | lines | what it does |", "|---|---:|---|"] if with_lines else [
            "| module | what it does |", "|---|---|"]
        out += [f"## {layer}. {title}", "", *head]
        for name in names:
            path = _path(name)
            lines = len(path.read_text(encoding="utf-8").splitlines())
            count = f" {lines} |" if with_lines else ""
            out.append(f"| `{name}` |{count} {_summary(path)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if "--lines" in argv:  # the page with line counts, on standard output
        print(render(with_lines=True))
        return 0
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/layout.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
