"""The ``dpgm`` command line.

``dpgm demo`` and ``dpgm reproduce`` run the bundled demo and the papers' reproductions. The
private-data workflow is three commands, each reading the previous one's file:

``dpgm release`` (records → measurements file), ``dpgm fit`` (measurements → model file),
``dpgm synth`` (model → synthetic CSV/Parquet); ``dpgm bench`` runs the benchmarks of a
source checkout. Bad input ends with a one-line ``error: ...`` on stderr, exit code 2, and no
file written. File formats: :mod:`numpyro_dpgm.io`.

Outputs: no command replaces an existing file unless ``--force`` is given; none ever replaces a
file it reads, nor a measurements or ledger file that records a release (its budget is spent:
losing the file loses the release). Files are written atomically (a temporary file in the same
folder, renamed into place). Messages are printed as plain text (no rich markup), so
``[labels]`` and other brackets show as written.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .estimation import ESTIMATORS

app = typer.Typer(
    help="Differentially private learning of graphical models (numpyro_dpgm).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[labels]" must not be read as markup
)
# markup off: file names, labels and messages print as written, brackets included
console = Console(markup=False)
err_console = Console(stderr=True, soft_wrap=True, markup=False)

#: Exit code of every input error.
INPUT_ERROR = 2

#: The demo's own output folder: the README's demo command rewrites it on every run.
DEMO_OUT = Path("outputs/demo")

#: The ``--force`` option of every command that writes files.
Force = Annotated[bool, typer.Option(
    "--force", help="overwrite existing output files (never a file the command reads, nor a "
    "measurements or ledger file that records a release)")]


def _enable_x64() -> None:
    import numpyro

    numpyro.enable_x64()


def _fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    line = " ".join(str(message).split())
    err_console.print(Text.assemble(("error:", "red"), " ", line), highlight=False)
    raise typer.Exit(INPUT_ERROR)


def _warn(message: str) -> None:
    err_console.print(Text.assemble(("warning:", "yellow"), " ", str(message)), highlight=False)


def _message(err: BaseException) -> str:
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err) or type(err).__name__


@contextmanager
def _input_errors() -> Iterator[None]:
    """Turn the library's input errors into one-line errors with exit code 2."""
    from .privacy.ledger import BudgetExceededError

    try:
        yield
    except (ValueError, TypeError, KeyError, FileNotFoundError, FileExistsError,
            IsADirectoryError, NotADirectoryError, BudgetExceededError) as err:
        _fail(_message(err))


@app.callback()
def main() -> None:
    """Differentially private learning of graphical models."""


@app.command()
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
    from .experiments.demo import run_demo

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


def _check_folder(out: Path, names: tuple[str, ...] | None, force: bool) -> None:
    """An output folder: refuse a file in its place, and without ``--force`` existing files
    among ``names`` (``None``: any file in the folder, whose names the command does not know
    in advance)."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output folder {out} is a file")
    if force or not out.is_dir():
        return
    existing = ([n for n in names if (out / n).exists()] if names is not None
                else sorted(p.name for p in out.iterdir())[:3])
    if existing:
        raise FileExistsError(f"output folder {out} already holds {', '.join(existing)}"
                              f"{' …' if names is None and len(existing) == 3 else ''}; give "
                              "--force to overwrite, or choose another --out")


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
        help="output folder (default outputs/reproduce/EXPERIMENT); it must be new or empty "
             "unless --force")] = None,
    force: Force = False,
) -> None:
    """Reproduce a paper's experiments: CSV tables and PNG figures."""
    import importlib

    if experiment not in EXPERIMENTS:
        _fail(f"unknown experiment {experiment!r}; choose one of {sorted(EXPERIMENTS)}")
    out = out or Path("outputs/reproduce") / experiment
    with _input_errors():
        _check_folder(out, None, force)
    module = importlib.import_module(f".experiments.{experiment}", __package__)
    _enable_x64()
    with _stage(f"reproducing {experiment}{' (quick)' if quick else ''}"):
        written = module.run(out, quick=quick)
    console.print(f"wrote {out}" if written is None else f"wrote {written}")



