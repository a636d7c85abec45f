r"""The exact count sites of a user's NumPyro model, and the releases that read them.

A model in which the true tables are latent has one or more sample sites whose distribution is
an exact :class:`~numpyro_dpgm.distributions.CollectiveGraphicalModel` (the *count sites*,
integer tables, which NUTS cannot move), observed through this library's noise distributions
(:class:`~numpyro_dpgm.distributions.LaplaceNoise`, ``GaussianNoise``, ``DiscreteLaplaceNoise``,
``DiscreteGaussianNoise``, or NumPyro's ``Laplace`` and ``Normal``; the *noise sites*) whose
``loc`` is an affine function of the tables:
the tables themselves, a marginal, a linear query, a sum of two regions' tables. Everything else
in the model (priors on ``θ``, hierarchies, regressions, plates) is free.

:func:`count_layout` traces the model once and finds, by perturbing the tables, every site that
depends on them. It returns a :class:`CountLayout`: for every count site its network, totals and
the sparse linear map ``J`` from its flattened tables to the flattened answers of all noise
sites, ``loc = J n + c`` (computed column by column with ``jax.linearize``, checked to be affine
and not to depend on other latent sites). The record moves of :mod:`.count_gibbs` read a move's
change of the answers from the map's columns. A model outside this class gets a
:class:`CountSiteError` that names the site and says why.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.gibbs import prototype_trace

from ...distributions.cgm import CollectiveGraphicalModel
from ...distributions.noise import DiscreteGaussian1, DiscreteLaplace1
from ...network import MarkovNetwork

__all__ = [
    "NOISE_FAMILIES",
    "CountLayout",
    "CountSite",
    "CountSiteError",
    "NoiseSite",
    "count_layout",
    "count_networks",
    "exact_count_sites",
    "inner_distribution",
    "split_sites",
]

Array = Any

#: The elementwise noise distributions a count site may be observed through, in family-code
#: order: those of ``LaplaceNoise``, ``GaussianNoise``, ``DiscreteLaplaceNoise`` and
#: ``DiscreteGaussianNoise`` (NumPyro's ``Laplace`` and ``Normal``, wrapped by ``to_event`` or a
#: plate, are the same observation models).
NOISE_FAMILIES = (dist.Laplace, dist.Normal, DiscreteLaplace1, DiscreteGaussian1)

#: Entries of the linear map's columns computed at once (bounds the memory of a chunk).
_CHUNK_ENTRIES = 4_000_000


class CountSiteError(ValueError):
    """A model whose count sites the exact record moves cannot update; the message names the
    site and why."""


class CountSite(NamedTuple):
    """One exact CGM site of a model.

    Attributes
    ----------
    name : str
    network : MarkovNetwork
        The CGM's network (flat layout of one set of tables, ``P = network.num_params``).
    batch_shape : tuple
        The value's shape is ``batch_shape + (P,)`` (a plate of regions, a batch of releases).
    totals : ndarray of int, shape ``batch_shape``
        ``N`` of each set of tables.
    rows : int32 ndarray ``(B·P, w)``
        For every flattened cell, the answers (indices into the concatenated answers of the
        noise sites) its count enters; padded with ``num_answers``.
    coefs : ndarray ``(B·P, w)``
        The matching entries of the linear map (0 at the padding).
    """

    name: str
    network: MarkovNetwork
    batch_shape: tuple
    totals: np.ndarray
    rows: np.ndarray
    coefs: np.ndarray


class NoiseSite(NamedTuple):
    """One observed noise site that reads count tables.

    Attributes
    ----------
    name : str
    family : int
        Index into :data:`NOISE_FAMILIES`.
    answers : slice
        Its (flattened) answers in the concatenated answer vector.
    shape : tuple
        The observed value's shape.
    """

    name: str
    family: int
    answers: slice
    shape: tuple


class CountLayout(NamedTuple):
    """The count sites of a model and the noise sites that read them (:func:`count_layout`)."""

    counts: tuple
    noise: tuple
    num_answers: int

    @property
    def families(self) -> np.ndarray:
        """Family code of every answer, with one padding entry (Laplace) at the end."""
        out = np.zeros(self.num_answers + 1, dtype=np.int32)
        for s in self.noise:
            out[s.answers] = s.family
        return out


def inner_distribution(fn: Any) -> Any:
    """``fn`` without the wrappers plates and ``to_event`` put around it (``Expanded``,
    ``Independent``, the noise classes themselves), down to a CGM or one of
    :data:`NOISE_FAMILIES`; else the innermost."""
    while not (isinstance(fn, CollectiveGraphicalModel) or type(fn) in NOISE_FAMILIES):
        if not isinstance(fn, dist.ExpandedDistribution | dist.Independent):
            return fn
        fn = fn.base_dist
    return fn


def _is_exact_cgm(site: dict) -> bool:
    if site["type"] != "sample" or site["is_observed"]:
        return False
    fn = inner_distribution(site["fn"])
    return isinstance(fn, CollectiveGraphicalModel) and not fn.relaxed


def exact_count_sites(model_trace: Any) -> tuple[str, ...]:
    """Names of the latent sample sites of a trace whose distribution is an exact CGM (the
    ``sites`` of the record-move block of :class:`numpyro.infer.Gibbs`)."""
    return tuple(name for name, site in model_trace.items() if _is_exact_cgm(site))


def split_sites(model: Any, model_args: tuple = (), model_kwargs: dict | None = None,
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(count sites, other latent sample sites)`` of ``model``, from one prototype trace."""
    with jax.ensure_compile_time_eval():
        tr = prototype_trace(model, jax.random.key(0), model_args, dict(model_kwargs or {}))
    counts = exact_count_sites(tr)
    others = tuple(k for k, s in tr.items() if s["type"] == "sample" and not s["is_observed"]
                   and k not in counts)
    return counts, others


