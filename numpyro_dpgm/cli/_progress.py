"""Progress of the ``dpgm`` commands on stderr: spinners and bars on a terminal, plain
``progress:`` lines elsewhere (a pipe, a log file)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ._common import err_console

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
