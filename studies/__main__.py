"""Command line: ``python -m studies NAME [--quick] [--out DIR] [--force] [--set KEY=VALUE]``."""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path

from . import STUDIES


def setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: the value as a Python literal (``10``, ``1e4``, ``inf``,
    ``exact``), a comma-separated one as a tuple of them.

    >>> setting("epsilons=10,100")
    ('epsilons', (10, 100))
    >>> setting("oracles=exact")
    ('oracles', 'exact')
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(f"--set expects KEY=VALUE, e.g. --set epsilons=10, got {text!r}")

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
        raise ValueError(f"--set {key.strip()}= has no value")
    return key.strip(), tuple(items) if "," in value else items[0]


def check_out(out: Path, force: bool) -> None:
    """The output folder: new or empty, unless ``force``; never a file."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {out} is a file")
    if out.is_dir() and not force and any(out.iterdir()):
        held = ", ".join(sorted(p.name for p in out.iterdir())[:3])
        raise ValueError(f"output folder {out} already holds {held}; give --force to "
                         "overwrite, or choose another --out")


def main(argv: list[str] | None = None) -> int:
    """Run the study named by the first argument; bad input prints ``error: ...`` and
    returns 2 before any work."""
    parser = argparse.ArgumentParser(prog="python -m studies",
                                     description="Reproduce a paper's experiments: CSV tables "
                                                 "and PNG figures.")
    parser.add_argument("study", nargs="?", help=f"one of {', '.join(STUDIES)}")
    parser.add_argument("--list", action="store_true", help="name the studies")
    parser.add_argument("--quick", action="store_true", help="a small version, in minutes")
    parser.add_argument("--out", type=Path, help="output folder (default "
                        "outputs/reproduce/STUDY); new or empty unless --force")
    parser.add_argument("--force", action="store_true", help="write into a folder with files")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="replace one setting of the run (repeatable; "
                        "commas make a list), e.g. --set epsilons=10,100 --set parts=adult")
    args = parser.parse_args(argv)
    if args.list or args.study is None:
        print("\n".join(STUDIES))
        return 0
    try:
        if args.study not in STUDIES:
            raise ValueError(f"unknown study {args.study!r}; choose one of {', '.join(STUDIES)}")
        out = args.out or Path("outputs/reproduce") / args.study
        module = importlib.import_module(f"{__package__}.{args.study}")
        overrides = dict(setting(text) for text in args.settings)
        if overrides and not hasattr(module, "settings"):
            raise ValueError(f"{args.study} has no settings to replace: run it without --set")
        check_out(out, args.force)
        if overrides:
            module.settings(args.quick, **overrides)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import jax

    jax.config.update("jax_enable_x64", True)
    written = module.run(out, quick=args.quick, **overrides)
    print(f"wrote {out if written is None else written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
