"""``dpgm release``: noisy clique tables of a records file, written as a measurements file."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from ._common import (
    Force,
    check_output,
    console,
    fmt,
    input_errors,
    labelled,
    ledger_for,
    read_table,
    release_budget,
    warn,
)


def _parse_cliques(specs: list[str], cliques_file: Path | None) -> list[tuple[str, ...]]:
    items = list(specs)
    if cliques_file is not None:
        import json

        if not cliques_file.is_file():
            raise FileNotFoundError(f"cliques file {cliques_file} does not exist")
        text = cliques_file.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = [line for line in text.splitlines() if line.strip()
                    and not line.lstrip().startswith("#")]
        if not isinstance(data, list):
            raise ValueError(f"cliques file {cliques_file}: expected a JSON list of lists of "
                             "attribute names, or one comma-separated clique per line")
        items += [",".join(map(str, c)) if isinstance(c, list) else str(c) for c in data]
    if not items:
        raise ValueError("no cliques: name the tables to release with --clique A,B (repeatable) "
                         "or --cliques FILE")
    out = []
    for spec in items:
        clique = tuple(a.strip() for a in spec.split(","))
        if any(not a for a in clique):
            raise ValueError(f"clique {spec!r} has an empty attribute name; write --clique A,B")
        out.append(clique)
    return out


def release(
    data: Annotated[Path, typer.Argument(help="records: a CSV (.csv, .csv.gz) or Parquet file")],
    out: Annotated[Path, typer.Option("--out", "-o", help="measurements file to write (JSON)")],
    epsilon: Annotated[float, typer.Option(help="privacy budget ε spent by this release")],
    clique: Annotated[list[str] | None, typer.Option(
        help="a table to release, attributes separated by commas (repeat: --clique Age,Sex "
             "--clique Pclass,Survived)")] = None,
    cliques: Annotated[Path | None, typer.Option(
        help="file of cliques: a JSON list of lists, or one comma-separated clique per line")
    ] = None,
    domain: Annotated[Path | None, typer.Option(
        help='domain JSON {"attr": size or [labels], ...}; without it the domain is inferred '
             "from the data, which discloses it")] = None,
    delta: Annotated[float | None, typer.Option(
        help="δ of an (ε, δ) budget (Gaussian mechanisms)")] = None,
    mechanism: Annotated[str, typer.Option(
        help="laplace, discrete_laplace, gaussian or discrete_gaussian")] = "laplace",
    neighbours: Annotated[str, typer.Option(
        help="add_remove (N stays private) or replace_one (N is public)")] = "add_remove",
    ledger: Annotated[Path | None, typer.Option(
        help="privacy ledger file, debited by this release; refuses to overspend")] = None,
    budget: Annotated[float | None, typer.Option(
        help="total ε of a new --ledger file (with --delta: an (ε, δ) total)")] = None,
    seed: Annotated[int | None, typer.Option(
        help="SIMULATION: draw the noise with the seeded JAX sampler (not for real releases; "
             "default: OpenDP's vetted sampler)")] = None,
    max_cells: Annotated[float, typer.Option(
        help="refuse a release with more cells than this, all tables together (before anything "
             "is counted or spent)")] = 20_000_000,
    force: Force = False,
) -> None:
    """Release noisy clique tables of a CSV/Parquet file: writes a measurements file.

    Real releases draw the noise with OpenDP's samplers; the ledger (if given) is debited
    before any noise is drawn and is written back only after the measurements file.
    """
    from ..encoding import encode, read_domain
    from ..io import save_ledger, save_measurements
    from ..privacy import release as private_release
    from ..privacy import simulate_release

    with input_errors():
        spend = release_budget(mechanism, epsilon, delta)
        clique_list = _parse_cliques(clique or [], cliques)
        check_output(out, force=force, inputs=(data, domain, cliques, ledger))
        if ledger is not None:
            check_output(ledger, update=True)
        book, keep_ledger = ledger_for(ledger, budget, delta, spend)
        frame = read_table(data)
        if domain is None:
            warn("no --domain: inferring the domain from the private data discloses which "
                 "values occur (not covered by ε); pass --domain for a private release")
            attrs = list(dict.fromkeys(a for c in clique_list for a in c))
            encoded = encode(frame, columns=attrs)
        else:
            dom, labels = read_domain(domain)
            encoded = encode(frame, dom, categories=labels)
        with warnings.catch_warnings(record=True) as caught:  # shown once the release is made
            warnings.simplefilter("always")
            if seed is None:
                meas = private_release(encoded.codes, clique_list, spend, domain=encoded.domain,
                                       mechanism=mechanism, neighbours=neighbours, ledger=book,
                                       max_cells=max_cells)
                sampler = "OpenDP (vetted sampler)"
            else:
                import jax

                meas = simulate_release(encoded.codes, clique_list, spend, jax.random.key(seed),
                                        domain=encoded.domain, mechanism=mechanism,
                                        neighbours=neighbours, ledger=book, max_cells=max_cells)
                sampler = f"SIMULATION: seeded JAX sampler, seed {seed}; not a real release"
        for w in caught:
            if issubclass(w.category, UserWarning):
                warn(str(w.message))
        total = float(len(frame)) if neighbours in ("replace_one", "replace") else None
        save_measurements(out, meas, encoded.domain, categories=labelled(encoded),
                          total=total, ledger=book)
        if keep_ledger:
            save_ledger(ledger, book)
    m0 = meas[0].noise
    scale = getattr(m0, "scale", None) or getattr(m0, "sigma", None)
    console.print(f"released {len(meas)} tables of {len(frame)} records with {mechanism} noise "
                  f"({type(m0).__name__} {scale:.6g}) at {spend}; sampler: {sampler}",
                  soft_wrap=True, highlight=False)
    console.print(f"ledger: spent {fmt(book.spent)} of {fmt(book.budget)} "
                  f"({book.currency}), remaining {fmt(book.remaining)}"
                  + (f"; updated {ledger}" if keep_ledger else ""), soft_wrap=True,
                  highlight=False)
    console.print(f"wrote {out}", soft_wrap=True, highlight=False)
