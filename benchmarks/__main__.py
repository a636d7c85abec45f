"""Command line: ``python -m benchmarks [<name> [options]]`` (no name: run them all)."""

from __future__ import annotations

import argparse
import sys

from . import BENCHMARKS, load


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the benchmark named by the first argument.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help", "--list"):
        print("usage: python -m benchmarks [<name> [options]]   (<name> --help for its options;")
        print("       no name runs every benchmark with its defaults)")
        print("benchmarks:")
        for name in sorted(BENCHMARKS):
            print(f"  {name:<12} {load(name).DESCRIPTION}")
        return 0
    if not argv:
        return max(main([name]) for name in BENCHMARKS)
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHMARKS))}",
              file=sys.stderr)
        return 2
    module = load(name)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}",
                                     description=module.DESCRIPTION)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
