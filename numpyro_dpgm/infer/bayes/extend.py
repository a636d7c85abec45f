"""More draws from where an MCMC run stopped: batches until it has converged or time is up.

:func:`draw_more` continues a finished :class:`numpyro.infer.MCMC` run by a batch of draws per
chain, each chain from its last state with the step size and mass matrix its warm-up adapted
(no new warm-up), and appends them to the draws the run holds, so that ``get_samples``,
``get_extra_fields`` and ArviZ see one run. :func:`draw_until` repeats it while a check of the
draws says the run falls short and the next batch is expected to end within a time limit.
Every draw after warm-up is a draw of the same Markov chain (the same kernel, step size and
mass matrix), so a batch extends the chains; only the run's length then depends on its draws.
:class:`SequentialChains` runs a first run's chains one after another in one compiled program.

>>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
>>> from numpyro.infer import MCMC, NUTS
>>> def model():
...     numpyro.sample("x", dist.Normal(0.0, 1.0))
>>> mcmc = MCMC(NUTS(model), num_warmup=100, num_samples=100, progress_bar=False)
>>> mcmc.run(jax.random.key(0))
>>> _ = draw_more(mcmc)
>>> mcmc.get_samples()["x"].shape
(200,)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC
from numpyro.util import is_prng_key, nested_attrgetter

__all__ = ["DRAW_CHUNK", "ProgramData", "SequentialChains", "chain_method_for", "draw_more",
           "draw_until", "draws_held", "first_draws", "resolve_chain_method", "step_program"]


#: The most draws per chain in one compiled call: a batch is drawn in calls of at most this many
#: (fewer where the time left at the last call's pace holds fewer), the clock checked between
#: them, so a time limit is kept to within one call even where a draw costs more than forecast.
DRAW_CHUNK = 25


def draw_more(mcmc: MCMC, extra_fields: Sequence[str] = (), deadline: float | None = None,
              ) -> float:
    """Draw ``mcmc.num_samples`` more per chain after the run's last draw; append them.

    Parameters
    ----------
    mcmc : numpyro.infer.MCMC
        A run that has finished (``mcmc.run``), with any number of chains.
    extra_fields : sequence of str
        The ``extra_fields`` the run collected: the batches must collect the same (no removed
        sites, ``"~z.…"``; the run must not thin its draws).
    deadline : float, optional
        A time of :func:`time.perf_counter`: no call of :data:`DRAW_CHUNK` draws or fewer
        starts that is expected to end later (at least one draw per chain is made), so the
        batch may hold fewer draws.

    Returns
    -------
    float
        Seconds the batch took.

    Notes
    -----
    NumPyro keeps the draws of its last ``run`` only, and a further ``run`` from
    ``mcmc.last_state`` compiles its sampling loop anew for every chain. This function steps
    the run's own kernel (``mcmc.sampler.sample`` with the run's model arguments) from
    ``mcmc.last_state`` in one program of up to :data:`DRAW_CHUNK` steps per call, chains as
    the run ran them (one after another, in parallel on one device each, or vectorised),
    compiled once per run; it collects the fields the run collected (the sample field through
    the kernel's ``postprocess_fn``, so deterministic sites too) and holds the earlier draws and
    the new ones together, chain by chain, with the new last state. ``mcmc.draw_pace`` is then
    the seconds a draw of every chain took in the last call.
    """
    if getattr(mcmc, "processes", 1) > 1:
        raise ValueError("draw_more continues a run in this process, and this run's chains were "
                         "stepped by a team of processes (run_nuts(chain_method='processes')), "
                         "whose last states stayed there; run again with a longer time_limit")
    if mcmc.last_state is None:
        raise ValueError("draw_more continues a run: call mcmc.run(...) first")
    fields = _fields(mcmc, extra_fields, "draw_more continues runs")
    start = time.perf_counter()
    last, states = _draw(mcmc, mcmc.last_state, mcmc.num_samples, fields, deadline,
                         getattr(mcmc, "draw_pace", None))
    seconds = time.perf_counter() - start
    mcmc._last_state = last
    mcmc._states = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), mcmc._states,
                                states)
    mcmc._states_flat = None
    return seconds


def first_draws(mcmc: MCMC, rng_key: jax.Array, model_args: tuple = (),
                model_kwargs: dict | None = None, extra_fields: Sequence[str] = (), *,
                deadline: float | None = None, pace: float | None = None,
                compile_seconds: float = 0.0, at_least: int = 1) -> float:
    """``mcmc.run(rng_key, *model_args, extra_fields=..., **model_kwargs)`` after a warm-up
    held in ``mcmc.post_warmup_state``, in the compiled program of :func:`draw_more`.

    The draws are ``mcmc.run``'s (the same keys: one per chain, split from ``rng_key`` as
    ``run`` splits it), and ``get_samples``, ``get_extra_fields`` and ``last_state`` read as after
    ``run``; but the program is the one every later batch of :func:`draw_more` uses, so a run
    that draws further batches compiles its sampling loop once, not twice (``run`` compiles a
    loop of its own).

    Parameters
    ----------
    mcmc, rng_key, model_args, model_kwargs, extra_fields
        As ``mcmc.run`` takes them.
    deadline : float, optional
        A time of :func:`time.perf_counter`: the draws stop where the next call of the program
        is expected to end later (after ``at_least`` draws per chain), so there may be fewer than
        ``mcmc.num_samples``.
    pace : float, optional
        The expected seconds of one draw of every chain, for the first call's size.
    compile_seconds : float
        The expected compilation of the first call.
    at_least : int
        The fewest draws per chain, whatever the deadline.

    Returns
    -------
    float
        Seconds the draws took, compilation included.
    """
    state = mcmc.post_warmup_state
    if state is None:
        raise ValueError("first_draws continues a warm-up: set mcmc.post_warmup_state first")
    fields = _fields(mcmc, extra_fields, "first_draws draws")
    mcmc._args, mcmc._kwargs = tuple(model_args), dict(model_kwargs or {})
    if mcmc.num_chains > 1 and is_prng_key(rng_key):
        rng_key = jax.random.split(rng_key, mcmc.num_chains)
    start = time.perf_counter()
    mcmc._last_state, mcmc._states = _draw(
        mcmc, state._replace(rng_key=rng_key), mcmc.num_samples, fields, deadline, pace,
        compile_seconds, at_least)
    mcmc._states_flat = None
    return time.perf_counter() - start


def _fields(mcmc: MCMC, extra_fields: Sequence[str], what: str) -> tuple[str, ...]:
    """The fields a run collects (sample field, the kernel's defaults, ``extra_fields``)."""
    if mcmc.thinning != 1 or any(f.startswith("~") for f in extra_fields):
        raise ValueError(f"{what} without thinning or removed sites "
                         f"(thinning={mcmc.thinning}, extra_fields={tuple(extra_fields)})")
    return tuple(dict.fromkeys((mcmc.sampler.sample_field, *mcmc.sampler.default_fields,
                                *extra_fields)))


def _draw(mcmc: MCMC, state: Any, count: int, fields: tuple[str, ...],
          deadline: float | None, pace: float | None, compile_seconds: float = 0.0,
          at_least: int = 1) -> tuple[Any, dict[str, Any]]:
    """Up to ``count`` draws per chain from ``state`` in calls of :func:`_batch_program`, the
    clock checked between calls; ``(last state, draws grouped by chain)``. Sets
    ``mcmc.draw_pace`` (seconds per draw of every chain in the last call that did not compile)."""
    program = _batch_program(mcmc, fields)
    compiles = not program.ran
    parts, drawn = [], 0
    while drawn < count:
        left = np.inf if deadline is None else deadline - time.perf_counter()
        left -= compile_seconds if compiles else 0.0
        fits = DRAW_CHUNK if pace is None or left >= DRAW_CHUNK * pace else int(left / pace)
        n = min(DRAW_CHUNK, count - drawn, max(fits, at_least - drawn))
        if n < 1:
            break
        began = time.perf_counter()
        state, part = jax.block_until_ready(program(state, n))
        seconds = time.perf_counter() - began
        if not compiles:
            pace = mcmc.draw_pace = seconds / n
        elif pace is None:  # an upper bound until a call that does not compile says better
            pace = seconds / n
        compiles = False
        program.ran = True
        parts.append(jax.tree.map(lambda x, n=n: np.asarray(x)[:, :n], part))
        drawn += n
    if not hasattr(mcmc, "draw_pace") and pace is not None:
        mcmc.draw_pace = pace
    return state, jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *parts)


