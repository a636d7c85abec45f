"""Warm-up within a time limit: the kernel stepped in chunks, stopped when time is up.

NumPyro's ``MCMC.run`` compiles warm-up and sampling into one loop per chain, which cannot stop
early: a run given a time limit could spend all of it, and more, adapting. :func:`bounded_warmup`
runs each chain's warm-up itself, up to ``chunk`` kernel steps per compiled call, as many as
its share of the time holds at the last step's pace (the adaptation schedule lives in the
kernel's state, so the chunks make the same warm-up as one loop), checks the clock between
chunks and stops a chain's warm-up when its share of the time is spent. The
adapted states become ``mcmc.post_warmup_state``, from which ``mcmc.run`` draws without warming
up again. A warm-up cut short keeps the step size and mass matrix adapted so far. The result
says how long a step took at the end of warm-up (with the step size and mass matrix the draws
will use, so a fair forecast of a draw's cost, unlike the average over warm-up, whose early steps
run with other step sizes) and about how long the compilation took.

>>> import jax, numpyro, numpyro.distributions as dist
>>> from numpyro.infer import MCMC, NUTS
>>> def model():
...     numpyro.sample("x", dist.Normal(0.0, 1.0))
>>> mcmc = MCMC(NUTS(model), num_warmup=200, num_samples=100, progress_bar=False)
>>> done = bounded_warmup(mcmc, jax.random.key(0), (), {}, deadline=float("inf"))
>>> done.steps
(200,)
>>> mcmc.run(jax.random.key(1))
>>> mcmc.get_samples()["x"].shape
(100,)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC
from numpyro.infer.hmc import HMCState

from .extend import DRAW_CHUNK, step_program

__all__ = ["WARMUP_CHUNK", "Warmup", "bounded_warmup"]

#: The most kernel steps per compiled call of :func:`bounded_warmup` (fewer where the time
#: left at the last step's pace holds fewer; the first call makes one): the draws' chunk, since
#: warm-up runs the draws' program (:func:`~.extend.step_program`).
WARMUP_CHUNK = DRAW_CHUNK


class Warmup(NamedTuple):
    """What :func:`bounded_warmup` did.

    Attributes
    ----------
    steps : tuple of int
        Warm-up steps each chain made (``num_warmup`` unless the deadline cut it).
    step_seconds : float
        Seconds per step of the last chunk (the last chain's), with the adapted step size.
    compile_seconds : float
        The first call's seconds (one step) beyond the median step's: about the compilation
        of the kernel's step (the whole first call when there was no other).
    """

    steps: tuple[int, ...]
    step_seconds: float
    compile_seconds: float


def bounded_warmup(
    mcmc: MCMC,
    rng_key: jax.Array,
    model_args: tuple,
    model_kwargs: dict,
    *,
    deadline: float,
    init_params: Any = None,
    chunk: int = WARMUP_CHUNK,
    callback: Callable[[int, int, int, float], None] | None = None,
    extra_fields: Sequence[str] = (),
    limit: float | None = None,
) -> Warmup:
    """Warm up every chain of ``mcmc`` until done or ``deadline``; set its post-warm-up state.

    Parameters
    ----------
    mcmc : numpyro.infer.MCMC
        Not yet run; its ``num_warmup`` is the most warm-up steps per chain.
    rng_key : PRNG key
    model_args, model_kwargs
        The model's arguments, as ``mcmc.run`` will get them.
    deadline : float
        A time of :func:`time.perf_counter`; the chains share what is left of it equally, in
        turn (a chain that finishes early leaves its time to the next).
    init_params : pytree, optional
        Starting values, with a leading chain axis when there are several chains.
    chunk : int
        Kernel steps per compiled call, at most :data:`~.extend.DRAW_CHUNK`.
    callback : callable, optional
        ``callback(chain, steps_done, num_warmup, seconds_left)`` after every chunk.
    extra_fields : sequence of str
        The fields the draws will collect: warm-up steps the chains by the draws' own compiled
        program (:func:`~.extend.step_program`, its draws discarded), so that the run compiles
        its sampler once.
    limit : float, optional
        A time of :func:`time.perf_counter` that warm-up must not pass. Where given, the first
        chain's set-up (its kernel's ``init`` and the first compiled call, which compile) is
        not charged to ``deadline``: it moves ``deadline`` later by those seconds, but not
        past ``limit``. A share of a time limit given as ``deadline`` is then a share of the
        time spent stepping; otherwise a compilation as long as the share (tens of seconds on
        a large collapsed model) would leave the chains after the first one step each.

    Returns
    -------
    Warmup
        The steps each chain made and the time a step took at the end.

    A chain whose warm-up is cut keeps the dual-averaging mean of its step size, as NumPyro
    keeps at the end of a window, not the last iterate.
    """
    if not 1 <= chunk <= DRAW_CHUNK:
        raise ValueError(f"chunk must be within 1..{DRAW_CHUNK}, got {chunk}")
    kernel, total = mcmc.sampler, int(mcmc.num_warmup)
    chains = mcmc.num_chains
    mcmc._args, mcmc._kwargs = tuple(model_args), dict(model_kwargs)
    keys = jax.random.split(rng_key, chains)
    states, done, paces = [], [], []
    first = pace = None  # the first call's seconds (it compiles); seconds per step since
    for c in range(chains):
        params = (init_params if chains == 1 or init_params is None
                  else jax.tree.map(lambda x, c=c: x[c], init_params))
        began = time.perf_counter()
        state = kernel.init(keys[c], total, params, model_args, model_kwargs)
        if c == 0:
            step = step_program(mcmc, extra_fields)
            setup = time.perf_counter() - began
        share = (deadline - time.perf_counter()) / (chains - c)
        stop, steps = time.perf_counter() + share, 0
        while steps < total and (steps == 0 or time.perf_counter() < stop):
            # a chunk ends by the chain's share at the last pace (at least one step): where a
            # step takes seconds, a fixed chunk would overrun the share by many of them
            left = stop - time.perf_counter()
            fits = 1 if pace is None else chunk if left >= chunk * pace else int(left / pace)
            n = max(1, min(chunk, total - steps, fits))
            began = time.perf_counter()
            state = jax.block_until_ready(step(state, n)[0])
            seconds = time.perf_counter() - began
            step.ran = True
            if first is None:  # it compiled: the chains share what is left after it
                first = seconds
                if limit is not None:
                    deadline = min(deadline + setup + first, limit)
                stop = time.perf_counter() + (deadline - time.perf_counter()) / (chains - c)
            else:
                paces.append(seconds / n)
            pace = seconds / n
            steps += n
            if callback is not None:
                callback(c, steps, total, deadline - time.perf_counter())
        states.append(state if steps == total else _settled(state, total))
        done.append(steps)
    mcmc.post_warmup_state = (states[0] if chains == 1
                              else jax.tree.map(lambda *xs: jnp.stack(xs), *states))
    median = float(np.median(paces)) if paces else 0.0
    return Warmup(tuple(done), pace, max(first - median, 0.0))


def _nuts_state(state: Any) -> Any:
    """NUTS's :class:`~numpyro.infer.hmc.HMCState` in ``state``: itself, or the last block of a
    Gibbs kernel's state (``None`` where there is none)."""
    if isinstance(state, HMCState):
        return state
    blocks = getattr(state, "block_states", None)
    return None if not blocks else _nuts_state(blocks[-1])


