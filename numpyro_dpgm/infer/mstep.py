"""The M-step of EM on collective graphical models: moment matching on expected counts.

``θ_{t+1} = argmax_θ θ·n − N·A(θ)`` for strictly positive consistent count tables ``n`` (an
NLBP mode, a variational mean or a Monte-Carlo mean): the maximiser matches the moments,
``μ(θ_{t+1}) = n / N``. Closed form on decomposable networks (clique over separator on the
junction tree), iterative proportional fitting, or L-BFGS
(:func:`~numpyro_dpgm.oracles.mle.fit_theta` without penalty).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from ..distributions.constraints import decomposable_layout
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.mle import fit_theta
from ..tables import CliqueTables, project_table

__all__ = ["m_step"]

Array = Any


def _closed_form(network: MarkovNetwork, n: Array) -> Array:
    """``θ_C = log n_C − log n_{S(C)}`` on the junction tree of a decomposable network."""
    layout = decomposable_layout(network)
    tree = jt.build_junction_tree(layout.covered, "min_fill")
    tables = network.unflatten(n)
    out = {c: jnp.zeros(s, dtype=n.dtype) for c, s in zip(network.cliques, network.shapes,
                                                        strict=True)}
    for i, c in enumerate(layout.tree_cliques):
        sep = tree.separators[i] if tree.parent[i] >= 0 else ()
        log_c = jnp.log(tables[c])
        if sep:
            log_s = jnp.log(project_table(tables[c], c, sep))
            shape = tuple(network.domain[a] if a in sep else 1 for a in c)
            order = tuple(a for a in c if a in sep)
            log_s = jnp.reshape(project_table(log_s, sep, order), shape)
            log_c = log_c - log_s
        out[c] = log_c
    return network.flatten(CliqueTables(out))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _ipf(network: MarkovNetwork, n: Array, theta: Array, sweeps: int) -> Array:
    total = jnp.sum(network.unflatten(n)[network.cliques[0]])

    def sweep(_, th):
        for j, c in enumerate(network.cliques):
            mu = jt.marginals(network, th)[c]
            sl = network.slice_of(c)
            update = jnp.log(network.unflatten(n)[c] / total) - jnp.log(mu)
            th = th.at[sl].add(jnp.ravel(update))
            del j
        return th

    return jax.lax.fori_loop(0, sweeps, sweep, theta)


def m_step(
    network: MarkovNetwork, n: Array, theta: Array | None = None, method: str = "auto",
    *, ipf_sweeps: int = 50,
) -> Array:
    """Moment matching ``argmax_θ θ·n − N·A(θ)`` for strictly positive consistent ``n``.

    Parameters
    ----------
    network : MarkovNetwork
    n : array ``(num_params,)``
        Count tables in the network's layout (an E-step's ``n̂``), summing to ``N`` per clique.
    theta : array ``(num_params,)``, optional
        Starting log-potentials of the iterative methods (default zero).
    method : {"auto", "closed_form", "ipf", "lbfgs"}
        ``"auto"`` picks the closed form on decomposable networks and L-BFGS otherwise.
    ipf_sweeps : int
        Sweeps over the cliques of ``"ipf"``.

    Returns
    -------
    array ``(num_params,)``
        ``θ`` with ``μ(θ) = n / N`` (up to the solver's tolerance for ``"ipf"``/``"lbfgs"``).
    """
    n = jnp.asarray(n)
    if method == "auto":
        method = "closed_form" if _decomposable(network) else "lbfgs"
    if method == "closed_form":
        return _closed_form(network, n)
    theta = jnp.zeros_like(n) if theta is None else jnp.asarray(theta)
    if method == "ipf":
        return _ipf(network, n, theta, int(ipf_sweeps))
    if method == "lbfgs":
        total = jnp.sum(network.unflatten(n)[network.cliques[0]])
        return fit_theta(network, n / total, 0.0, init=theta).theta
    raise ValueError(f"unknown M-step {method!r}; use 'auto', 'closed_form', 'ipf' or 'lbfgs'")


def _decomposable(network: MarkovNetwork) -> bool:
    try:
        decomposable_layout(network)
    except ValueError:
        return False
    return True
