"""What every benchmark shares: the machine, the load, the results on disk, the timing.

- :func:`machine` and :func:`platform_summary` describe where a run happened;
  :func:`load_average` and :func:`load_1min` read the load at a point of the run;
- :func:`new_record` starts a run's JSON record (benchmark, command, date, machine, settings,
  load at the start);
- :func:`write_results` writes ``NAME.json`` (with :func:`json_default` for numpy scalars) and
  ``NAME.csv`` (:func:`write_csv`);
- :func:`timed` times one call to its end (``jax.block_until_ready``), so a first call
  (tracing and compilation) is timed apart from later ones; :func:`interleaved` times later
  calls of several contenders in rounds; :func:`summary_ms` sums up per-call times;
- :func:`add_out_argument` is the ``--out`` option of every benchmark.

JAX is imported only by the functions that need it, so that a benchmark whose parent process
only starts children (``synth_memory``) does not load it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import Any

import numpy as np

__all__ = [
    "VERSIONS",
    "add_out_argument",
    "interleaved",
    "json_default",
    "load_1min",
    "load_average",
    "machine",
    "new_record",
    "platform_summary",
    "summary_ms",
    "timed",
    "write_csv",
    "write_results",
]

#: Packages whose versions :func:`machine` records.
VERSIONS = ("numpyro_dpgm", "mbi", "jax", "jaxlib", "numpyro", "numpy", "opt_einsum")

#: Where results go unless ``--out`` says otherwise.
DEFAULT_OUT = Path("bench-results")


# ------------------------------------------------------------------------------------------------
# The machine and its load
# ------------------------------------------------------------------------------------------------
def _cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        return names[0] if names else cpu
    except OSError:
        return cpu


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemTotal:"):
                    return round(int(ln.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """The machine a run happens on: CPU, cores, memory, OS, Python, JAX devices, versions.

    Returns
    -------
    dict
        ``cpu``, ``logical_cores``, ``memory_gib`` (``None`` where ``/proc/meminfo`` is
        missing), ``os``, ``python``, ``jax_backend``, ``jax_devices`` and ``versions`` (of
        :data:`VERSIONS`, ``None`` for those not installed).
    """
    import jax

    versions = {}
    for pkg in VERSIONS:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu": _cpu_name(), "logical_cores": os.cpu_count(), "memory_gib": _memory_gib(),
        "os": platform.platform(), "python": platform.python_version(),
        "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
        "versions": versions,
    }


def platform_summary() -> dict[str, Any]:
    """The short machine description of a run's ``meta``: platform, processor, JAX, devices.

    Returns
    -------
    dict
        ``machine`` (``platform.platform()``), ``processor``, ``jax`` (its version) and
        ``devices``.
    """
    import jax

    return {"machine": platform.platform(), "processor": platform.processor(),
            "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, to two decimals.

    Returns
    -------
    list of float or None
        ``None`` where the system has no load average.

    Examples
    --------
    >>> load = load_average()
    >>> load is None or (len(load) == 3 and min(load) >= 0)
    True
    """
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def load_1min() -> float:
    """The 1 minute load average, to two decimals (NaN where the system has none).

    Returns
    -------
    float
    """
    load = load_average()
    return math.nan if load is None else load[0]