# ------------------------------------------------------------------------------------------------
# release
# ------------------------------------------------------------------------------------------------
def _read_table(path: Path) -> Any:
    import pandas as pd

    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return pd.read_parquet(path)
    if name.endswith((".csv", ".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz")):
        try:
            return pd.read_csv(path)
        except (pd.errors.ParserError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read {path} as CSV: {err}") from None
    raise ValueError(f"data file {path}: expected a .csv (optionally compressed) or .parquet file")


TABLE_SUFFIXES = (".csv.gz", ".csv", ".parquet", ".pq")


def _write_table(frame: Any, path: Path) -> None:
    """Write a CSV / Parquet file atomically: a temporary file in the same folder (with the same
    suffix, so that pandas picks the same compression), renamed into place; removed on failure."""
    name = path.name.lower()
    suffix = next((s for s in TABLE_SUFFIXES if name.endswith(s)), path.suffix)
    # a fresh name that pandas creates itself (with the usual permissions, unlike mkstemp's)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{suffix}")
    try:
        if name.endswith((".parquet", ".pq")):
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _recorded_release(path: Path) -> str | None:
    """Why ``path`` must never be replaced: it is a measurements or ledger file whose ledger
    records at least one release (the budget is spent; the file is the only copy of what it
    bought). ``None`` for any other file."""
    try:
        with path.open("rb") as f:
            if f.read(64).lstrip()[:1] != b"{":
                return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    kind = doc.get("format")
    ledger = doc.get("ledger")
    entries = ledger.get("entries") if isinstance(ledger, dict) else None
    if kind not in ("numpyro_dpgm.measurements", "numpyro_dpgm.ledger") or not entries:
        return None
    last = entries[-1].get("label", "?") if isinstance(entries[-1], dict) else "?"
    what = "a measurements file" if kind == "numpyro_dpgm.measurements" else "a privacy ledger"
    return (f"it is {what} whose ledger records {len(entries)} release(s) (last: {last}); "
            "their budget is spent and replacing the file would lose them for good, so it is "
            "refused even with --force: write to another file")


def _check_output(path: Path, suffixes: tuple[str, ...] | None = None, *, force: bool = False,
                  inputs: tuple[Path | None, ...] = (), update: bool = False) -> None:
    """Refuse an output path that cannot or must not be written (before anything is read or
    written): a missing folder, a folder, a wrong suffix, a file the command reads (even with
    ``--force``), a file that records a spent release (even with ``--force``), or any other
    existing file without ``--force``. ``update``: the file is read, then written back (the
    ledger of ``dpgm release``); only its folder is checked."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: folder {parent} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder")
    if suffixes is not None and not path.name.lower().endswith(suffixes):
        raise ValueError(f"output {path}: expected a file name ending in {' or '.join(suffixes)}")
    if update:
        return
    for source in inputs:
        if source is not None and _same_file(path, source):
            raise ValueError(f"output {path} is the input file {source}; refusing to overwrite "
                             "what the command reads (even with --force): choose another output")
    if not (path.exists() or path.is_symlink()):
        return
    reason = _recorded_release(path)
    if reason is not None:
        raise ValueError(f"refusing to overwrite {path}: {reason}")
    if not force:
        raise FileExistsError(f"output {path} exists; give --force to overwrite it, or choose "
                              "another output")


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


def _budget(mechanism: str, epsilon: float, delta: float | None) -> Any:
    from .privacy.guarantees import ApproxDP, PureDP

    if not epsilon > 0:
        raise ValueError(f"--epsilon must be positive, got {epsilon}")
    if mechanism in ("laplace", "discrete_laplace"):
        if delta is not None:
            raise ValueError(f"the {mechanism} mechanism is pure ε-DP: drop --delta, or use "
                             "--mechanism gaussian / discrete_gaussian for an (ε, δ) budget")
        return PureDP(epsilon)
    if delta is None:
        raise ValueError(f"the {mechanism} mechanism needs --delta (an (ε, δ) budget, e.g. "
                         "--delta 1e-6)")
    return ApproxDP(epsilon, delta)


def _ledger_for(ledger_path: Path | None, total_budget: float | None, delta: float | None,
                spend: Any) -> tuple[Any, bool]:
    """The ledger to debit and whether it came from (and goes back to) ``ledger_path``."""
    from .io import load_ledger
    from .privacy.guarantees import ApproxDP, PureDP
    from .privacy.ledger import PrivacyLedger

    if ledger_path is None:
        if total_budget is not None:
            raise ValueError("--budget sets the total of a new --ledger file; give --ledger too")
        return PrivacyLedger(spend), False
    if ledger_path.exists():
        if total_budget is not None:
            raise ValueError(f"ledger {ledger_path} exists and has its total budget; drop "
                             "--budget (or use a new ledger file)")
        return load_ledger(ledger_path), True
    if total_budget is None:
        raise ValueError(f"ledger {ledger_path} does not exist; create it by giving its total "
                         "budget with --budget EPSILON")
    if not total_budget > 0:
        raise ValueError(f"--budget must be positive, got {total_budget}")
    total = PureDP(total_budget) if delta is None else ApproxDP(total_budget, delta)
    return PrivacyLedger(total), True


@app.command()
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
    from .encoding import encode, read_domain
    from .io import save_ledger, save_measurements
    from .privacy import release as private_release
    from .privacy import simulate_release

    with _input_errors():
        spend = _budget(mechanism, epsilon, delta)
        clique_list = _parse_cliques(clique or [], cliques)
        _check_output(out, force=force, inputs=(data, domain, cliques, ledger))
        if ledger is not None:
            _check_output(ledger, update=True)
        book, keep_ledger = _ledger_for(ledger, budget, delta, spend)
        frame = _read_table(data)
        if domain is None:
            _warn("no --domain: inferring the domain from the private data discloses which "
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
                _warn(str(w.message))
        total = float(len(frame)) if neighbours in ("replace_one", "replace") else None
        save_measurements(out, meas, encoded.domain, categories=_labelled(encoded),
                          total=total, ledger=book)
        if keep_ledger:
            save_ledger(ledger, book)
    m0 = meas[0].noise
    scale = getattr(m0, "scale", None) or getattr(m0, "sigma", None)
    console.print(f"released {len(meas)} tables of {len(frame)} records with {mechanism} noise "
                  f"({type(m0).__name__} {scale:.6g}) at {spend}; sampler: {sampler}",
                  soft_wrap=True, highlight=False)
    console.print(f"ledger: spent {_fmt(book.spent)} of {_fmt(book.budget)} "
                  f"({book.currency}), remaining {_fmt(book.remaining)}"
                  + (f"; updated {ledger}" if keep_ledger else ""), soft_wrap=True,
                  highlight=False)
    console.print(f"wrote {out}", soft_wrap=True, highlight=False)


def _labelled(encoded: Any) -> dict[str, list[Any]]:
    """Categories worth storing: attributes whose labels are not just their codes."""
    return {a: v for a, v in encoded.categories.items() if v != list(range(len(v)))}


def _fmt(amount: Any) -> str:
    if isinstance(amount, tuple):
        return "(" + ", ".join(f"{a:.6g}" for a in amount) + ")"
    return f"{amount:.6g}"



# ------------------------------------------------------------------------------------------------
# fit
# ------------------------------------------------------------------------------------------------
#: The point estimators come from the estimators' registry; ``nuts`` gives posterior draws.
METHODS = (*ESTIMATORS, "nuts")

#: Estimators that take randomness (``--seed`` gives their ``rng_key``).
STOCHASTIC = ("mcem", "variational-em", "posterior-mean")


def _file_sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


#: Seconds between progress lines when the output is not a terminal.
PROGRESS_EVERY = 10.0


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{seconds:.1f} s"


def _progress_line(text: str) -> None:
    """One plain progress line on stderr (the output is not a terminal: no bars, no spinners)."""
    err_console.print(f"progress: {text}", highlight=False, soft_wrap=True)


@contextmanager
def _stage(description: str) -> Iterator[Callable[[str], None]]:
    """A stage of a command: a spinner on a terminal; elsewhere a line when it starts, a line per
    update (at most every :data:`PROGRESS_EVERY` seconds) and a line with its time when it ends.
    Yields ``update(message)``."""
    if err_console.is_terminal:
        with err_console.status(description) as status:
            yield lambda message: status.update(message)
        return
    start = last = time.perf_counter()
    _progress_line(f"{description} …")

    def update(message: str) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY:
            last = now
            _progress_line(f"{message} ({_elapsed(now - start)})")

    yield update
    _progress_line(f"{description}: done in {_elapsed(time.perf_counter() - start)}")


@contextmanager
def _progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Progress over ``total`` steps: a rich bar on a terminal; elsewhere :func:`_stage`'s lines,
    each with the step, the elapsed time and an estimate of the time left. Yields
    ``advance_to(i)``."""
    if err_console.is_terminal:
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}"
                   + ("" if total is None else f"/{total}")), TimeElapsedColumn()]
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda i: progress.update(task, completed=i)
        return
    start = time.perf_counter()
    with _stage(description) as update:

        def advance_to(i: int) -> None:
            if total is None or i <= 0:
                update(f"{description}: step {i}")
                return
            spent = time.perf_counter() - start
            left = spent * max(total - i, 0) / i
            update(f"{description}: {i}/{total}, about {_elapsed(left)} left")

        yield advance_to


