"""Monte-Carlo EM on the relaxed collective graphical model.

E-step: the mean of NUTS draws of the latent count tables ``n`` from ``p(n | y; θ_t)`` (the
relaxed CGM with the ``lgamma`` density, sampled through the junction-tree stick-breaking
bijection); M-step: moment matching ``μ(θ_{t+1}) = n̄_t / N`` (seed 002, Algorithm 2 with the
posterior mean in place of NLBP's mode; Wei & Tanner 1990 for Monte-Carlo EM). The chain is
warm-started: the first E-step adapts step size and mass matrix, later ones continue from the
last state of the previous chain (its adapted step size) without new warm-up, and the number of
draws grows with the iteration (few early, when ``θ_t`` is far from the fixed point and
Monte-Carlo error is irrelevant; more later, when it dominates the step).

On a network that is not decomposable, ``n`` holds the tables of its triangulation's
junction-tree cliques (see :func:`~numpyro_dpgm.estimation.variational_em.latent_counts_model`).
The loop is :class:`numpyro_dpgm.infer.EM` with ``estep="mcmc"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from numpyro.infer import NUTS

from ..measurements import Measurement
from ..network import MarkovNetwork
from .result import Result
from .variational_em import EStepResult, conditioned_on_params, run_em_estimator

__all__ = ["MCMCEStep", "draw_schedule", "mcem"]

Array = Any


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
        from ..infer.bayes import init_to_interior

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
        from ..infer.handlers import split_static

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


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _nuts_scan(kernel: NUTS, latent: str, length: int, static: tuple, treedef: Any,
               positions: tuple, state: Any, params: dict, arrays: tuple) -> tuple[Any, Any]:
    from ..infer.handlers import _join

    args, kwargs = _join(static, treedef, positions, arrays)
    model_args = (params,) + tuple(args)
    post = kernel.postprocess_fn(model_args, kwargs)

    def body(carry: Any, _: Any) -> Any:
        s, n, e = carry
        s = kernel.sample(s, model_args, kwargs)
        return (s, n + post(s.z)[latent] / length, e + s.potential_energy / length), None

    zero = post(state.z)[latent] * 0.0
    (state, n, e), _ = jax.lax.scan(body, (state, zero, 0.0), None, length=length)
    return state, (n, e)


def mcem(
    measurements: Sequence[Measurement],
    network: MarkovNetwork,
    total_count: int,
    max_em_iters: int = 10,
    init: str | Array = "naive",
    *,
    key: Any = None,
    num_warmup: int = 200,
    first_draws: int = 25,
    last_draws: int = 400,
    growth: float = 2.0,
    max_tree_depth: int = 8,
    chunk: int = 25,
    tol: float = 1e-4,
) -> Result:
    """Learn an MRF from noisy clique tables by Monte-Carlo EM on the relaxed CGM.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers (one noise family); every measured clique must lie in a clique of
        ``network``.
    network : MarkovNetwork
        Any network (not decomposable: the latent counts are its triangulation's tables).
    total_count : int
        ``N`` (public).
    max_em_iters : int
        EM iterations.
    init : {"naive", "zeros"} or array
        ``θ₀``: naive MLE with its default L2 rule, uniform, or given log-potentials.
    key : JAX PRNG key, optional
    num_warmup, first_draws, last_draws, growth, max_tree_depth, chunk :
        :class:`MCMCEStep` options (draws per E-step: ``min(last, first·growth^t)``, rounded up
        to multiples of ``chunk``).
    tol : float
        Stop when the model's clique marginals move by less than ``tol`` (L1, per clique);
        Monte-Carlo error keeps the change above a few ``/√draws``, so MCEM usually runs its
        ``max_em_iters``.

    Returns
    -------
    Result
        ``loss_trace``: minus the mean log joint density of each E-step's draws; ``extras``:
        ``n_hat`` (last E-step's mean), ``latent_network``, ``marginal_change``, ``init``,
        ``relaxation_leak`` (as :func:`~numpyro_dpgm.estimation.variational_em.variational_em`).
    """
    options = dict(num_warmup=num_warmup, first_draws=first_draws, last_draws=last_draws,
                   growth=growth, max_tree_depth=max_tree_depth, chunk=chunk)
    key = jax.random.key(0) if key is None else key
    return run_em_estimator(measurements, network, total_count, init, key, max_em_iters, tol,
                            "mcmc", options)
