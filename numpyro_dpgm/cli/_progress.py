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
def show_stage(description: str) -> Iterator[Callable[[str], None]]:
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
def show_progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Progress over ``total`` steps: a rich bar on a terminal; elsewhere :func:`show_stage`'s
    lines, each with the step, the elapsed time and an estimate of the time left. Yields
    ``advance_to(i)``."""
    if err_console.is_terminal:
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}"
                   + ("" if total is None else f"/{total}")), TimeElapsedColumn()]
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda i: progress.update(task, completed=i)
        return
    start = time.perf_counter()
    with show_stage(description) as update:

        def advance_to(i: int) -> None:
            if total is None or i <= 0:
                update(f"{description}: step {i}")
                return
            spent = time.perf_counter() - start
            left = spent * max(total - i, 0) / i
            update(f"{description}: {i}/{total}, about {_elapsed(left)} left")

        yield advance_to


class _StepLines:
    """Stands in for ``tqdm.trange`` in :func:`numpyro.util.fori_collect`: the same iteration,
    reported as ``advance_to(step, phase)`` instead of a bar, the step counted within its phase
    (NumPyro labels each step ``warmup`` or ``sample`` after it runs)."""

    def __init__(self, advance_to: Callable[[int, str], None]) -> None:
        self._advance_to = advance_to

    def trange(self, upper: int, **_: object) -> _StepLines:
        self._upper, self._phase = upper, ""
        return self

    def __enter__(self) -> _StepLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> Iterator[int]:
        phase, start = None, 0
        for i in range(self._upper):
            yield i
            if self._phase != phase:
                phase, start = self._phase, i
            self._advance_to(i - start + 1, phase)

    def set_description(self, text: str, refresh: bool = False) -> None:
        self._phase = text.strip()

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        return None


class _ChainLines:
    """Stands in for ``tqdm.auto.tqdm`` in NumPyro's progress of chains run in parallel
    (:func:`numpyro.util.progress_bar_factory`, one bar per chain, updated from the devices):
    each chain's steps, warm-up and draws together, reported as ``advance_to(chain, step,
    total)``."""

    def __init__(self, advance_to: Callable[[int, int, int], None]) -> None:
        self._advance_to = advance_to

    def __call__(self, iterable: range, position: int = 0, **_: object) -> _ChainLines._Bar:
        return self._Bar(self._advance_to, len(iterable), position)

    class _Bar:
        def __init__(self, advance_to: Callable[[int, int, int], None], total: int,
                     chain: int) -> None:
            self._advance_to, self._total, self._chain, self._done = advance_to, total, chain, 0

        def update(self, steps: int) -> None:
            self._done += int(steps)
            self._advance_to(self._chain, self._done, self._total)

        def set_description(self, text: str, refresh: bool = False) -> None:
            return None

        def close(self) -> None:
            return None


@contextmanager
def mcmc_progress(description: str) -> Iterator[bool]:
    """Progress of NumPyro's MCMC: yields the ``progress_bar`` argument to give it. On a terminal
    NumPyro's own bars (``True``); elsewhere ``progress:`` lines (:func:`show_stage`) with the
    chain's phase and step, fed by NumPyro's per-step loop in place of its bar (chains one after
    another) or by its per-chain bars (chains in parallel); where these are not found (another
    NumPyro) or NumPyro turns them off (it does when the environment has ``CI`` or
    ``PYTEST_XDIST_WORKER``), the lines of the stage's start and end only."""
    if err_console.is_terminal:
        err_console.print(description, highlight=False, soft_wrap=True)
        yield True
        return
    import numpyro.util

    with show_stage(description) as update:
        if not (hasattr(getattr(numpyro.util, "tqdm", None), "trange")
                and hasattr(numpyro.util, "tqdm_auto")):
            yield False
            return
        originals = numpyro.util.tqdm, numpyro.util.tqdm_auto
        numpyro.util.tqdm = _StepLines(lambda i, phase: update(f"{description}: {phase} step {i}"))
        numpyro.util.tqdm_auto = _ChainLines(
            lambda chain, i, total: update(f"{description}: chain {chain}, step {i} of {total}"))
        try:
            yield True
        finally:
            numpyro.util.tqdm, numpyro.util.tqdm_auto = originals