def _with_nuts_state(state: Any, nuts: Any) -> Any:
    """``state`` with NUTS's state (:func:`_nuts_state`) replaced by ``nuts``."""
    if isinstance(state, HMCState):
        return nuts
    blocks = state.block_states
    return state._replace(block_states=blocks[:-1] + (_with_nuts_state(blocks[-1], nuts),))


def _settled(state: Any, num_warmup: int) -> Any:
    """A cut warm-up's state, ready to draw: NUTS's step size at its dual-averaging mean, and
    its step counter at ``num_warmup``, the end of warm-up.

    NumPyro's kernel adapts while its counter is below the warm-up length it was initialised
    with, whatever ``MCMC`` calls the steps: without the counter moved, the draws after a cut
    would go on adapting the step size (and, with an adapted metric, the mass matrix) until
    ``num_warmup`` steps in all, and would not be draws of one Markov chain."""
    nuts = _nuts_state(state)
    if nuts is None or nuts.adapt_state is None:
        return state
    adapt = nuts.adapt_state
    averaged = jnp.exp(adapt.ss_state[1])  # DAState: (x, x_avg, g_avg, t, prox_center)
    size = jnp.where(adapt.ss_state[3] > 0, averaged, adapt.step_size)
    return _with_nuts_state(state, nuts._replace(
        i=jnp.full_like(nuts.i, num_warmup), adapt_state=adapt._replace(step_size=size)))
