"""Chains in worker processes, one per core, that meet where a run needs all its chains.

On a CPU one process stepping its chains one after another leaves half a core's worth of
gradients unused: XLA's runtime spreads the small operations of one density evaluation over the
cores and waits on them (``python -m benchmarks cores``: on Adult's 842-cell tree, 260–357
gradients per second in one process on both cores, 710–775 with a process pinned to each
core). :func:`run_nuts`'s ``chain_method="processes"`` therefore runs its chains on a *team*:
the calling process (the *leader*, pinned to its first core for the run) runs its share of the
chains, and a fresh interpreter per further core (a *member*, pinned to that core) runs the
rest, each with the same model, options and deadline and a key of its own. The processes meet
at the points where a run needs every chain:

- :meth:`Leader.pool`: the pilot's draws (``metric="pilot"``), pooled so that each process fits
  the same map to the draws of all chains;
- :meth:`Leader.converged`: before each further batch of ``time_limit``, the convergence
  figures of all chains, which decide for every process whether to draw on;
- :meth:`Leader.join`: at the end, the members' draws join the leader's run as further chains
  (each cut to the fewest draws any process holds), so ``get_samples``, the checks and ArviZ
  see one run.

The model, its arguments and the run's options travel to the members by ``cloudpickle``, so a
model written in a notebook or a script's ``__main__`` runs there too; a member started with
``python -c`` imports no ``__main__`` of the caller. A member that fails sends its traceback,
which the leader raises as a :class:`TeamError`; the leader ends its members when it leaves
the run, failed or not; a member's warnings are silenced (the leader warns, over every chain).
:func:`current` is the team of the run in progress (``None`` outside a team's run): the points
above are no-ops without one.

Not the default, because it does not yet pay: every process computes the Laplace metric's mode
and compiles the sampler itself, on one core, where one process does both once on every core;
on Adult's 842-cell release with ``time_limit=600`` that set-up took about a third of the
limit in each process, and the run ended further from convergence than one process's. With
the compilation cached, one process still led: a chain's step of the collapsed kernel in a
pinned process gave about 1.4 times one process's, not the gradient loop's 2.2–2.7, and the
calling process, pinned after JAX had started, stepped at about half a member's pace
(``docs/measurements.md``, "Chains on a team of processes").
"""

from __future__ import annotations

import contextvars
import os
import pickle
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

__all__ = ["SHARED_SETTINGS", "Leader", "Member", "TeamError", "chain_shares", "current", "lead",
           "team_cores"]

_CURRENT: contextvars.ContextVar[Leader | Member | None] = contextvars.ContextVar(
    "numpyro_dpgm_team", default=None)

#: Seconds between the leader's checks that a member it waits for is still alive.
POLL_SECONDS = 1.0


class TeamError(RuntimeError):
    """A member process of a team failed, or ended without its draws."""


def current() -> Leader | Member | None:
    """The team of the run in progress in this process, or ``None``."""
    return _CURRENT.get()


def team_cores() -> list[int]:
    """The cores this process may run on (``os.sched_getaffinity``); a ``ValueError`` where
    the platform cannot pin a process to a core."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("chain_method='processes' pins a process to each core, which this "
                         f"platform ({sys.platform}) does not support; use 'sequential'")
    return sorted(os.sched_getaffinity(0))


def chain_shares(num_chains: int, processes: int) -> list[int]:
    """The chains of each of ``processes`` processes, the leader's first, as even as can be.

    >>> chain_shares(4, 2), chain_shares(5, 2), chain_shares(2, 4)
    ([2, 2], [3, 2], [1, 1])
    """
    processes = max(1, min(int(processes), int(num_chains)))
    base, extra = divmod(int(num_chains), processes)
    return [base + (i < extra) for i in range(processes)]


def _merge_chains(parts: Sequence[Any]) -> Any:
    """Draws grouped by chain (pytrees of ``(chains, draws, ...)`` arrays, one per process),
    cut to the fewest draws any holds and joined along the chain axis."""
    import jax

    draws = min(int(jax.tree.leaves(p)[0].shape[1]) for p in parts)
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x)[:, :draws] for x in xs]),
                        *parts)


class Leader:
    """The calling process's side of a team: it waits for its members at each meeting point
    and answers them. Made by :func:`lead`."""

    def __init__(self, members: list[tuple[subprocess.Popen, Connection]]) -> None:
        self._members = members
        self._ended: dict[int, Any] = {}  # member index -> its final message's payload

    @property
    def size(self) -> int:
        """Processes in the team, the leader included."""
        return len(self._members) + 1

    def _recv(self, i: int) -> tuple:
        proc, conn = self._members[i]
        while not conn.poll(POLL_SECONDS):
            if proc.poll() is not None:
                raise TeamError(f"worker process {i + 1} ended (exit code {proc.returncode}) "
                                "without its draws; its error is on its standard error")
        try:
            message = conn.recv()
        except EOFError:
            raise TeamError(f"worker process {i + 1} closed its connection without its "
                            "draws") from None
        if message[0] == "error":
            raise TeamError(f"worker process {i + 1} failed:\n{message[1]}")
        return message

    def pool(self, draws: np.ndarray) -> np.ndarray:
        """The pilot's ``draws`` (rows of flattened parameters) of every process, the leader's
        first; every member gets the same."""
        parts = [np.asarray(draws)]
        for i in range(len(self._members)):
            kind, part = self._recv(i)
            if kind != "pilot":
                raise TeamError(f"worker process {i + 1} sent {kind!r} where the pilot's "
                                "draws were due")
            parts.append(part)
        pooled = np.concatenate(parts)
        for _, conn in self._members:
            conn.send(pooled)
        return pooled

    def converged(self, draws: Any, decide: Callable[[Any], bool]) -> bool:
        """Whether the run has converged: ``decide`` of every process's ``draws`` (grouped by
        chain) joined, told to every member; true, without ``decide``, where some member has
        already stopped drawing."""
        checking = []
        for i in range(len(self._members)):
            if i in self._ended:
                continue
            message = self._recv(i)
            if message[0] == "end":
                self._ended[i] = message[1]
            else:
                checking.append((i, message[1]))
        if len(checking) < len(self._members):
            verdict = True
        else:
            verdict = bool(decide(_merge_chains([draws] + [d for _, d in checking])))
        for i, _ in checking:
            self._members[i][1].send(verdict)
        return verdict

    def join(self, states: Any) -> tuple[Any, list[dict]]:
        """``(states, notes)``: the run's ``states`` (NumPyro's draws and fields grouped by
        chain) with every member's chains after the leader's, and each member's notes (its
        warm-up steps and the like), once every member has stopped drawing."""
        for i in range(len(self._members)):
            while i not in self._ended:
                message = self._recv(i)
                if message[0] == "end":
                    self._ended[i] = message[1]
                else:  # a member asking whether to draw on: no, the leader has stopped
                    self._members[i][1].send(True)
        ended = [self._ended[i] for i in range(len(self._members))]
        return _merge_chains([states] + [e["states"] for e in ended]), [e["notes"] for e in ended]


class Member:
    """A member process's side of a team: it sends its part at each meeting point and takes
    the leader's answer."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def pool(self, draws: np.ndarray) -> np.ndarray:
        self._conn.send(("pilot", np.asarray(draws)))
        return self._conn.recv()

    def converged(self, draws: Any, decide: Callable[[Any], bool]) -> bool:
        self._conn.send(("check", draws))
        return bool(self._conn.recv())

    def join(self, states: Any, notes: dict | None = None) -> None:
        self._conn.send(("end", {"states": states, "notes": dict(notes or {})}))