class ProgramData:
    """A value that a kernel's model reads when it is traced, which :func:`step_program` passes
    to its compiled program as an argument instead of baking it in as a constant.

    Set it as the kernel's ``program_data``: the runs of that kernel (one ``MCMC`` after
    another, on the same model arguments) then share one compiled step program, each with
    the ``value`` held when it calls it. While the program is traced, ``value`` is the tracer.

    >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC, NUTS
    >>> loc = ProgramData(jnp.asarray(0.0))
    >>> def model():
    ...     numpyro.sample("x", dist.Normal(loc.value, 1.0))
    >>> kernel = NUTS(model)
    >>> kernel.program_data = loc
    >>> programs = []
    >>> for value in (0.0, 10.0):
    ...     loc.value = jnp.asarray(value)
    ...     mcmc = MCMC(kernel, num_warmup=0, num_samples=25, progress_bar=False)
    ...     mcmc.post_warmup_state = kernel.init(jax.random.key(0), 0, None, (), {})
    ...     _ = first_draws(mcmc, jax.random.key(1))
    ...     programs.append(step_program(mcmc))
    >>> programs[0] is programs[1], bool(mcmc.get_samples()["x"].mean() > 8)
    (True, True)
    """

    def __init__(self, value: Any) -> None:
        self.value = value

    @contextmanager
    def bound(self, value: Any) -> Iterator[None]:
        """``value`` held for the block (the tracer while a program is traced)."""
        held, self.value = self.value, value
        try:
            yield
        finally:
            self.value = held


