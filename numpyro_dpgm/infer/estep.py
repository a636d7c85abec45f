"""E-step engines of EM on collective graphical models: ``E[n | y; θ_t]`` by sampling or by
variational inference, with the model's params held fixed.

:class:`VariationalEStep` fits a Gaussian autoguide by SVI and averages guide draws (variational
EM, :func:`~numpyro_dpgm.estimation.variational_em.variational_em`); :class:`MCMCEStep` averages
NUTS draws from a warm-started chain (Monte-Carlo EM, :func:`~numpyro_dpgm.estimation.mcem.mcem`);
:class:`ExactEStep` averages exact record-swap draws of the integer tables of an exact CGM site
(Monte-Carlo EM on the exact CGM, ``mcem(..., counts="exact")``, or on a model of your own).
:func:`estep_engine` caches one engine per model, so many releases fitted with one cached model
compile once. :class:`numpyro_dpgm.infer.EM` picks the engine with ``estep="variational"``,
``estep="mcmc"`` or ``estep="exact"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer import NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal
from numpyro.infer.util import log_density

from .._cache import LRUCache
from .bayes import init_to_interior
from .bayes.count_gibbs import RecordMoves
from .handlers import join, split_static

__all__ = [
    "EStepResult",
    "ExactEStep",
    "MCMCEStep",
    "VariationalEStep",
    "conditioned_on_params",
    "draw_schedule",
    "estep_engine",
]

Array = Any


class EStepResult(NamedTuple):
    """What a sampling or variational E-step returns.

    Attributes
    ----------
    n : array
        The estimate of ``E[n | y; θ_t]`` (latent site's layout).
    objective : float
        Variational: the ELBO (mean over the last steps); Monte Carlo: the mean log joint
        density of the draws.
    converged : bool
        Whether the E-step's own stopping rule held (variational: the ELBO stopped rising).
    draws : int
        Number of draws the mean is taken over.
    """

    n: Any
    objective: float
    converged: bool
    draws: int


def conditioned_on_params(model: Callable) -> Callable:
    """``model`` as ``f(params, *args, **kwargs)`` with its ``numpyro.param`` sites fixed.

    The params are substituted and then hidden, so inference on the result (SVI, NUTS) sees
    only the latent sample sites, and the params are ordinary (traced) arguments: a compiled
    sampler or optimiser is reused across EM iterations.
    """

    def conditioned(params: dict, *args: Any, **kwargs: Any) -> Any:
        with handlers.block(hide_fn=lambda site: site["type"] == "param"), \
                handlers.substitute(data=params):
            return model(*args, **kwargs)

    return conditioned


# ------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------
#: Most E-step engines kept (least recently used evicted first): each holds compiled code.
MAX_ENGINES = 16
_ENGINES: LRUCache = LRUCache(MAX_ENGINES)


def estep_engine(kind: str, model: Callable, latent: str, options: dict,
                 support: Any = None) -> Any:
    """The (cached) E-step engine of ``kind`` for ``model``, reset for a new run.

    Engines hold compiled functions keyed by the model, so fitting many releases with one
    cached model (:func:`~numpyro_dpgm.estimation.variational_em.latent_counts_model`)
    compiles once (up to :data:`MAX_ENGINES` engines are kept, the least recently used
    evicted first). A variational engine is also keyed by the latent site's ``support``:
    NumPyro's autoguides build their transforms from the support seen when the guide is first
    set up, so a release whose support differs (a relaxed CGM of another ``N``) needs a guide
    of its own.

    Parameters
    ----------
    kind : {"variational", "mcmc", "exact"}
        :class:`VariationalEStep`, :class:`MCMCEStep` or :class:`ExactEStep`.
    model : callable
        A NumPyro model with ``numpyro.param`` sites and the latent site ``latent``.
    latent : str
    options : dict
        Keyword options of the engine's class.
    support : constraint, optional
        The latent site's support (variational engines are cached per support).

    Returns
    -------
    VariationalEStep, MCMCEStep or ExactEStep
        Called as ``engine(key, params, args, kwargs)``, it returns an :class:`EStepResult`.
    """
    key = (kind, model, latent, tuple(sorted(options.items())))
    if kind == "variational" and support is not None:
        key += (_support_key(support),)
    engine = _ENGINES.get(key)
    if engine is None:
        if kind == "variational":
            engine = VariationalEStep(model, latent, **options)
        elif kind == "mcmc":
            engine = MCMCEStep(model, latent, **options)
        elif kind == "exact":
            engine = ExactEStep(model, latent, **options)
        else:
            raise ValueError(f"unknown E-step {kind!r}; use 'variational', 'mcmc' or 'exact'")
        _ENGINES[key] = engine
    engine.reset()
    return engine


def _support_key(support: Any) -> tuple:
    """A hashable value identifying a constraint object (its type, structure and data)."""
    leaves, treedef = jax.tree_util.tree_flatten(support)
    return (type(support), str(treedef),
            tuple(np.asarray(leaf).tobytes() for leaf in leaves))


# ------------------------------------------------------------------------------------------------
# variational
# ------------------------------------------------------------------------------------------------
_AUTOGUIDES = {"normal": AutoNormal, "mvn": AutoMultivariateNormal}


class VariationalEStep:
    """``E_q[n]`` from SVI on the model with its params fixed, warm-started across calls.

    Parameters
    ----------
    model : callable
        A NumPyro model with ``numpyro.param`` sites and the latent site ``latent``.
    latent : str
    guide : {"normal", "mvn"}
        ``AutoNormal`` or ``AutoMultivariateNormal`` over every latent site, initialised at
        uniform tables for relaxed CGM sites.
    first_steps, steps : int
        Adam steps of the first E-step (rounded up to a multiple of ``steps``) and of every
        later (warm-started) one.
    learning_rate : float
    num_particles : int
        Monte-Carlo particles of the ELBO gradient.
    mean_draws : int
        Guide draws averaged into ``E_q[n]``.

    Notes
    -----
    The guide starts at uniform tables ``N / |X_C|`` (not at ``N·μ(θ₀)``): an autoguide fixes
    its starting point when first set up, so a data-dependent start would carry over from the
    first release fitted with a cached engine to the next.
    """

    def __init__(self, model: Callable, latent: str, *, guide: str = "normal",
                 first_steps: int = 1000, steps: int = 200, learning_rate: float = 0.05,
                 num_particles: int = 1, mean_draws: int = 256):
        if guide not in _AUTOGUIDES:
            raise ValueError(f"guide must be one of {sorted(_AUTOGUIDES)}, got {guide!r}")
        if min(first_steps, steps, num_particles, mean_draws) < 1:
            raise ValueError("first_steps, steps, num_particles and mean_draws must be >= 1")
        self.latent = latent
        self.first_steps, self.steps, self.mean_draws = int(first_steps), int(steps), mean_draws
        self.model = conditioned_on_params(model)
        self.guide = _AUTOGUIDES[guide](self.model, init_loc_fn=init_to_interior(radius=0.0))
        self.svi = SVI(self.model, self.guide, numpyro.optim.Adam(learning_rate),
                       Trace_ELBO(num_particles))
        self.state = None

    def reset(self) -> None:
        """Forget the fitted guide (the next call starts a new run)."""
        self.state = None

    def __call__(self, key: Any, params: dict, args: tuple, kwargs: dict) -> EStepResult:
        static, treedef, positions, arrays = split_static((args, kwargs))
        k_init, k_draw = jax.random.split(key)
        if self.state is None:
            self.state = self.svi.init(k_init, params, *args, **kwargs)
            chunks = max(-(-self.first_steps // self.steps), 1)
        else:
            chunks = 1
        parts = []
        for _ in range(chunks):  # one compiled scan length (``steps``)
            self.state, losses = _svi_steps(self.svi, static, treedef, positions, self.steps,
                                            self.state, params, arrays)
            parts.append(losses)
        losses = jnp.concatenate(parts)
        mean = _guide_mean(self.guide, self.latent, self.mean_draws, static, treedef, positions,
                           k_draw, self.svi.get_params(self.state), params, arrays)
        losses = self.losses = np.asarray(losses)  # the per-step -ELBO, kept for the caller
        tail = max(len(losses) // 4, 1)
        last, before = losses[-tail:].mean(), losses[-2 * tail:-tail].mean()
        spread = losses[-tail:].std() + 1e-12
        return EStepResult(mean, float(-last),
                           bool(before - last <= spread), self.mean_draws)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _svi_steps(svi: SVI, static: tuple, treedef: Any, positions: tuple, steps: int,
               state: Any, params: dict, arrays: tuple) -> tuple[Any, Any]:
    args, kwargs = join(static, treedef, positions, arrays)

    def body(s: Any, _: Any) -> Any:
        s, loss = svi.update(s, params, *args, **kwargs)
        return s, loss

    return jax.lax.scan(body, state, None, length=steps)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _guide_mean(guide: Any, latent: str, draws: int, static: tuple, treedef: Any,
                positions: tuple, key: Any, svi_params: dict, params: dict,
                arrays: tuple) -> Any:
    args, kwargs = join(static, treedef, positions, arrays)
    out = guide.sample_posterior(key, svi_params, params, *args, sample_shape=(draws,), **kwargs)
    return jnp.mean(out[latent], axis=0)


# ------------------------------------------------------------------------------------------------
# Monte Carlo
# ------------------------------------------------------------------------------------------------
def draw_schedule(iteration: int, first: int, last: int, growth: float = 2.0) -> int:
    """Draws of E-step ``iteration`` (from 0): ``min(last, first·growth^iteration)``."""
    return int(min(last, round(first * growth ** iteration)))


class MCMCEStep:
    """Posterior mean of the latent site by NUTS with the model's params fixed.

    Parameters
    ----------
    model : callable
        A NumPyro model with ``numpyro.param`` sites and a relaxed CGM site ``latent``.
    latent : str
    num_warmup : int
        Warm-up (step size and diagonal mass matrix adaptation) of the first E-step; later
        E-steps continue the adapted chain from its last state.
    first_draws, last_draws, growth :
        Draws per E-step, :func:`draw_schedule`.
    chunk : int
        Warm-up and draws run in compiled scans of ``chunk`` steps (one compilation per model),
        so both are rounded up to multiples of it.
    target_accept_prob, max_tree_depth :
        NUTS options.

    Notes
    -----
    One chain, driven through NumPyro's functional kernel interface (``NUTS.init`` /
    ``NUTS.sample``) inside a compiled ``lax.scan`` whose arguments are the params and the
    model's array arguments, so EM iterations and further releases of the same shape reuse
    the compiled sampler.
    """

    def __init__(self, model: Callable, latent: str, *, num_warmup: int = 200,
                 first_draws: int = 25, last_draws: int = 400, growth: float = 2.0,
                 target_accept_prob: float = 0.8, max_tree_depth: int = 8, chunk: int = 25):
        if min(num_warmup, first_draws, last_draws, chunk) < 1 or growth < 1:
            raise ValueError("num_warmup, first_draws, last_draws, chunk must be >= 1 and "
                             "growth >= 1")
        self.chunk = int(chunk)
        self.latent = latent
        self.num_warmup = int(num_warmup)
        self.first, self.last, self.growth = int(first_draws), int(last_draws), float(growth)
        self.kernel = NUTS(conditioned_on_params(model),
                           init_strategy=init_to_interior(radius=0.5),
                           target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth)
        self.reset()

    def reset(self) -> None:
        """Forget the chain (the next call warms up a new one)."""
        self.state: Any = None
        self.iteration = 0

    def __call__(self, key: Any, params: dict, args: tuple, kwargs: dict) -> EStepResult:
        static, treedef, positions, arrays = split_static((args, kwargs))
        chunk = self.chunk  # one compiled scan length: warm-up and draws run in chunks of it
        run = functools.partial(_nuts_scan, self.kernel, self.latent, chunk, static, treedef,
                                positions)
        if self.state is None:
            warm = -(-self.num_warmup // chunk) * chunk
            self.state = self.kernel.init(key, warm, None, (params,) + tuple(args), kwargs)
            for _ in range(warm // chunk):
                self.state, _ = run(self.state, params, arrays)
        draws = draw_schedule(self.iteration, self.first, self.last, self.growth)
        chunks = max(-(-draws // chunk), 1)
        total_n, total_e = 0.0, 0.0
        for _ in range(chunks):
            self.state, (n, energy) = run(self.state, params, arrays)
            total_n, total_e = total_n + n, total_e + energy
        self.iteration += 1
        return EStepResult(total_n / chunks, float(-total_e / chunks), True, chunks * chunk)


class ExactEStep:
    """Posterior mean of the integer tables by exact record swaps, with the model's params fixed.

    The record moves of :class:`~numpyro_dpgm.infer.bayes.RecordMoves` (Metropolis–Hastings
    record swaps that leave ``p(n | y; θ)`` of the exact CGM invariant) on the model with its
    params substituted, run as one chain whose records are kept across E-steps (the first
    E-step deals them from a CGM draw at ``θ_0`` and runs ``burn_in`` updates first, rounded up
    to a multiple of ``chunk``). No relaxation: the mean is of the exact posterior, up to Monte
    Carlo error.

    Parameters
    ----------
    model : callable
        A NumPyro model whose latent site is an exact
        :class:`~numpyro_dpgm.distributions.CollectiveGraphicalModel` read by this library's
        noise sites (what :class:`~numpyro_dpgm.infer.bayes.CGMGibbs` accepts), its ``θ`` a
        function of the model's ``numpyro.param`` sites, and no other latent site.
    latent : str
    first_draws, last_draws, growth :
        Updates averaged per E-step, :func:`draw_schedule`.
    burn_in : int
        Updates before the first E-step's draws (rounded up to a multiple of ``chunk``).
    moves : int, optional
        Record swaps per update (:func:`~numpyro_dpgm.infer.bayes.gibbs.default_moves` of
        the total).
    chunk : int
        Updates run in compiled scans of ``chunk`` (draws rounded up to multiples of it).
    """

    def __init__(self, model: Callable, latent: str, *, first_draws: int = 25,
                 last_draws: int = 400, growth: float = 2.0, burn_in: int = 50,
                 moves: int | None = None, chunk: int = 25):
        if min(first_draws, last_draws, chunk) < 1 or burn_in < 0 or growth < 1:
            raise ValueError("first_draws, last_draws, chunk must be >= 1, burn_in >= 0 and "
                             "growth >= 1")
        self.model, self.latent = model, latent
        self.first, self.last, self.growth = int(first_draws), int(last_draws), float(growth)
        self.burn_in, self.chunk = int(burn_in), int(chunk)
        self.kernel = RecordMoves(conditioned_on_params(model), moves=moves)
        self._runs: dict = {}  # compiled scans by the count sites' structure (their totals)
        self.reset()

    def reset(self) -> None:
        """Forget the chain (the next call deals new records)."""
        self.state: Any = None
        self.iteration = 0
        self._run: Any = None

    def _compiled(self) -> Callable:
        """The scan of ``chunk`` updates for the structure the kernel's ``init`` found."""
        layout = self.kernel.layout
        signature = tuple((c.name, np.asarray(c.totals).tobytes()) for c in layout.counts)
        run = self._runs.get(signature)
        if run is None:
            kernel, latent, chunk, model = self.kernel, self.latent, self.chunk, self.kernel.model

            @jax.jit
            def run(state: Any, model_args: tuple, kwargs: dict) -> tuple:
                def body(carry: Any, _: Any) -> Any:
                    state, total_n, total_e = carry
                    state = kernel.sample(state, model_args, kwargs)
                    energy, _ = log_density(model, model_args, kwargs, state.z)
                    return (state, total_n + state.z[latent] / chunk,
                            total_e + energy / chunk), None

                zero = jnp.zeros(jnp.shape(state.z[latent]), jnp.result_type(float))
                (state, mean, energy), _ = jax.lax.scan(
                    body, (state, zero, jnp.zeros((), zero.dtype)), None, length=chunk)
                return state, mean, energy

            self._runs[signature] = run
        return run

    def __call__(self, key: Any, params: dict, args: tuple, kwargs: dict) -> EStepResult:
        model_args = (params,) + tuple(args)
        if self.state is None:
            k_init, key = jax.random.split(key)
            self.state = self.kernel.init(k_init, 0, None, model_args, kwargs)
            if self.latent not in self.state.z:
                raise ValueError(f"estep='exact': {self.latent!r} is not an exact CGM site of "
                                 f"the model (its exact CGM sites: {sorted(self.state.z)})")
            if len(self.state.z) != 1:
                raise ValueError("estep='exact' supports one exact CGM site, found "
                                 f"{sorted(self.state.z)}")
            self._run = self._compiled()
            for _ in range(-(-self.burn_in // self.chunk)):
                self.state, _, _ = self._run(self.state, model_args, kwargs)
        draws = draw_schedule(self.iteration, self.first, self.last, self.growth)
        chunks = max(-(-draws // self.chunk), 1)
        total_n, total_e = 0.0, 0.0
        for _ in range(chunks):
            self.state, mean, energy = self._run(self.state, model_args, kwargs)
            total_n, total_e = total_n + mean, total_e + energy
        self.iteration += 1
        return EStepResult(total_n / chunks, float(total_e / chunks), True, chunks * self.chunk)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _nuts_scan(kernel: NUTS, latent: str, length: int, static: tuple, treedef: Any,
               positions: tuple, state: Any, params: dict, arrays: tuple) -> tuple[Any, Any]:
    args, kwargs = join(static, treedef, positions, arrays)
    model_args = (params,) + tuple(args)
    post = kernel.postprocess_fn(model_args, kwargs)

    def body(carry: Any, _: Any) -> Any:
        s, n, e = carry
        s = kernel.sample(s, model_args, kwargs)
        return (s, n + post(s.z)[latent] / length, e + s.potential_energy / length), None

    zero = post(state.z)[latent] * 0.0
    (state, n, e), _ = jax.lax.scan(body, (state, zero, 0.0), None, length=length)
    return state, (n, e)
