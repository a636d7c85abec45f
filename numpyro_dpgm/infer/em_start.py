"""Where EM on a model of your own starts: the consistent fit of the noisy tables it releases.

:class:`~numpyro_dpgm.infer.em.EM`'s default start (``init="noisy"``) reads, from a trace of the
model, the whole clique tables that its noise sites release (the library's four noise
distributions whose ``loc`` reads the latent tables cell by cell: ``n`` itself, a slice or a
permutation of it, plus a constant), and fits them as naive MLE does (CGM-EM's own start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpyro import handlers

from ..distributions.noise import (
    DiscreteGaussianNoise,
    DiscreteLaplaceNoise,
    GaussianNoise,
    LaplaceNoise,
)
from ..measurements import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace, Measurement
from ..network import MarkovNetwork
from ..oracles.mle import default_l2, fit_theta, project_simplex, vanishing_floor

__all__ = ["NOISE_SPECS", "noise_spec", "noisy_start", "noisy_tables", "selected_cells",
           "trace_at", "whole_tables"]

#: The library's observation models and the NoiseSpec of the release each one models.
NOISE_SPECS = ((LaplaceNoise, Laplace), (GaussianNoise, Gaussian),
               (DiscreteLaplaceNoise, DiscreteLaplace), (DiscreteGaussianNoise, DiscreteGaussian))


def trace_at(model: Callable, key: Any, data: dict, args: tuple, kwargs: dict) -> Any:
    """A trace of ``model`` with the values of ``data`` substituted."""
    seeded = handlers.substitute(handlers.seed(model, key), data=data)
    return handlers.trace(seeded).get_trace(*args, **kwargs)


def noise_spec(site: dict) -> type | None:
    """The NoiseSpec class of an observed site of one of the library's noise models."""
    if site["type"] != "sample" or not site["is_observed"]:
        return None
    for model, spec in NOISE_SPECS:
        if isinstance(site["fn"], model):
            return spec
    return None


def selected_cells(loc: Callable[[Any], np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Which cell of ``n`` each entry of ``loc(n)`` reads: ``loc_i(n) = n_j + c_i``.

    Three probes: ``n = 0`` gives ``c``, ``n_j = j + 1`` names ``j`` and ``n_j = (j + 1)²``
    confirms it (an entry that mixes or scales cells, or is not affine in ``n``, fails one of
    them). Returns ``(cells, c)`` with ``cells[i] = −1`` where entry ``i`` reads no one cell.
    """
    probe = np.arange(1.0, size + 1.0)
    offset = np.asarray(loc(np.zeros(size)), dtype=float)
    first = np.asarray(loc(probe), dtype=float) - offset
    cells = np.rint(first).astype(int) - 1
    ok = (np.abs(first - cells - 1) < 1e-6) & (cells >= 0) & (cells < size)
    cells = np.where(ok, cells, 0)
    second = np.asarray(loc(probe**2), dtype=float) - offset
    ok &= np.isclose(second, probe[cells] ** 2, rtol=1e-9, atol=1e-6)
    return np.where(ok, cells, -1), offset


def whole_tables(network: MarkovNetwork, cells: np.ndarray, y: np.ndarray, scale: np.ndarray,
                 spec: type) -> list[Measurement]:
    """Identity measurements of the cliques each of whose cells exactly one entry of ``y``
    reads (``cells``: the cell each entry reads, −1 for none)."""
    out = []
    for clique in network.cliques:
        sl = network.slice_of(clique)
        rows = np.flatnonzero((cells >= sl.start) & (cells < sl.stop))
        cols = cells[rows] - sl.start
        if rows.size != sl.stop - sl.start or np.unique(cols).size != rows.size:
            continue
        values = np.empty(rows.size)
        values[cols] = y[rows]
        out.append(Measurement(clique, values, spec(float(np.sqrt(np.mean(scale[rows] ** 2))))))
    return out


def noisy_tables(model: Callable, latent: str, key: Any, tr: Any, args: tuple,
                 kwargs: dict) -> list[Measurement]:
    """The whole clique tables that the model's noise sites release, as measurements.

    ``tr`` is a trace of ``model`` (the CGM site ``latent`` at any value). A site counts when
    its distribution is one of the library's four noise models; each entry of its ``loc`` that
    reads one cell of the latent tables (plus a constant, found by :func:`selected_cells`) is
    that cell's noisy answer, and a clique whose every cell one entry reads gives an identity
    measurement (its scale: the root mean square of those entries' scales).
    """
    network = tr[latent]["fn"].network
    values = {k: s["value"] for k, s in tr.items()
              if k != latent and s["type"] in ("param", "sample")}
    tables = []
    for name, site in tr.items():
        spec = noise_spec(site)
        if spec is None:
            continue

        def loc(n: Any, name: str = name) -> np.ndarray:
            fn = trace_at(model, key, dict(values, **{latent: n}), args, kwargs)[name]["fn"]
            return np.ravel(np.broadcast_to(fn.base_dist.loc, fn.shape()))

        cells, offset = selected_cells(loc, network.num_params)
        scale = np.ravel(np.broadcast_to(site["fn"].base_dist.scale, site["fn"].shape()))
        tables += whole_tables(network, cells, np.ravel(site["value"]) - offset, scale, spec)
    return tables


def noisy_start(model: Callable, latent: str, key: Any, tr: Any, args: tuple,
                kwargs: dict) -> Any:
    """``θ`` of the consistent fit of the clipped noisy tables: naive MLE's fit (every
    clique's noisy table projected onto the simplex, then the L2-regularised MLE with naive
    MLE's default strength per clique, :func:`~numpyro_dpgm.oracles.mle.default_l2` floored at
    :func:`~numpyro_dpgm.oracles.mle.vanishing_floor`), or ``None`` when the model does not
    release a whole table of every clique of the network."""
    tables = {m.clique: m for m in reversed(noisy_tables(model, latent, key, tr, args, kwargs))}
    fn = tr[latent]["fn"]
    network, total = fn.network, float(fn.total_count)
    if not tables or any(c not in tables for c in network.cliques):
        return None
    floor = vanishing_floor(total)
    mu, lam = [], []
    for c in network.cliques:
        m = tables[c]
        mu.append(np.ravel(project_simplex(np.asarray(m.values, dtype=float) / total)))
        b = float(np.sqrt(m.noise.variance / 2.0))  # the Laplace-equivalent scale
        size = mu[-1].size
        lam.append(np.full(size, max(default_l2(b, total, 0.0, cells=size), floor)))
    return fit_theta(network, np.concatenate(mu), np.concatenate(lam)).theta
