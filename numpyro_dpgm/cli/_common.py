"""Shared plumbing of the ``dpgm`` commands: one-line input errors, float64, record tables in
and out, checks of output paths, privacy budgets and ledgers."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

# markup off: file names, labels and messages print as written, brackets included
console = Console(markup=False)
err_console = Console(stderr=True, soft_wrap=True, markup=False)

#: Exit code of every input error.
INPUT_ERROR = 2

#: The ``--force`` option of every command that writes files.
Force = Annotated[bool, typer.Option(
    "--force", help="overwrite existing output files (never a file the command reads, nor a "
    "measurements or ledger file that records a release)")]


def enable_x64() -> None:
    import numpyro

    numpyro.enable_x64()


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    line = " ".join(str(message).split())
    err_console.print(Text.assemble(("error:", "red"), " ", line), highlight=False)
    raise typer.Exit(INPUT_ERROR)


def warn(message: str) -> None:
    err_console.print(Text.assemble(("warning:", "yellow"), " ", str(message)), highlight=False)


def warnings_as_lines() -> Callable[[], None]:
    """Show Python warnings as ``warning: ...`` lines on stderr (as the commands' own); returns
    the function that puts the previous display back."""
    import warnings

    previous = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        warn(" ".join(str(message).split()))

    warnings.showwarning = show

    def restore() -> None:
        warnings.showwarning = previous

    return restore


def _message(err: BaseException) -> str:
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err) or type(err).__name__


@contextmanager
def input_errors() -> Iterator[None]:
    """Turn the library's input errors into one-line errors with exit code 2."""
    from ..privacy.ledger import BudgetExceededError

    try:
        yield
    except (ValueError, TypeError, KeyError, FileNotFoundError, FileExistsError,
            IsADirectoryError, NotADirectoryError, BudgetExceededError) as err:
        fail(_message(err))


def read_table(path: Path) -> Any:
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


class TableWriter:
    """A CSV / Parquet file written chunk by chunk and put in place atomically.

    The chunks go to a temporary file in the same folder (with the output's suffix, so that a
    ``.csv.gz`` is compressed); :meth:`commit` renames it into place, :meth:`discard` removes it.
    Memory is one chunk, whatever the file's size.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        name = path.name.lower()
        suffix = next((s for s in TABLE_SUFFIXES if name.endswith(s)), path.suffix)
        self.parquet = name.endswith((".parquet", ".pq"))
        # a fresh name, created with the usual permissions (unlike mkstemp's)
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{suffix}")
        self._sink: Any = None

    def write(self, frame: Any) -> None:
        """Append the rows of a DataFrame (the first chunk fixes the columns)."""
        if self.parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._sink is None:
                self._sink = pq.ParquetWriter(self.tmp, table.schema)
            self._sink.write_table(table)
        else:
            if self._sink is None:
                self._sink = _open_text(self.tmp)
                frame.to_csv(self._sink, index=False)
            else:
                frame.to_csv(self._sink, index=False, header=False)

    def commit(self) -> None:
        """Close the temporary file and rename it into place."""
        self._sink.close()
        self._sink = None
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        """Close and remove the temporary file (after a failure)."""
        if self._sink is not None:
            try:
                self._sink.close()
            finally:
                self._sink = None
        Path(self.tmp).unlink(missing_ok=True)


def _open_text(path: Path) -> Any:
    """A text handle for CSV, gzip-compressed for ``.gz``."""
    if path.name.lower().endswith(".gz"):
        import gzip

        return gzip.open(path, "wt", encoding="utf-8", newline="")
    return open(path, "w", encoding="utf-8", newline="")


@contextmanager
def _table_writer(path: Path) -> Iterator[TableWriter]:
    """A :class:`TableWriter` committed when the block ends and discarded if it raises."""
    writer = TableWriter(path)
    try:
        yield writer
        writer.commit()
    except BaseException:
        writer.discard()
        raise


def write_table(frame: Any, path: Path) -> None:
    """Write a CSV / Parquet file atomically (see :class:`TableWriter`)."""
    with _table_writer(path) as writer:
        writer.write(frame)


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


def check_output(path: Path, suffixes: tuple[str, ...] | None = None, *, force: bool = False,
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


def check_folder(out: Path, names: tuple[str, ...] | None, force: bool) -> None:
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


def release_budget(mechanism: str, epsilon: float, delta: float | None) -> Any:
    from ..privacy.guarantees import ApproxDP, PureDP

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


def ledger_for(ledger_path: Path | None, total_budget: float | None, delta: float | None,
               spend: Any) -> tuple[Any, bool]:
    """The ledger to debit and whether it came from (and goes back to) ``ledger_path``."""
    from ..io import load_ledger
    from ..privacy.guarantees import ApproxDP, PureDP
    from ..privacy.ledger import PrivacyLedger

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


def labelled(encoded: Any) -> dict[str, list[Any]]:
    """Categories worth storing: attributes whose labels are not just their codes."""
    return {a: v for a, v in encoded.categories.items() if v != list(range(len(v)))}


def fmt(amount: Any) -> str:
    if isinstance(amount, tuple):
        return "(" + ", ".join(f"{a:.6g}" for a in amount) + ")"
    return f"{amount:.6g}"
