"""``dpgm synth``: synthetic records (one data set, or one per posterior draw) from a model
file, or from records by a private mechanism (``--mechanism aim|mst``, :mod:`._mechanism`),
written as CSV or Parquet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ._common import (
    TABLE_SUFFIXES,
    Force,
    TableWriter,
    check_output,
    console,
    enable_x64,
    input_errors,
    warn,
)
from ._mechanism import check_options, run_mechanism
from ._progress import show_stage


def synth(
    model: Annotated[Path, typer.Argument(
        help="model file from `dpgm fit`; with --mechanism, the records (CSV or Parquet)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="synthetic data: .csv or .parquet")],
    records: Annotated[int | None, typer.Option(
        help="number of records (default: N of the fit)")] = None,
    seed: Annotated[int | None, typer.Option(
        help="seed of the record sampler (default: a fresh random seed, printed)")] = None,
    posterior: Annotated[bool, typer.Option(
        help="the model file holds posterior draws (`dpgm fit --method nuts`): write one data "
             "set per draw, for the combining rules (numpyro_dpgm.rubin)")] = False,
    datasets: Annotated[int, typer.Option(
        help="number m of synthetic data sets with --posterior: OUT numbered from 1 to m, "
             "zero-padded to the width of m (-o synth.csv --datasets 20: synth-01.csv ... "
             "synth-20.csv)")] = 1,
    drop_unmodelled: Annotated[bool, typer.Option(
        "--drop-unmodelled", help="leave out the attributes in no released table (by default "
        "they are kept, drawn uniformly over their values, independently of the rest)")] = False,
    mechanism: Annotated[str | None, typer.Option(
        help="aim or mst: run that private mechanism on the records given (with --domain, "
             "--epsilon, --delta) and write its synthetic data")] = None,
    domain: Annotated[Path | None, typer.Option(
        help='--mechanism: domain JSON of the records {"attr": size or [labels], ...}')] = None,
    epsilon: Annotated[float | None, typer.Option(
        help="--mechanism: ε of the (ε, δ) budget")] = None,
    delta: Annotated[float | None, typer.Option(
        help="--mechanism: δ of the (ε, δ) budget")] = None,
    workload: Annotated[int | None, typer.Option(
        help="AIM: all K-way marginals with at most 10,000 cells (default 3)")] = None,
    target: Annotated[str | None, typer.Option(
        help="AIM: the 3-way (or --workload K-way) marginals that contain this column")] = None,
    max_model_size: Annotated[float | None, typer.Option(
        help="AIM: cap on the model's size in MB (default 80)")] = None,
    ledger: Annotated[Path | None, typer.Option(
        help="--mechanism: privacy ledger file (zCDP), debited by the run; refuses to "
             "overspend")] = None,
    budget: Annotated[float | None, typer.Option(
        help="--mechanism: total ε of a new --ledger file (with --delta)")] = None,
    sampling: Annotated[str | None, typer.Option(
        help="round or sample: round the model's expected counts to whole records (no "
             "sampling noise; all records of a data set in memory at once) or draw records at "
             "random (in chunks); default: round with --mechanism, sample from a model "
             "file")] = None,
    force: Force = False,
) -> None:
    """Draw synthetic records from a fitted model, with the original column names and labels;
    or run a private mechanism (--mechanism aim|mst) on records and write its synthetic data.

    With --mechanism, --seed SIMULATES: the selections and the noise come from the seeded JAX
    sampler (not for real releases; default: OpenDP's vetted samplers).

    --sampling round makes the records by rounding expected counts, as Private-PGM does: each
    attribute's counts within every group of records that share its parents in the model are
    the floor or ceiling of their expected counts (--mechanism's default); --sampling sample
    draws every record at random (the default for a model file).

    Attributes of the data in no released table are kept, drawn uniformly over their values
    (the maximum-entropy choice given no measurement of them), with a warning naming them.
    """
    import warnings

    from ..io import load_model
    from ..synthesis import (
        SAMPLINGS,
        UnmodelledAttributesWarning,
        iter_synthetic_chunks,
        unmodelled_attributes,
    )

    with input_errors():
        if records is not None and records < 1:
            raise ValueError(f"--records must be a positive integer, got {records}")
        if datasets < 1:
            raise ValueError(f"--datasets must be a positive integer, got {datasets}")
        if sampling is not None and sampling not in SAMPLINGS:
            raise ValueError(f"--sampling must be {' or '.join(SAMPLINGS)}, got {sampling!r}")
        if mechanism is not None:
            spend = check_options(mechanism, domain, epsilon, delta, workload, target,
                                  max_model_size, posterior)
            if not out.name.lower().endswith(TABLE_SUFFIXES):
                raise ValueError(f"output {out}: expected a file name ending in "
                                 f"{' or '.join(TABLE_SUFFIXES)}")
            enable_x64()
            paths = ([_numbered(out, i + 1, datasets) for i in range(datasets)] if datasets > 1
                     else [out])
            run_mechanism(model, paths, mechanism=mechanism, domain=domain, budget=spend,
                          workload=workload, target=target, max_model_size=max_model_size,
                          records=records, seed=seed, ledger=ledger, total_budget=budget,
                          drop_unmodelled=drop_unmodelled, force=force,
                          sampling=sampling or "round")
            return
        unused = {"--domain": domain, "--epsilon": epsilon, "--delta": delta,
                  "--workload": workload, "--target": target,
                  "--max-model-size": max_model_size, "--ledger": ledger, "--budget": budget}
        given = [k for k, v in unused.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to --mechanism only")
        if datasets > 1 and not posterior:
            raise ValueError("--datasets needs --posterior (several data sets from one point "
                             "estimate share its error and are not for the combining rules)")
        if not out.name.lower().endswith(TABLE_SUFFIXES):
            raise ValueError(f"output {out}: expected a file name ending in "
                             f"{' or '.join(TABLE_SUFFIXES)}")
        # every file this run writes is checked before anything is read or written
        paths = ([_numbered(out, i + 1, datasets) for i in range(datasets)] if posterior
                 else [out])
        for path in paths:
            check_output(path, force=force, inputs=(model,))
        enable_x64()
        saved = load_model(model)
        draws = saved.model.batch_shape
        if posterior and draws == ():
            raise ValueError(f"{model} holds a point estimate, not posterior draws; fit with "
                             "`dpgm fit --method nuts` for --posterior")
        if not posterior and draws != ():
            raise ValueError(f"{model} holds {draws[0]} posterior draws; give --posterior "
                             "--datasets m for m synthetic data sets")
        if posterior and datasets > draws[0]:
            raise ValueError(f"--datasets {datasets} exceeds the {draws[0]} posterior draws in "
                             f"{model}")
        num = records if records is not None else (int(round(saved.total)) if saved.total
                                                    else None)
        if num is None:
            raise ValueError(f"{model} does not record how many records the data had; give "
                             "--records")
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        free = unmodelled_attributes(saved.model.network)
        if free and not drop_unmodelled:
            warn(f"attribute(s) {free} are in no released table: drawn uniformly over their "
                 "values, independently of the other attributes (the maximum-entropy choice "
                 "given no measurement of them); --drop-unmodelled leaves them out")
        sampling = sampling or "sample"
        with show_stage(f"{_VERB[sampling]} {num} records"
                        + (f" × {datasets} data sets" if posterior else "")) as status, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", UnmodelledAttributesWarning)  # said above
            # one chunk of records in memory at a time: drawn, written, dropped
            chunks = iter_synthetic_chunks(saved.model, num, len(paths), rng_key=seed,
                                           categories=saved.categories,
                                           drop_unmodelled=drop_unmodelled,
                                           sampling=sampling)
            writer = None
            try:
                for chunk in chunks:
                    if chunk.start == 0:
                        writer = TableWriter(paths[chunk.dataset])
                    status(f"{_VERB[sampling]} {num} records: data set {chunk.dataset + 1} of "
                           f"{len(paths)}, record {chunk.start + len(chunk.frame)}")
                    writer.write(chunk.frame)
                    width = chunk.frame.shape[1]
                    if chunk.last:
                        writer.commit()
                        writer = None
            except BaseException:
                if writer is not None:
                    writer.discard()
                raise
    console.print(f"{'rounded' if sampling == 'round' else 'sampled'} {len(paths)} data "
                  f"set(s) of {num} records and {width} columns (seed {seed})", highlight=False)
    console.print("wrote " + (str(paths[0]) if len(paths) == 1 else f"{paths[0]} … {paths[-1]}"),
                  soft_wrap=True, highlight=False)


#: What the progress line says each way of making records is doing.
_VERB = {"sample": "sampling", "round": "rounding"}


def _numbered(path: Path, i: int, m: int) -> Path:
    """``synth.csv`` -> ``synth-01.csv`` (zero-padded to the width of ``m``)."""
    name = path.name
    suffix = next(s for s in TABLE_SUFFIXES if name.lower().endswith(s))
    return path.with_name(f"{name[: -len(suffix)]}-{i:0{len(str(m))}d}{suffix}")