def _start(core: int, job: bytes) -> tuple[subprocess.Popen, Connection]:
    """A member process pinned to ``core``, connected by a socket pair, sent ``job``."""
    ours, theirs = socket.socketpair()
    code = (f"import os; os.sched_setaffinity(0, {{{int(core)}}}); "
            "from numpyro_dpgm.infer.bayes.team import _member; "
            f"_member({theirs.fileno()})")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                            stdin=subprocess.DEVNULL)
    theirs.close()
    conn = Connection(ours.detach())
    conn.send_bytes(job)
    return proc, conn


#: The JAX settings a member takes from the caller: 64-bit values, and the persistent
#: compilation cache (so that a member loads what an earlier run compiled).
SHARED_SETTINGS = ("jax_enable_x64", "jax_compilation_cache_dir",
                   "jax_persistent_cache_min_compile_time_secs",
                   "jax_persistent_cache_min_entry_size_bytes")


def _job(run: Callable[..., Any]) -> bytes:
    """What a member is sent: the caller's module path, :data:`SHARED_SETTINGS` and ``run``."""
    import cloudpickle
    import jax

    return pickle.dumps({"path": list(sys.path),
                         "settings": {k: getattr(jax.config, k) for k in SHARED_SETTINGS},
                         "run": cloudpickle.dumps(run)})


@contextmanager
def lead(runs: Sequence[Callable[[], Any]]) -> Iterator[Leader]:
    """A team of this process and one member per entry of ``runs`` (each a call of no
    arguments that runs the member's share, shipped by ``cloudpickle``, in a JAX with this
    process's :data:`SHARED_SETTINGS`), the leader pinned to the first of :func:`team_cores`
    and member ``i`` to the ``i + 1``-th while the block runs (the leader's cores restored
    after)."""
    cores = team_cores()
    if len(runs) >= len(cores):
        raise ValueError(f"a team of {len(runs) + 1} processes needs as many cores; this "
                         f"process may run on {len(cores)}")
    members, token, pinned = [], None, False
    try:
        for i, run in enumerate(runs):
            members.append(_start(cores[i + 1], _job(run)))
        os.sched_setaffinity(0, {cores[0]})
        pinned = True
        leader = Leader(members)
        token = _CURRENT.set(leader)
        yield leader
    finally:
        if token is not None:
            _CURRENT.reset(token)
        if pinned:
            os.sched_setaffinity(0, set(cores))
        for proc, conn in members:
            conn.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _member(fd: int) -> None:
    """A member process's main: take the job from the leader, run it as a team member, send
    the traceback where it fails."""
    conn = Connection(fd)
    try:
        job = pickle.loads(conn.recv_bytes())
        sys.path[:] = job["path"]  # where the caller found the modules its model comes from
        import jax

        for name, value in job["settings"].items():
            if value is not None:
                jax.config.update(name, value)
        run = pickle.loads(job["run"])  # cloudpickle's output loads with pickle
        warnings.simplefilter("ignore")  # the leader warns, over every chain
        token = _CURRENT.set(Member(conn))
        try:
            run()
        finally:
            _CURRENT.reset(token)
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None
    finally:
        conn.close()


def deadline_in(seconds_left: float | None) -> float | None:
    """A deadline ``seconds_left`` from now as wall-clock time (comparable across processes),
    for :func:`seconds_to`."""
    return None if seconds_left is None else time.time() + float(seconds_left)


def seconds_to(wall_deadline: float | None) -> float | None:
    """The seconds left to a wall-clock deadline of :func:`deadline_in`."""
    return None if wall_deadline is None else wall_deadline - time.time()