def count_networks(model: Any, model_args: tuple = (), model_kwargs: dict | None = None,
                   ) -> dict[str, tuple[MarkovNetwork, Any]]:
    """``{count site: (network, total_count)}`` of ``model``, from one prototype trace."""
    with jax.ensure_compile_time_eval():
        tr = prototype_trace(model, jax.random.key(0), model_args, dict(model_kwargs or {}))
    fns = {k: inner_distribution(tr[k]["fn"]) for k in exact_count_sites(tr)}
    return {k: (fn.network, fn.total_count) for k, fn in fns.items()}


def _latent_values(tr: Any) -> dict[str, Array]:
    return {k: s["value"] for k, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}


def _run(model: Any, args: tuple, kwargs: dict, values: dict) -> Any:
    seeded = handlers.seed(handlers.substitute(model, data=values), jax.random.key(0))
    return handlers.trace(seeded).get_trace(*args, **kwargs)


def _concrete_totals(name: str, fn: CollectiveGraphicalModel, batch: tuple) -> np.ndarray:
    try:
        totals = np.broadcast_to(np.asarray(fn.total_count), batch)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise CountSiteError(
            f"site {name!r}: the record moves need a concrete total_count (a number, not a "
            "value computed from other sites or traced); pass N as data to the model") from None
    if np.any(totals < 0) or np.any(totals != np.round(totals)):
        raise CountSiteError(f"site {name!r}: total_count must be non-negative integers, got "
                             f"{totals}")
    return totals.astype(np.int64)


def _check_site(name: str, site: dict, counts: str) -> None:
    """Raise unless ``site`` (which depends on the count site ``counts``) is a noise site the
    record moves can read."""
    fn = inner_distribution(site["fn"])
    kinds = "LaplaceNoise, GaussianNoise, DiscreteLaplaceNoise, DiscreteGaussianNoise"
    if site["type"] != "sample" or not site["is_observed"]:
        raise CountSiteError(
            f"latent site {name!r} depends on the exact count tables {counts!r}; the record "
            "moves update the tables given every other site, so only observed noise sites "
            f"({kinds}) may read them. Make {name!r} observed, or use a relaxed CGM site "
            "(relaxed=True) and plain NUTS")
    if type(fn) not in NOISE_FAMILIES:
        raise CountSiteError(
            f"observed site {name!r} ({type(fn).__name__}) depends on the exact count tables "
            f"{counts!r}; the record moves read the tables through this library's noise "
            f"distributions only ({kinds})")
    if site.get("mask") is not None or site.get("scale") is not None:
        raise CountSiteError(f"noise site {name!r} is masked or scaled (handlers.mask/scale); "
                             "the record moves need its full likelihood")


