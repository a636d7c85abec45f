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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from numpyro.infer import MCMC
from numpyro.util import is_prng_key, nested_attrgetter

__all__ = ["SequentialChains", "chain_method_for", "draw_more", "draw_until", "first_draws",
           "resolve_chain_method"]


def draw_more(mcmc: MCMC, extra_fields: Sequence[str] = ()) -> float:
    """Draw ``mcmc.num_samples`` more per chain after the run's last draw; append them.

    Parameters
    ----------
    mcmc : numpyro.infer.MCMC
        A run that has finished (``mcmc.run``), with any number of chains.
    extra_fields : sequence of str
        The ``extra_fields`` the run collected: the batches must collect the same (no removed
        sites, ``"~z.…"``; the run must not thin its draws).

    Returns
    -------
    float
        Seconds the batch took.

    Notes
    -----
    NumPyro keeps the draws of its last ``run`` only, and a further ``run`` from
    ``mcmc.last_state`` compiles its sampling loop anew for every chain. This function steps
    the run's own kernel (``mcmc.sampler.sample`` with the run's model arguments) from
    ``mcmc.last_state`` in one program per batch size, chains as the run ran them (one after
    another, in parallel on one device each, or vectorised), compiled once per run and batch
    size; it collects the fields the run collected (the sample field through the kernel's
    ``postprocess_fn``, so deterministic sites too) and holds the earlier draws and the new ones
    together, chain by chain, with the new last state.
    """
    if mcmc.last_state is None:
        raise ValueError("draw_more continues a run: call mcmc.run(...) first")
    if mcmc.thinning != 1 or any(f.startswith("~") for f in extra_fields):
        raise ValueError("draw_more continues runs without thinning or removed sites "
                         f"(thinning={mcmc.thinning}, extra_fields={tuple(extra_fields)})")
    fields = tuple(dict.fromkeys((mcmc.sampler.sample_field, *mcmc.sampler.default_fields,
                                  *extra_fields)))
    start = time.perf_counter()
    last, states = _batch_program(mcmc, mcmc.num_samples, fields)(mcmc.last_state)
    states = jax.block_until_ready(states)
    seconds = time.perf_counter() - start
    mcmc._last_state = last
    mcmc._states = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), mcmc._states,
                                states)
    mcmc._states_flat = None
    return seconds


def first_draws(mcmc: MCMC, rng_key: jax.Array, model_args: tuple = (),
                model_kwargs: dict | None = None, extra_fields: Sequence[str] = ()) -> float:
    """``mcmc.run(rng_key, *model_args, extra_fields=..., **model_kwargs)`` after a warm-up
    held in ``mcmc.post_warmup_state``, in the compiled program of :func:`draw_more`.

    The draws are ``mcmc.run``'s (the same keys: one per chain, split from ``rng_key`` as
    ``run`` splits it), and ``get_samples``, ``get_extra_fields`` and ``last_state`` read as after
    ``run``; but the program is the one every later batch of :func:`draw_more` of the same size
    uses, so a run that draws further batches compiles its sampling loop once, not twice
    (``run`` compiles a loop of its own).

    Returns
    -------
    float
        Seconds the draws took, compilation included.
    """
    state = mcmc.post_warmup_state
    if state is None:
        raise ValueError("first_draws continues a warm-up: set mcmc.post_warmup_state first")
    if mcmc.thinning != 1 or any(f.startswith("~") for f in extra_fields):
        raise ValueError("first_draws draws without thinning or removed sites "
                         f"(thinning={mcmc.thinning}, extra_fields={tuple(extra_fields)})")
    mcmc._args, mcmc._kwargs = tuple(model_args), dict(model_kwargs or {})
    if mcmc.num_chains > 1 and is_prng_key(rng_key):
        rng_key = jax.random.split(rng_key, mcmc.num_chains)
    fields = tuple(dict.fromkeys((mcmc.sampler.sample_field, *mcmc.sampler.default_fields,
                                  *extra_fields)))
    start = time.perf_counter()
    last, states = _batch_program(mcmc, mcmc.num_samples, fields)(
        state._replace(rng_key=rng_key))
    mcmc._last_state, mcmc._states = jax.block_until_ready((last, states))
    mcmc._states_flat = None
    return time.perf_counter() - start


def _batch_program(mcmc: MCMC, num_samples: int, fields: tuple[str, ...]) -> Callable:
    """``state -> (last state, draws grouped by chain)``: ``num_samples`` steps of the run's
    kernel per chain, compiled once per run, batch size and fields (kept on ``mcmc``)."""
    programs = mcmc.__dict__.setdefault("_draw_more_programs", {})
    key = (num_samples, fields)
    if key in programs:
        return programs[key]
    sampler, args, kwargs = mcmc.sampler, mcmc._args, mcmc._kwargs
    postprocess = sampler.postprocess_fn(args, kwargs)
    getter = nested_attrgetter(*fields)

    def collect(state: Any) -> dict[str, Any]:
        values = list(getter(state)) if len(fields) > 1 else [getter(state)]
        values[0] = postprocess(values[0])
        return dict(zip(fields, values, strict=True))

    def chain(state: Any) -> tuple[Any, dict[str, Any]]:
        def step(carry: Any, _: None) -> tuple[Any, dict[str, Any]]:
            carry = sampler.sample(carry, args, kwargs)
            return carry, collect(carry)

        return jax.lax.scan(step, state, None, length=num_samples)

    if mcmc.num_chains == 1:
        def one(state: Any) -> tuple[Any, dict[str, Any]]:
            last, draws = chain(state)
            return last, jax.tree.map(lambda x: x[None], draws)

        program = jax.jit(one)
    elif mcmc.chain_method == "parallel":
        program = jax.pmap(chain)
    elif mcmc.chain_method == "vectorized":
        program = jax.jit(jax.vmap(chain))
    else:
        program = jax.jit(lambda states: jax.lax.map(chain, states))
    programs[key] = program
    return program


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
    mcmc: MCMC, done: Callable[[MCMC], bool], deadline: float, first_batch: float,
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
        A time of :func:`time.perf_counter`: no batch starts that is expected to end later.
    first_batch : float
        Expected seconds of the first batch (later batches are expected to take as long as the
        last one did).
    extra_fields : sequence of str
        As the run collected them.
    callback : callable, optional
        ``callback(mcmc, batch)`` before each batch (numbered from 1), after ``done`` said no.

    Returns
    -------
    int
        The batches drawn.
    """
    batches, expected = 0, first_batch
    while not done(mcmc) and time.perf_counter() + expected <= deadline:
        batches += 1
        if callback is not None:
            callback(mcmc, batches)
        expected = draw_more(mcmc, extra_fields)
    return batches