@app.command()
def fit(
    measurements: Annotated[Path, typer.Argument(help="measurements file from `dpgm release`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="model file to write (JSON)")],
    method: Annotated[str, typer.Option(
        help=f"{', '.join(ESTIMATORS)} (point estimates) or nuts (posterior draws of the model "
             "given the noisy tables, for `dpgm synth --posterior`)")] = "cgm-em",
    iters: Annotated[int | None, typer.Option(
        help="iterations: the estimator's max_iters (EM iterations for cgm-em, default 10, a "
             "regulariser; mcem and variational-em, default 10; mirror-descent iterations for "
             "prox-pgm, default 1000; L-BFGS iterations for naive, default 1000; SVI steps for "
             "posterior-mean, default 2000), NUTS draws per chain for nuts (default 500, after "
             "as many warm-up steps)")] = None,
    chains: Annotated[int, typer.Option(help="NUTS chains (nuts only)")] = 2,
    seed: Annotated[int, typer.Option(
        help="seed of the stochastic methods (nuts, mcem, variational-em, "
             "posterior-mean)")] = 0,
    total: Annotated[float | None, typer.Option(
        help="number of records N if public (default: the file's, else estimated from the "
             "noisy tables, which costs no privacy)")] = None,
    force: Force = False,
) -> None:
    """Fit a graphical model over the released cliques: writes a model file."""
    from .io import load_measurements, save_model
    from .measurements import estimate_total
    from .network import MarkovNetwork

    with _input_errors():
        if method not in METHODS:
            raise ValueError(f"unknown --method {method!r}; choose one of {list(METHODS)} (the "
                             "estimators' registry, numpyro_dpgm.estimation.ESTIMATORS, and nuts)")
        if iters is not None and iters < 1:
            raise ValueError(f"--iters must be at least 1, got {iters}")
        if total is not None and not total > 0:
            raise ValueError(f"--total must be positive, got {total}")
        if chains < 1:
            raise ValueError(f"--chains must be at least 1, got {chains}")
        _check_output(out, force=force, inputs=(measurements,))
        saved = load_measurements(measurements)
        cliques = list(dict.fromkeys(m.clique for m in saved.measurements))
        if not cliques:
            raise ValueError(f"{measurements} holds no measurements")
        measured = [a for a in saved.domain.attrs if any(a in c for c in cliques)]
        network = MarkovNetwork(saved.domain.project(measured), cliques)
        unmeasured = [a for a in saved.domain.attrs if a not in measured]
        n_source = "given" if total is not None else ("public" if saved.total else "estimated")
        n = total or saved.total or float(estimate_total(saved.measurements))
        _enable_x64()
        t0 = time.perf_counter()
        if method == "nuts":
            result, options = _run_nuts(saved.measurements, network, n, iters or 500, chains,
                                        seed)
        else:
            # an estimated N is the estimator's own (rounded where latent counts need an integer)
            result, options = _run_fit(method, saved.measurements, network,
                                       None if n_source == "estimated" else n, iters, seed)
            n = float(result.extras["total_count"])
        elapsed = time.perf_counter() - t0
        provenance = {
            "estimator": "run_nuts" if method == "nuts" else ESTIMATORS[method].__name__,
            "options": options,
            "total": n,
            "total_source": n_source,
            "measurements_file": str(measurements),
            "measurements_sha256": _file_sha256(measurements),
            "privacy": None if saved.ledger is None else saved.ledger.guarantee(),
        }
        # the whole domain goes into the model file: attributes in no released table have no
        # parameters there, and `dpgm synth` draws them uniformly (or drops them on request)
        save_model(out, result, categories=saved.categories, total=n, provenance=provenance,
                   domain=saved.domain)
    if method == "nuts":
        summary = (f"{options['draws']} posterior draws ({chains} chain(s)), worst split R-hat "
                   f"{options['max_rhat']:.3f}, {options['divergences']} divergences")
    else:
        summary = (f"{result.iterations} iterations, "
                   f"{'converged' if result.converged else 'iteration limit reached'}")
    console.print(f"fitted {method} on {len(saved.measurements)} tables "
                  f"({network.num_params} parameters, N = {n:.6g} {n_source}): "
                  f"{summary}, {elapsed:.2f} s", soft_wrap=True, highlight=False)
    if unmeasured:
        console.print(f"attributes in no released table are not modelled: {unmeasured}; the "
                      "model file keeps them, and `dpgm synth` draws them uniformly over their "
                      "values (--drop-unmodelled leaves them out)",
                      soft_wrap=True, highlight=False)
    console.print(f"wrote {out}", soft_wrap=True, highlight=False)


def _run_nuts(measurements: list[Any], network: Any, total: float, draws: int, chains: int,
              seed: int) -> tuple[Any, dict[str, Any]]:
    """Posterior draws of the record model (:func:`numpyro_dpgm.infer.bayes.run_nuts`) as one
    batched MarkovRandomField, with the convergence figures the provenance keeps."""
    import jax
    import numpy as np
    from numpyro.diagnostics import split_gelman_rubin

    from .estimation.cgm_em import em_start
    from .infer.bayes import noisy_marginals_model, run_nuts
    from .synthesis import posterior_models

    bayes = noisy_marginals_model(network, measurements, int(round(total)),
                                  triangulate=not network.is_decomposable)
    with _stage(f"NUTS: {chains} chain(s) × ({draws} warm-up + {draws} draws)"):
        mcmc = run_nuts(bayes, jax.random.key(seed), num_warmup=draws, num_samples=draws,
                        num_chains=chains, init=em_start(bayes))
    phi = np.asarray(mcmc.get_samples(group_by_chain=True)["phi"])
    rhat = float(np.max(split_gelman_rubin(phi))) if phi.shape[1] > 3 else float("nan")
    divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    options = {"draws": draws * chains, "warmup": draws, "chains": chains, "seed": seed,
               "max_rhat": rhat, "divergences": divergences}
    return posterior_models(mcmc, network), options


def _run_fit(method: str, measurements: list[Any], network: Any, total: float | None,
             iters: int | None, seed: int) -> tuple[Any, dict[str, Any]]:
    """The registered estimator ``method`` with the contract's options: ``--iters`` is its
    ``max_iters`` (its own default when not given), progress comes through ``callback``."""
    import inspect

    import jax

    estimator = ESTIMATORS[method]
    limit = iters or inspect.signature(estimator).parameters["max_iters"].default
    options: dict[str, Any] = {"max_iters": limit}
    if method in STOCHASTIC:
        options["seed"] = seed
    with _progress(method, limit) as advance:
        result = estimator(measurements, network, total_count=total, rng_key=jax.random.key(seed),
                           max_iters=limit, callback=lambda i, _loss: advance(int(i)))
    return result, options


# ------------------------------------------------------------------------------------------------
# synth
# ------------------------------------------------------------------------------------------------
@app.command()
def synth(
    model: Annotated[Path, typer.Argument(help="model file from `dpgm fit`")],
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
    force: Force = False,
) -> None:
    """Draw synthetic records from a fitted model, with the original column names and labels.

    Attributes of the data in no released table are kept, drawn uniformly over their values
    (the maximum-entropy choice given no measurement of them), with a warning naming them.
    """
    import warnings

    from .io import load_model
    from .synthesis import UnmodelledAttributesWarning, iter_synthetic, unmodelled_attributes

    with _input_errors():
        if records is not None and records < 1:
            raise ValueError(f"--records must be a positive integer, got {records}")
        if datasets < 1:
            raise ValueError(f"--datasets must be a positive integer, got {datasets}")
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
            _check_output(path, force=force, inputs=(model,))
        _enable_x64()
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
            _warn(f"attribute(s) {free} are in no released table: drawn uniformly over their "
                  "values, independently of the other attributes (the maximum-entropy choice "
                  "given no measurement of them); --drop-unmodelled leaves them out")
        with _stage(f"sampling {num} records"
                    + (f" × {datasets} data sets" if posterior else "")) as status, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", UnmodelledAttributesWarning)  # said above
            # one data set in memory at a time: drawn, written, dropped
            frames = iter_synthetic(saved.model, num, len(paths), rng=seed,
                                    categories=saved.categories, drop_unmodelled=drop_unmodelled)
            for i, (frame, path) in enumerate(zip(frames, paths, strict=True)):
                status(f"sampling {num} records: data set {i + 1} of {len(paths)}")
                _write_table(frame, path)
                width = frame.shape[1]
    console.print(f"sampled {len(paths)} data set(s) of {num} records and {width} "
                  f"columns (seed {seed})", highlight=False)
    console.print("wrote " + (str(paths[0]) if len(paths) == 1 else f"{paths[0]} … {paths[-1]}"),
                  soft_wrap=True, highlight=False)


def _numbered(path: Path, i: int, m: int) -> Path:
    """``synth.csv`` -> ``synth-01.csv`` (zero-padded to the width of ``m``)."""
    name = path.name
    suffix = next(s for s in TABLE_SUFFIXES if name.lower().endswith(s))
    return path.with_name(f"{name[: -len(suffix)]}-{i:0{len(str(m))}d}{suffix}")


# ------------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------------
def _source_root() -> Path:
    return Path(__file__).resolve().parents[1]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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


if __name__ == "__main__":  # pragma: no cover
    app()