def _loc_map(model: Any, args: tuple, kwargs: dict, values: dict, count: str,
             names: list[str]) -> Any:
    """``n ↦`` the concatenated flattened ``loc`` of the noise sites ``names``."""

    def loc(n: Array) -> Array:
        tr = _run(model, args, kwargs, {**values, count: n})
        return jnp.concatenate([
            jnp.ravel(jnp.broadcast_to(inner_distribution(tr[s]["fn"]).loc,
                                       jnp.shape(tr[s]["value"]))) for s in names])

    return loc


def _columns(lin: Any, shape: tuple, num_answers: int, offset_of: np.ndarray,
             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The nonzero entries of every column of the linear map ``lin`` (on tables of ``shape``)."""
    size = int(np.prod(shape))
    chunk = max(1, min(size, _CHUNK_ENTRIES // max(num_answers, 1)))
    apply = jax.jit(jax.vmap(lambda t: lin(jnp.reshape(t, shape))))
    rows, coefs = [], []
    for start in range(0, size, chunk):
        stop = min(size, start + chunk)
        eye = np.zeros((stop - start, size))
        eye[np.arange(stop - start), np.arange(start, stop)] = 1.0
        block = np.asarray(apply(jnp.asarray(eye)))
        for col in block:
            nz = np.flatnonzero(col)
            rows.append(offset_of[nz])
            coefs.append(col[nz])
    return rows, coefs


def _padded(rows: list[np.ndarray], coefs: list[np.ndarray], pad: int
            ) -> tuple[np.ndarray, np.ndarray]:
    width = max(1, max(len(r) for r in rows))
    out_r = np.full((len(rows), width), pad, dtype=np.int32)
    out_c = np.zeros((len(rows), width))
    for i, (r, c) in enumerate(zip(rows, coefs, strict=True)):
        out_r[i, :len(r)], out_c[i, :len(c)] = r, c
    return out_r, out_c


def _affine_check(name: str, count: str, loc: Any, lin: Any, n0: Array, other: Any,
                  rng: np.random.Generator) -> None:
    """Raise unless ``loc`` is affine in the tables with a map that does not move with the
    other latent sites (``other``: the linear part at another draw of them)."""
    d = jnp.asarray(rng.normal(0.0, 3.0, np.shape(n0)))
    base = loc(n0)
    scale = 1.0 + float(jnp.max(jnp.abs(base)))
    if float(jnp.max(jnp.abs(loc(n0 + d) - base - lin(d)))) > 1e-8 * scale:
        raise CountSiteError(f"the loc of noise site(s) {name} is not an affine function of "
                             f"the count tables {count!r}; the record moves need loc = J n + c")
    if float(jnp.max(jnp.abs(other(d) - lin(d)))) > 1e-8 * scale:
        raise CountSiteError(f"the map from the count tables {count!r} to the loc of noise "
                             f"site(s) {name} changes with other latent sites; the record "
                             "moves need loc = J n + c with J fixed (c may depend on them)")


def count_layout(model: Any, model_args: tuple = (), model_kwargs: dict | None = None,
                 ) -> CountLayout:
    """Find the exact count sites of ``model`` and the linear maps to the noise sites.

    Parameters
    ----------
    model : callable
        A NumPyro model with at least one exact CGM site.
    model_args, model_kwargs
        Its arguments; they must be concrete (the layout is static).

    Returns
    -------
    CountLayout

    Raises
    ------
    CountSiteError
        No exact CGM site; a total count that is not concrete; a latent site, or an observed
        site that is not one of :data:`NOISE_FAMILIES`, that depends on the tables; a noise
        ``loc`` that is not affine in them, or whose map moves with other latent sites.
    """
    kwargs = dict(model_kwargs or {})
    with jax.ensure_compile_time_eval():
        try:
            proto = prototype_trace(model, jax.random.key(0), model_args, kwargs)
            other = prototype_trace(model, jax.random.key(1), model_args, kwargs)
        except jax.errors.ConcretizationTypeError:
            raise CountSiteError("the exact record moves need concrete model arguments (the "
                                 "sites' layout is static); do not trace the model") from None
        names = exact_count_sites(proto)
        if not names:
            raise CountSiteError("the model has no latent site with an exact "
                                 "CollectiveGraphicalModel (relaxed=False)")
        values, values2 = _latent_values(proto), _latent_values(other)
        rng = np.random.default_rng(0)
        deps = {c: _dependents(model, model_args, kwargs, proto, values, c, names, rng)
                for c in names}
        noise_names = [s for s in proto if any(s in d for d in deps.values())]
        noise, start = [], 0
        for s in noise_names:
            fn = inner_distribution(proto[s]["fn"])
            shape = tuple(np.shape(proto[s]["value"]))
            size = int(np.prod(shape))
            family = next(i for i, c in enumerate(NOISE_FAMILIES) if type(fn) is c)
            noise.append(NoiseSite(s, family, slice(start, start + size), shape))
            start += size
        counts = [_count_site(model, model_args, kwargs, proto, values, values2, c,
                              [s for s in noise if s.name in deps[c]], start, rng)
                  for c in names]
    return CountLayout(tuple(counts), tuple(noise), start)


def _dependents(model: Any, args: tuple, kwargs: dict, proto: Any, values: dict, count: str,
                names: tuple, rng: np.random.Generator) -> list[str]:
    """Sample sites whose log density moves with the tables of ``count`` (checked usable)."""
    others = [k for k, s in proto.items() if s["type"] == "sample" and k != count]

    def log_probs(n: Array) -> Array:
        tr = _run(model, args, kwargs, {**values, count: n})
        return jnp.stack([jnp.sum(tr[k]["fn"].log_prob(tr[k]["value"])) for k in others])

    n0 = jnp.asarray(proto[count]["value"], dtype=jnp.result_type(float))
    tangent = jnp.asarray(rng.normal(size=np.shape(n0)))
    _, moved = jax.jvp(log_probs, (n0,), (tangent,)) if others else (None, jnp.zeros(0))
    deps = [k for k, m in zip(others, np.asarray(moved), strict=True) if m != 0.0]
    for k in deps:
        if k in names:
            raise CountSiteError(f"count site {k!r} depends on count site {count!r}; the "
                                 "record moves need the tables of each exact CGM site to be "
                                 "read only by noise sites")
        _check_site(k, proto[k], count)
    return deps


def _count_site(model: Any, args: tuple, kwargs: dict, proto: Any, values: dict,
                values2: dict, count: str, readers: list, num_answers: int,
                rng: np.random.Generator) -> CountSite:
    """The :class:`CountSite` of ``count``, read by the noise sites ``readers``."""
    site = proto[count]
    if site.get("mask") is not None or site.get("scale") is not None:
        raise CountSiteError(f"count site {count!r} is masked or scaled (handlers.mask/scale);"
                             " the record moves need its full distribution")
    fn = inner_distribution(site["fn"])
    n0 = jnp.asarray(site["value"], dtype=jnp.result_type(float))
    batch = tuple(n0.shape[:-1])
    totals = _concrete_totals(count, fn, batch)
    size = int(np.prod(n0.shape))
    if not readers:
        rows = np.full((size, 1), num_answers, dtype=np.int32)
        return CountSite(count, fn.network, batch, totals, rows, np.zeros((size, 1)))
    offset_of = np.concatenate([np.arange(s.answers.start, s.answers.stop) for s in readers])
    label = ", ".join(repr(s.name) for s in readers)
    names = [s.name for s in readers]
    loc = _loc_map(model, args, kwargs, values, count, names)
    _, lin = jax.linearize(loc, n0)
    _, lin2 = jax.linearize(_loc_map(model, args, kwargs, values2, count, names), n0)
    _affine_check(label, count, loc, lin, n0, lin2, rng)
    rows, coefs = _columns(lin, n0.shape, len(offset_of), offset_of)
    rows, coefs = _padded(rows, coefs, num_answers)
    return CountSite(count, fn.network, batch, totals, rows, coefs)