# ------------------------------------------------------------------------------------------------
# Results on disk
# ------------------------------------------------------------------------------------------------
def json_default(x: Any) -> Any:
    """``json.dump``'s ``default``: numpy integers and floats as Python numbers.

    A float that is not finite becomes its string (``"nan"``, ``"inf"``), as JSON has no such
    numbers. (``numpy.float64`` is a Python float, which the encoder writes itself.)

    Parameters
    ----------
    x : object
        What the JSON encoder cannot write by itself.

    Returns
    -------
    int, float or str

    Raises
    ------
    TypeError
        For anything else.

    Examples
    --------
    >>> json.dumps([np.int64(3), np.float32(0.5), np.float32("inf"), PurePath("out")],
    ...            default=json_default)
    '[3, 0.5, "inf", "out"]'
    """
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x) if math.isfinite(x) else str(x)
    if isinstance(x, PurePath):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` as a CSV table; the columns are every key in order of first appearance.

    Parameters
    ----------
    path : Path
        The file (replaced if it exists).
    rows : sequence of dict
        One dict per row; a row without a key leaves its cell empty.
    """
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def write_results(out: Path, name: str, record: dict[str, Any],
                  rows: Sequence[dict[str, Any]] | None = None, indent: int = 1) -> list[Path]:
    """Write a run's record to ``out/NAME.json`` and its rows, if any, to ``out/NAME.csv``.

    Parameters
    ----------
    out : Path
        The output folder (made if missing).
    name : str
        The files' stem, e.g. ``"oracle"`` or ``"synth_memory-cpu"``.
    record : dict
        The JSON document (numpy scalars are written by :func:`json_default`).
    rows : sequence of dict, optional
        The CSV table (:func:`write_csv`); nothing is written when it is empty or ``None``.
    indent : int
        JSON indentation.

    Returns
    -------
    list of Path
        The files written.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json"]
    with open(paths[0], "w") as f:
        json.dump(record, f, indent=indent, default=json_default)
    if rows:
        paths.append(out / f"{name}.csv")
        write_csv(paths[1], rows)
    return paths


def new_record(name: str, settings: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The start of a run's JSON record, taken when the run starts.

    Parameters
    ----------
    name : str
        The benchmark's name.
    settings : dict
        The run's settings.
    **fields
        Further entries, after the common ones (e.g. ``workloads={}``).

    Returns
    -------
    dict
        ``benchmark``, ``command`` (``python -m benchmarks NAME`` and the options given),
        ``date_utc``, ``machine`` (:func:`machine`), ``settings``, ``load_average_start``
        (:func:`load_average`), then ``fields``.
    """
    return {
        "benchmark": name,
        "command": f"python -m benchmarks {name} " + " ".join(sys.argv[2:]),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": settings,
        "load_average_start": load_average(),
        **fields,
    }


def add_out_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """The ``--out`` option: the folder of ``NAME.json`` and ``NAME.csv``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    name : str
        The results' file stem, for the help text.
    """
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output folder for {name}.json and {name}.csv (default "
                             "%(default)s)")


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call of ``fn`` to the end of its computation, and its result.

    The first call of a compiled function includes its tracing and compilation; time it with
    this, then the later calls (:func:`interleaved`).

    Parameters
    ----------
    fn : callable
        Without arguments; its result is waited for with ``jax.block_until_ready``.

    Returns
    -------
    (float, object)
    """
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - t0, out


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Median, minimum and quartiles, in milliseconds, of per-call times.

    Parameters
    ----------
    seconds : sequence of float
        At least one time.

    Returns
    -------
    dict
        ``median_ms``, ``min_ms``, ``q1_ms``, ``q3_ms`` (the median for a single time) and
        ``repeats``.

    Examples
    --------
    >>> summary_ms([0.004, 0.001, 0.002, 0.003])
    {'median_ms': 2.5, 'min_ms': 1.0, 'q1_ms': 1.25, 'q3_ms': 3.75, 'repeats': 4}
    """
    ms = sorted(t * 1e3 for t in seconds)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "q1_ms": q[0], "q3_ms": q[2],
            "repeats": len(ms)}


def interleaved(contenders: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict]:
    """Time every contender ``repeats`` times, one call of each per round, after a warm call.

    Rounds spread the load of other processes over all contenders alike. Every call is waited
    for with ``jax.block_until_ready``.

    Parameters
    ----------
    contenders : dict of str to callable
        Calls without arguments, by name.
    repeats : int
        Timed calls of each.

    Returns
    -------
    dict of str to dict
        :func:`summary_ms` of each contender's calls.
    """
    import jax

    for fn in contenders.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: summary_ms(ts) for name, ts in times.items()}


def l1_error(tables: dict[Any, np.ndarray], truth: dict[Any, np.ndarray], total: float) -> float:
    """Mean over the cliques of ``‖μ̂_C − n_C‖₁/N``: fitted count tables ``tables`` against the
    true ones ``truth`` (each reshaped to the truth's shape), ``N = total``.

    >>> l1_error({"c": np.array([3.0, 1.0])}, {"c": np.array([2.0, 2.0])}, 4.0)
    0.5
    """
    return float(np.mean([np.abs(np.reshape(tables[c], t.shape) - t).sum() / total
                          for c, t in truth.items()]))