def _programs(mcmc: MCMC) -> dict:
    """Where ``mcmc``'s compiled step programs are kept: on the run, or on its kernel where the
    kernel has :class:`ProgramData` (its runs share them)."""
    owner = mcmc.sampler if _data(mcmc) is not None else mcmc
    return owner.__dict__.setdefault("_draw_more_programs", {})


def _data(mcmc: MCMC) -> ProgramData | None:
    return getattr(mcmc.sampler, "program_data", None)


def step_program(mcmc: MCMC, extra_fields: Sequence[str] = ()) -> Callable:
    """One chain's ``(state, n) -> (last state, draws)``: ``n ≤`` :data:`DRAW_CHUNK` steps of
    the run's kernel (the draws beyond ``n`` are padding), compiled once per run and fields
    (kept on ``mcmc``, whose ``_args`` and ``_kwargs`` must be the run's). Warm-up
    (:func:`~.warmup.bounded_warmup`, which discards the draws: the adaptation schedule lives
    in the kernel's state) and the draws of chains run one after another share it, so a run
    compiles its sampler once. Its ``ran`` says whether it has been called (compiled).

    A kernel with :class:`ProgramData` (its ``program_data``) keeps the program itself: every
    run of that kernel steps the program compiled for the first, which must have had the same
    model arguments, fields, warm-up length and kernel settings; only the data's ``value`` and
    the state change between them."""
    fields = _fields(mcmc, extra_fields, "step_program's draws")
    programs = _programs(mcmc)
    if ("chain", fields) in programs:
        return programs["chain", fields]
    sampler, args, kwargs, data = mcmc.sampler, mcmc._args, mcmc._kwargs, _data(mcmc)
    getter = nested_attrgetter(*fields)

    def chain(state: Any, n: Any, value: Any = None) -> tuple[Any, dict[str, Any]]:
        if data is not None:
            with data.bound(value):
                return _steps(state, n)
        return _steps(state, n)

    def _steps(state: Any, n: Any) -> tuple[Any, dict[str, Any]]:
        postprocess = sampler.postprocess_fn(args, kwargs)

        def collect(s: Any) -> dict[str, Any]:
            values = list(getter(s)) if len(fields) > 1 else [getter(s)]
            values[0] = postprocess(values[0])
            return dict(zip(fields, values, strict=True))

        def advance(s: Any) -> tuple[Any, dict[str, Any]]:
            s = sampler.sample(s, args, kwargs)
            return s, collect(s)

        def hold(s: Any) -> tuple[Any, dict[str, Any]]:  # a step past n: no step, no draw
            shapes = jax.eval_shape(collect, s)
            return s, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        def step(carry: Any, i: Any) -> tuple[Any, dict[str, Any]]:
            return jax.lax.cond(i < n, advance, hold, carry)

        return jax.lax.scan(step, state, np.arange(DRAW_CHUNK))

    programs["chain", fields] = _Program(jax.jit(chain), chain, data=data)
    return programs["chain", fields]


def _batch_program(mcmc: MCMC, fields: tuple[str, ...]) -> Callable:
    """``(state, n) -> (last state, draws grouped by chain)`` of every chain: chains one after
    another call :func:`step_program` in turn; vectorised or parallel chains have a program of
    their own (kept where :func:`step_program`'s is)."""
    one = step_program(mcmc, fields)
    if mcmc.num_chains == 1:
        def single(state: Any, n: int) -> tuple[Any, dict[str, Any]]:
            last, draws = one(state, n)
            return last, jax.tree.map(lambda x: x[None], draws)

        return _Program(single, base=one)
    if mcmc.chain_method not in ("parallel", "vectorized"):
        def in_turn(states: Any, n: int) -> tuple[Any, dict[str, Any]]:
            outs = [one(jax.tree.map(lambda x, c=c: x[c], states), n)
                    for c in range(mcmc.num_chains)]
            return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

        return _Program(in_turn, base=one)
    programs = _programs(mcmc)
    if ("batch", fields) not in programs:
        if mcmc.chain_method == "parallel":
            program = jax.pmap(one.chain, in_axes=(0, None, None))
        else:
            program = jax.jit(jax.vmap(one.chain, in_axes=(0, None, None)))
        programs["batch", fields] = _Program(program, data=one.data)
    return programs["batch", fields]


