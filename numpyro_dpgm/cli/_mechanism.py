"""``dpgm synth DATA --mechanism aim|mst``: records in, a private mechanism, synthetic records out.

The records are read with their domain file (as ``dpgm release`` reads them), the mechanism
(:func:`numpyro_dpgm.aim` or :func:`numpyro_dpgm.mst`) selects, measures and fits, and the fitted
model's records are written: rounded from its expected counts unless ``--sampling sample``
asks for random draws. Without ``--seed`` the selections and the noise come from OpenDP's
vetted samplers; ``--seed`` runs the seeded JAX sampler (a simulation) and says so. A ledger
file is debited in zCDP (a new one is created by ``--budget`` with ``--delta``) and written back
only after the synthetic data. Every check runs before any record is read.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from ._common import check_output, console, fmt, read_table, warn, write_table
from ._progress import show_stage

MECHANISMS = ("aim", "mst")


def _ledger(path: Path | None, total: float | None, delta: float) -> tuple[Any, bool]:
    """The ledger to debit (``None``: the mechanism's own) and whether it goes back to a file."""
    from ..io import load_ledger
    from ..privacy.guarantees import ApproxDP
    from ..privacy.ledger import PrivacyLedger

    if path is None:
        if total is not None:
            raise ValueError("--budget sets the total of a new --ledger file; give --ledger too")
        return None, False
    if path.exists():
        if total is not None:
            raise ValueError(f"ledger {path} exists and has its total budget; drop --budget "
                             "(or use a new ledger file)")
        book = load_ledger(path)
        if book.currency != "zcdp":
            raise ValueError(f"ledger {path} composes in {book.currency!r} currency; the "
                             "mechanisms spend zCDP: use a ledger created with --budget and "
                             "--delta by this command (currency 'zcdp')")
        return book, True
    if total is None:
        raise ValueError(f"ledger {path} does not exist; create it by giving its total budget "
                         "with --budget EPSILON (and --delta)")
    if not total > 0:
        raise ValueError(f"--budget must be positive, got {total}")
    return PrivacyLedger(ApproxDP(total, delta), currency="zcdp", conversion="cks20"), True


def check_options(mechanism: str, domain: Path | None, epsilon: float | None,
                  delta: float | None, workload: int | None, target: str | None,
                  max_model_size: float | None, posterior: bool) -> Any:
    """The (ε, δ) budget, after every option check."""
    from ..privacy.guarantees import ApproxDP

    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown --mechanism {mechanism!r}; choose aim or mst")
    if domain is None:
        raise ValueError("--mechanism reads records: give their --domain JSON (inferring it "
                         "from the private data would disclose it)")
    if epsilon is None or delta is None:
        raise ValueError("--mechanism needs --epsilon and --delta (an (ε, δ) budget, e.g. "
                         "--epsilon 1 --delta 1e-9)")
    if posterior:
        raise ValueError("--posterior reads posterior draws from a model file; it does not "
                         "apply to --mechanism")
    if mechanism == "mst" and (workload is not None or target is not None
                               or max_model_size is not None):
        raise ValueError("--workload, --target and --max-model-size are AIM's options")
    if workload is not None and workload < 1:
        raise ValueError(f"--workload must be a positive integer, got {workload}")
    if max_model_size is not None and not max_model_size > 0:
        raise ValueError(f"--max-model-size must be positive, got {max_model_size}")
    if not epsilon > 0:
        raise ValueError(f"--epsilon must be positive, got {epsilon}")
    return ApproxDP(epsilon, delta)


def run_mechanism(data: Path, paths: list[Path], *, mechanism: str, domain: Path,
                  budget: Any, workload: int | None, target: str | None,
                  max_model_size: float | None, records: int | None, seed: int | None,
                  ledger: Path | None, total_budget: float | None,
                  drop_unmodelled: bool, force: bool, sampling: str = "round") -> None:
    """Check the outputs and the ledger, read, run the mechanism, write ``paths``."""
    from ..encoding import encode, read_domain
    from ..io import save_ledger
    from ..mechanisms import aim, mst
    from ..synthesis import UnmodelledAttributesWarning, iter_synthetic

    for path in paths:
        check_output(path, force=force, inputs=(data, domain, ledger))
    if ledger is not None:
        check_output(ledger, update=True)
    book, keep_ledger = _ledger(ledger, total_budget, budget.delta)
    dom, labels = read_domain(domain)
    if target is not None and target not in dom:
        raise KeyError(f"unknown --target column {target!r}; the domain has {list(dom.attrs)}")
    frame = read_table(data)
    encoded = encode(frame, dom, categories=labels)
    sampler = "jax" if seed is not None else "opendp"
    options: dict[str, Any] = {"budget": budget, "ledger": book, "sampler": sampler,
                               "rng_key": seed}
    if mechanism == "aim":
        options["workload"] = 3 if workload is None else workload
        if target is not None:
            options["target"] = target
        if max_model_size is not None:
            options["max_model_size"] = max_model_size
    what = ("SIMULATION: seeded JAX sampler, seed " + str(seed) + "; not a real release"
            if seed is not None else "OpenDP (vetted samplers)")
    with show_stage(f"{mechanism.upper()} on {len(frame)} records at {budget}") as status:

        def report(step: int, info: dict) -> None:
            status(f"{mechanism.upper()} round {step}: {info.get('selected', info.get('stage'))}")

        run = (aim if mechanism == "aim" else mst)(encoded.codes, encoded.domain,
                                                   callback=report, **options)
    num = records if records is not None else len(frame)
    draw_seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    with show_stage(f"{'rounding' if sampling == 'round' else 'sampling'} {num} records × "
                    f"{len(paths)} data set(s)"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnmodelledAttributesWarning)
        frames = iter_synthetic(run.model, num, len(paths), rng_key=draw_seed,
                                categories=encoded.categories, drop_unmodelled=drop_unmodelled,
                                sampling=sampling)
        for frame_out, path in zip(frames, paths, strict=True):
            write_table(frame_out, path)
    for w in caught[:1]:
        warn(str(w.message))
    spent = run.extras["ledger"]
    if keep_ledger:
        save_ledger(ledger, spent)
    console.print(f"{mechanism.upper()}: {len(run.extras['selected'])} selections, "
                  f"{len(run.extras['measurements'])} measurements at {budget} "
                  f"(ρ = {run.extras['rho']:.6g}); sampler: {what}", soft_wrap=True,
                  highlight=False)
    console.print(f"ledger: spent {fmt(spent.spent)} of {fmt(spent.budget)} "
                  f"({spent.currency}), remaining {fmt(spent.remaining)}"
                  + (f"; updated {ledger}" if keep_ledger else ""), soft_wrap=True,
                  highlight=False)
    if len(paths) > 1:
        console.print(f"{len(paths)} data sets drawn from the one fitted model (they share its "
                      "estimation error)", highlight=False)
    console.print("wrote " + (str(paths[0]) if len(paths) == 1 else f"{paths[0]} … {paths[-1]}"),
                  soft_wrap=True, highlight=False)