class _Program:
    """A program that remembers whether it has run (compiled) yet; one built on another
    (``base``) shares its memory. ``chain`` is the traced function, where there is one;
    ``data`` the :class:`ProgramData` whose value each call passes."""

    def __init__(self, fn: Callable, chain: Callable | None = None,
                 base: _Program | None = None, data: ProgramData | None = None) -> None:
        self.fn, self.chain, self._base, self._ran, self.data = fn, chain, base, False, data

    @property
    def ran(self) -> bool:
        return self._base.ran if self._base is not None else self._ran

    @ran.setter
    def ran(self, value: bool) -> None:
        if self._base is not None:
            self._base.ran = value
        else:
            self._ran = value

    def __call__(self, state: Any, n: int) -> Any:
        if self._base is not None:
            return self.fn(state, n)
        return self.fn(state, n, None if self.data is None else self.data.value)


class SequentialChains:
    """A ``chain_method`` of :class:`numpyro.infer.MCMC`: the chains one after another inside
    one compiled program (``jax.lax.map`` over the chains), so the sampler compiles once for
    all of them. NumPyro's ``"sequential"`` traces its sampling loop anew for each chain (the
    loop's body is a new function object per chain) and compiles it again: ``k`` chains, ``k``
    compilations of the whole sampler, where this takes one. The draws are those of
    ``"sequential"`` with the same keys. NumPyro shows no progress bar for a callable chain
    method. Its ``repr`` is ``sequential``.

    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC, NUTS
    >>> def model():
    ...     numpyro.sample("x", dist.Normal(0.0, 1.0))
    >>> mcmc = MCMC(NUTS(model), num_warmup=50, num_samples=50, num_chains=2,
    ...             chain_method=SequentialChains(), progress_bar=False)
    >>> mcmc.run(jax.random.key(0))
    >>> mcmc.get_samples(group_by_chain=True)["x"].shape, mcmc.chain_method
    ((2, 50), sequential)
    """

    def __call__(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda per_chain: jax.lax.map(fn, per_chain)

    def __repr__(self) -> str:
        return "sequential"


def resolve_chain_method(chain_method: str, num_chains: int) -> str:
    """``"auto"``: parallel where JAX has a device per chain, else sequential."""
    if chain_method != "auto":
        return chain_method
    return "parallel" if 1 < num_chains <= jax.local_device_count() else "sequential"


def chain_method_for(method: str, num_chains: int, progress_bar: bool) -> Any:
    """NumPyro's ``chain_method`` for ``method``: ``"sequential"`` chains in one compiled
    program (:class:`SequentialChains`) unless a progress bar is wanted."""
    if method == "sequential" and num_chains > 1 and not progress_bar:
        return SequentialChains()
    return method


def draw_until(
    mcmc: MCMC, done: Callable[[MCMC], bool], deadline: float, pace: float,
    extra_fields: Sequence[str] = (),
    callback: Callable[[MCMC, int], None] | None = None,
) -> int:
    """Batches of :func:`draw_more` while ``done(mcmc)`` is false and time allows.

    Parameters
    ----------
    mcmc : numpyro.infer.MCMC
        A finished run.
    done : callable
        ``done(mcmc) -> bool``: true when the draws so far suffice (checked before each batch).
    deadline : float
        A time of :func:`time.perf_counter`: no batch starts where one draw of every chain is
        expected to end later, and a batch stops short at it (:func:`draw_more`; the last
        batch then).
    pace : float
        Expected seconds of one draw of every chain in the first batch (``mcmc.draw_pace``
        where the run has one).
    extra_fields : sequence of str
        As the run collected them.
    callback : callable, optional
        ``callback(mcmc, batch)`` before each batch (numbered from 1), after ``done`` said no.

    Returns
    -------
    int
        The batches drawn.
    """
    batches, cut = 0, False
    while not cut and not done(mcmc) and time.perf_counter() + pace <= deadline:
        batches += 1
        if callback is not None:
            callback(mcmc, batches)
        held = draws_held(mcmc)
        draw_more(mcmc, extra_fields, deadline)
        pace, cut = mcmc.draw_pace, draws_held(mcmc) - held < mcmc.num_samples
    return batches


def draws_held(mcmc: MCMC) -> int:
    """Draws per chain that ``mcmc`` holds."""
    return int(jax.tree.leaves(mcmc._states)[0].shape[1])
