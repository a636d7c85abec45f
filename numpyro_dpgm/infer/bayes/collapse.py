r"""The ``collapse`` effect handler: the exact CGM sites of a model integrated out.

Where a release pins many counts, NUTS on ``(θ, n)`` jointly fails (on 226,051 records, 319
cells, Laplace ε = 1: R-hat 108, every draw at the maximum depth) and record swaps crawl. The
collapsed path samples an approximation of the model in which ``θ``'s update sees the release
through a smooth, low-dimensional density, for any NumPyro model (the library's
:class:`~.model.NoisyMarginalsModel` with exact tables among them) whose latent tables are exact
:class:`~numpyro_dpgm.distributions.CollectiveGraphicalModel` sites read by Laplace or Gaussian
noise sites (``LaplaceNoise``, ``GaussianNoise``, NumPyro's ``Laplace`` and ``Normal``) through
``loc = J n + c`` (:func:`~.count_sites.count_layout`):

- the CGM of the tables is replaced by its normal relaxation
  (:mod:`numpyro_dpgm.distributions.normal_cgm`): ``n = Nμ(θ) + L(θ) z`` with the CGM's exact
  mean and covariance;
- Laplace noise is a scale mixture, ``e_i ∣ v_i ∼ N(0, v_i)``, ``v_i ∼ Exp(1/(2b_i²))``
  (Gaussian noise: ``v_i = σ_i²`` fixed);
- so ``n`` integrates out. Under :class:`collapse` each count site ``n`` with log-potentials
  ``θ`` (whatever the model computes them from) becomes

.. math::

    v_i \sim \operatorname{Exp}\big(1/(2b_i^2)\big)\ \text{(Laplace answers)},\quad
    ξ \sim \mathcal N(0, I),\quad
    y − c \mid θ, v \sim \mathcal N\big(J Nμ(θ),\ J NΣ(θ) J^⊤ + \operatorname{diag} v\big),
    \quad n = \mathrm{tables}_θ\big(z(θ, v, y, ξ)\big),                                  \tag{1}

with the sites ``{name}_v``, ``{name}_xi`` (latent), ``{name}_release`` (observed: the density
of the answers with the tables integrated out, by the tree pass of :mod:`.collapsed_tree`, one
pass each way along the junction tree with a diagonal-plus-low-rank factor per clique, not the
dense ``(Σ_K |K|)³``) and ``n`` itself deterministic: a draw from its exact conditional given
``(θ, v, y)`` whenever ``ξ`` is standard normal and independent of ``(θ, v)``
(:func:`~.collapsed_tree.tree_conditional_coordinates`: ``z`` drawn block by block from the
root, ``ξ`` its standard normal input). The noise sites stay in the trace, masked: their
likelihood is in ``{name}_release``. Every other site of the model is untouched.

One MCMC step (:func:`collapse_kernel`, blocks of :class:`numpyro.infer.Gibbs`) leaves the
joint posterior of the model's parameters, ``v`` and ``ξ`` invariant:

1. ``ξ ∼ N(0, I)``, its exact conditional;
2. ``v``: draw ``n* ∼ p(n | θ, v, y)`` with a key of its own, then ``1/v_i ∼
   InverseGaussian(1/(b|y_i − (Jn*)_i|), 1/b²)``: two steps of data augmentation on
   ``(n, v)`` given ``θ``, which leave ``p(v | θ, y)`` invariant;
3. NUTS on the model's other latent sites given ``v``, with ``n`` integrated out.

So each stored draw's ``n`` comes from ``p(n | θ, v, y)`` at the draw's own ``θ`` and ``v``:
unlike the cycle ``n | θ, v → v | n → θ | v``, whose stored ``n`` belongs to the previous
``θ``. :func:`~.nuts.run_nuts` runs it (``collapsed=True``, or by default on large releases).

The plan (:func:`collapse_plan`) is static: it holds the answers ``y``, their offsets ``c`` and
noise scales, read from the model's arguments, which must be the run's (the offsets and scales
may not depend on latent sites).

>>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
>>> from numpyro import handlers
>>> from numpyro_dpgm import MarkovNetwork
>>> from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
>>> numpyro.enable_x64()
>>> net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
>>> def model(y):
...     theta = numpyro.sample("theta", dist.Normal(0, 3).expand([6]).to_event(1))
...     n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, 1000))
...     numpyro.sample("y", LaplaceNoise(n, 2.0), obs=y)
>>> y = jnp.array([150.0, 170, 180, 160, 170, 170])
>>> plan = collapse_plan(model, (y,))
>>> tr = handlers.trace(handlers.seed(collapse(model, plan), 0)).get_trace(y)
>>> n, v = tr["n"], tr["n_v"]
>>> n["type"], v["value"].shape, round(float(n["value"].sum()), 6)
('deterministic', (6,), 1000.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import NUTS, CustomGibbs, Gibbs
from numpyro.infer.gibbs import prototype_trace
from numpyro.primitives import Messenger

from ..._cache import LRUCache
from ...distributions.normal_cgm import normal_tables, normal_tables_plan, tree_conditionals
from .collapsed_tree import (
    ReleaseTree,
    TreeFunctions,
    TreeReleaseNormal,
    release_tree,
    tree_functions,
)
from .count_sites import CountSiteError, count_layout, inner_distribution
from .gibbs import ExactState
from .laplace_mixture import noise_variances

__all__ = ["MAX_SITE_PASSES", "PATH_REASON", "CollapsePlan", "CollapsedSite", "SiteFunctions",
           "collapse", "collapse_kernel", "collapse_plan", "collapse_start", "gibbs_values",
           "site_functions", "site_passes"]

Array = Any

#: What the collapsed path is (the start of ``mcmc.path_reason``).
PATH_REASON = ("collapsed Gibbs: the counts integrated out of θ's update under the normal "
               "relaxation of the CGM (Laplace noise as a normal scale mixture)")

#: Most count sites' trees and compiled passes kept, by network, read-out and ``N`` (least
#: recently used evicted first): a later release of the same structure, in the same process,
#: reuses them instead of compiling them again (on a 200-cell chain, 6.9 s of a later
#: release's 17.6 s of compilation; by hand, docs/measurements.md).
MAX_SITE_PASSES = 16
_SITE_PASSES: LRUCache = LRUCache(MAX_SITE_PASSES)

#: Family codes of :data:`~.count_sites.NOISE_FAMILIES` the collapsed path reads: Laplace, normal.
_LAPLACE, _NORMAL = 0, 1


class SiteFunctions(NamedTuple):
    """A count site's computations of (1), compiled (:func:`site_functions`).

    Attributes
    ----------
    conditionals : callable
        ``conditionals(θ, normalized)``: the normal relaxation's ``(μ_S, p(r | s))`` per block.
    tree : TreeFunctions
        The release tree's passes (:func:`~.collapsed_tree.tree_functions`).
    tables : callable
        ``tables(conditionals, z)``: the tables at the relaxation's coordinates ``z``.
    """

    conditionals: Callable
    tree: TreeFunctions
    tables: Callable


def site_passes(network: Any, read: np.ndarray, total: float) -> tuple[ReleaseTree, SiteFunctions]:
    """The release tree of a count site on ``network`` whose answers read its flattened tables
    through ``read`` (``J``), and its :func:`site_functions` at ``N = total``: built once per
    structure and kept (:data:`MAX_SITE_PASSES`), since neither depends on the answers' values.

    Raises
    ------
    ValueError
        As :func:`~.collapsed_tree.release_tree`, or where the network is not decomposable.
    """
    key = (network, read.shape, read.tobytes(), float(total))
    found = _SITE_PASSES.get(key)
    if found is None:
        tree = release_tree(normal_tables_plan(network), lambda n: jnp.asarray(read) @ n)
        found = _SITE_PASSES[key] = (tree, site_functions(tree, total))
    return found


def site_functions(tree: ReleaseTree, total: float) -> SiteFunctions:
    """:class:`SiteFunctions` of a count site with release tree ``tree`` and ``N = total``,
    each one compiled program (NumPyro's set-up runs a model op by op outside a compiled
    program; see :func:`~.collapsed_tree.tree_functions`)."""
    plan = tree.plan
    return SiteFunctions(
        jax.jit(lambda theta, normalized: tree_conditionals(plan, theta, normalized),
                static_argnums=1),
        tree_functions(tree, total),
        jax.jit(lambda conds, z: normal_tables(plan, conds, total, z)))


class CollapsedSite(NamedTuple):
    """One count site of (1).

    Attributes
    ----------
    name : str
    tree : ReleaseTree
        The junction tree of the normal relaxation with the answers that read each clique.
    total : float
        ``N``.
    observed : ndarray ``(answers,)``
        ``y − c``: the answers less the part of their ``loc`` that is not the tables'.
    read : ndarray ``(answers, num_params)``
        ``J``: the answers' ``loc`` as a linear map of the flattened tables.
    scale : ndarray ``(answers,)``
        The noise's ``b`` (Laplace) or ``σ`` (normal).
    laplace : ndarray of int
        Indices of the Laplace answers (those with a ``v``).
    functions : SiteFunctions
        The site's passes, each one compiled program, shared by every handler and kernel built
        from the plan, and by every plan of the same structure (:func:`site_passes`).
    """

    name: str
    tree: ReleaseTree
    total: float
    observed: np.ndarray
    read: np.ndarray
    scale: np.ndarray
    laplace: np.ndarray
    functions: SiteFunctions

    @property
    def dim(self) -> int:
        """Size of ``ξ``: the cells of the junction tree's cliques."""
        return self.tree.plan.dim


class CollapsePlan(NamedTuple):
    """The count sites of a model and the noise sites that read them (:func:`collapse_plan`)."""

    sites: tuple[CollapsedSite, ...]
    noise: tuple[str, ...]

    def site(self, name: str) -> CollapsedSite | None:
        """The count site called ``name`` (``None`` if there is none)."""
        return next((s for s in self.sites if s.name == name), None)

    @property
    def dim(self) -> int:
        """Coordinates of the normal relaxation, all count sites together."""
        return sum(s.dim for s in self.sites)


def _offsets_and_scales(model: Any, args: tuple, kwargs: dict, names: tuple, noise: tuple,
                        seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, c, scale)`` of the noise sites, concatenated, at zero tables and the other
    latent sites drawn from their priors with ``seed``."""
    proto = prototype_trace(model, jax.random.key(seed), args, kwargs)
    values = {k: s["value"] for k, s in proto.items()
              if s["type"] == "sample" and not s["is_observed"]}
    values.update({c: jnp.zeros(jnp.shape(values[c]), jnp.result_type(float)) for c in names})
    tr = handlers.trace(handlers.seed(handlers.substitute(model, data=values),
                                      jax.random.key(seed))).get_trace(*args, **kwargs)
    ys, cs, scales = [], [], []
    for s in noise:
        fn, value = inner_distribution(tr[s.name]["fn"]), tr[s.name]["value"]
        ys.append(np.ravel(np.asarray(value, float)))
        cs.append(np.ravel(np.broadcast_to(np.asarray(fn.loc, float), np.shape(value))))
        scales.append(np.ravel(np.broadcast_to(np.asarray(fn.scale, float), np.shape(value))))
    return np.concatenate(ys), np.concatenate(cs), np.concatenate(scales)


def collapse_plan(model: Callable[..., Any], model_args: tuple = (),
                  model_kwargs: dict | None = None) -> CollapsePlan:
    """The static plan of (1) for ``model`` run on these arguments.

    Raises
    ------
    CountSiteError
        Where :func:`~.count_sites.count_layout` refuses the model, or (1) cannot hold: a
        batch (plate) of tables in one site, a non-decomposable network, noise other than
        Laplace or normal, an answer that reads two count sites or the tables of two
        junction-tree cliques, or a noise offset or scale that depends on latent sites.
    """
    kwargs = dict(model_kwargs or {})
    layout = count_layout(model, model_args, kwargs)
    names = tuple(c.name for c in layout.counts)
    with jax.ensure_compile_time_eval():
        y, c, scale = _offsets_and_scales(model, model_args, kwargs, names, layout.noise, 0)
        _, c2, scale2 = _offsets_and_scales(model, model_args, kwargs, names, layout.noise, 1)
    for s in layout.noise:
        if s.family not in (_LAPLACE, _NORMAL):
            raise CountSiteError(f"noise site {s.name!r}: the collapsed path reads Laplace or "
                                 "normal noise (LaplaceNoise, GaussianNoise); use the exact "
                                 "path (collapsed=False) for discrete noise")
        if not (np.allclose(c[s.answers], c2[s.answers])
                and np.allclose(scale[s.answers], scale2[s.answers])):
            raise CountSiteError(f"noise site {s.name!r}: its scale or the part of its loc "
                                 "that is not the tables' depends on latent sites; the "
                                 "collapsed path needs them fixed (use collapsed=False)")
    families = layout.families[:-1]
    owner = np.full(layout.num_answers, -1)
    sites = []
    for i, cs in enumerate(layout.counts):
        if cs.batch_shape != ():
            raise CountSiteError(f"count site {cs.name!r} holds a batch of tables "
                                 f"{cs.batch_shape}; the collapsed path takes one set of tables "
                                 "per CGM site (write one site per region, or collapsed=False)")
        answers = np.unique(cs.rows[cs.rows < layout.num_answers])
        both = answers[owner[answers] >= 0]
        if both.size:
            raise CountSiteError(f"answer {int(both[0])} reads the count sites "
                                 f"{names[owner[both[0]]]!r} and {cs.name!r}; the collapsed "
                                 "path needs each answer to read one count site")
        owner[answers] = i
        read = np.zeros((layout.num_answers + 1, cs.network.num_params))
        np.add.at(read, (cs.rows, np.arange(cs.rows.shape[0])[:, None]), cs.coefs)
        read = read[answers]
        total = float(cs.totals)
        try:
            tree, functions = site_passes(cs.network, read, total)
        except ValueError as e:
            raise CountSiteError(f"count site {cs.name!r}: {e}") from None
        sites.append(CollapsedSite(cs.name, tree, total, y[answers] - c[answers], read,
                                   scale[answers], np.flatnonzero(families[answers] == _LAPLACE),
                                   functions))
    return CollapsePlan(tuple(sites), tuple(s.name for s in layout.noise))


def _variances(site: CollapsedSite, v: Array | None) -> Array:
    var = jnp.asarray(site.scale) ** 2
    return var if v is None else var.at[site.laplace].set(v)


def _collapsed_tables(site: CollapsedSite, fn: Any) -> Array:
    """The sites of (1) for one count site with CGM ``fn``; returns ``n``."""
    plan, fns = site.tree.plan, site.functions
    conds = fns.conditionals(fn.theta, bool(fn.normalized))
    v = None
    if site.laplace.size:
        b = jnp.asarray(site.scale[site.laplace])
        v = numpyro.sample(f"{site.name}_v", dist.Exponential(0.5 / b**2).to_event(1))
    xi = numpyro.sample(f"{site.name}_xi", dist.Normal(0.0, 1.0).expand([plan.dim]).to_event(1))
    release = TreeReleaseNormal(site.tree, conds, site.total, _variances(site, v),
                                functions=fns.tree)
    observed = jnp.asarray(site.observed)
    numpyro.sample(f"{site.name}_release", release, obs=observed)
    z = fns.tree.coordinates(conds, observed - release.loc, release.cov_diag, xi)
    return fns.tables(conds, z)


class collapse(Messenger):
    """Run ``fn`` with its exact CGM sites integrated out as in (1).

    Parameters
    ----------
    fn : callable, optional
        A NumPyro model (or use ``collapse(plan=...)`` as a context manager).
    plan : CollapsePlan
        :func:`collapse_plan` of ``fn`` on the arguments it will be run with.
    """

    def __init__(self, fn: Callable | None = None, plan: CollapsePlan | None = None):
        if plan is None:
            raise ValueError("collapse needs the plan: collapse(model, collapse_plan(model, "
                             "args))")
        self.plan = plan
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        if msg["type"] != "sample":
            return
        site = self.plan.site(msg["name"])
        if site is not None and not msg["is_observed"]:
            n = _collapsed_tables(site, inner_distribution(msg["fn"]))
            for key in list(msg):
                if key not in ("type", "name", "cond_indep_stack"):
                    del msg[key]
            msg.update(type="deterministic", value=n)
        elif msg["name"] in self.plan.noise:
            msg["fn"] = msg["fn"].mask(False)


def _run(model: Callable, args: tuple, kwargs: dict, values: dict) -> Any:
    seeded = handlers.seed(handlers.substitute(model, data=values), jax.random.key(0))
    return handlers.trace(seeded).get_trace(*args, **kwargs)


def _xi_update(plan: CollapsePlan) -> Callable:
    """``ξ ∼ N(0, I)`` per count site: its exact conditional."""

    def update(rng_key: Array, gibbs_sites: dict, hmc_sites: dict) -> dict:
        keys = jax.random.split(rng_key, len(plan.sites))
        return {k: jax.random.normal(key, gibbs_sites[k].shape, gibbs_sites[k].dtype)
                for key, k in zip(keys, sorted(gibbs_sites), strict=True)}

    return update


def _v_update(model: Callable, plan: CollapsePlan, args: tuple, kwargs: dict) -> Callable:
    """``n* ∼ p(n | θ, v, y)`` (the handled model at a fresh ``ξ``), then
    ``v ∼ p(v | n*, y)`` per Laplace answer (:func:`~.laplace_mixture.noise_variances`)."""
    laplace = [s for s in plan.sites if s.laplace.size]

    def update(rng_key: Array, gibbs_sites: dict, hmc_sites: dict) -> dict:
        k_xi, k_v = jax.random.split(rng_key)
        fresh = {f"{s.name}_xi": jax.random.normal(k, (s.dim,))
                 for s, k in zip(plan.sites, jax.random.split(k_xi, len(plan.sites)),
                                 strict=True)}
        tr = _run(model, args, kwargs, {**hmc_sites, **gibbs_sites, **fresh})
        out = {}
        for s, k in zip(laplace, jax.random.split(k_v, len(laplace)), strict=True):
            error = jnp.asarray(s.observed) - jnp.asarray(s.read) @ tr[s.name]["value"]
            out[f"{s.name}_v"] = noise_variances(k, error[s.laplace],
                                                 jnp.asarray(s.scale[s.laplace]))
        return out

    return update


class CollapseGibbs(Gibbs):
    """:class:`numpyro.infer.Gibbs` of (1): ``ξ``, then ``v`` (where there are Laplace
    answers), then ``inner_kernel`` on every other latent site; its state forwards the inner
    kernel's statistics (:class:`~.gibbs.ExactState`), so that ``extra_fields`` read as with
    plain NUTS."""

    _state_cls = ExactState

    def __init__(self, blocks: list, inner_kernel: Any):
        super().__init__(blocks + [(inner_kernel, None)])
        self._max_tree_depth = getattr(inner_kernel, "_max_tree_depth", None)


def collapse_kernel(model: Callable[..., Any], plan: CollapsePlan, model_args: tuple = (),
                    model_kwargs: dict | None = None, **nuts_options: Any) -> CollapseGibbs:
    """The collapsed path's kernel for ``model``: ξ refreshed, ``v`` drawn as in (1),
    NUTS (``nuts_options``) on the model's other latent sites under
    :class:`collapse`. Run it with ``MCMC(kernel, …).run(rng_key, *model_args, **model_kwargs)``
    on the arguments the plan was built for."""
    handled = collapse(model, plan)
    kwargs = dict(model_kwargs or {})
    blocks = [(CustomGibbs(_xi_update(plan)), [f"{s.name}_xi" for s in plan.sites])]
    if any(s.laplace.size for s in plan.sites):
        blocks.append((CustomGibbs(_v_update(handled, plan, tuple(model_args), kwargs)),
                       [f"{s.name}_v" for s in plan.sites if s.laplace.size]))
    return CollapseGibbs(blocks, NUTS(handled, **nuts_options))


def collapse_start(plan: CollapsePlan, num_chains: int) -> dict[str, Array]:
    """The noise variances' starting values: their prior mean ``2b²`` per Laplace answer (one
    row per chain where ``num_chains > 1``)."""
    out = {k: v for k, v in gibbs_values(plan).items() if k.endswith("_v")}
    if num_chains == 1:
        return out
    return {k: jnp.broadcast_to(v, (num_chains,) + v.shape) for k, v in out.items()}


def gibbs_values(plan: CollapsePlan) -> dict[str, Array]:
    """One chain's values of the Gibbs sites where NUTS's metric is computed
    (:mod:`.laplace_metric`): the noise variances at their prior mean ``2b²`` (the Gaussian
    noise of the Laplace noise's variance) and ``ξ = 0``."""
    out = {}
    for s in plan.sites:
        out[f"{s.name}_xi"] = jnp.zeros(s.dim)
        if s.laplace.size:
            out[f"{s.name}_v"] = 2.0 * jnp.asarray(s.scale[s.laplace]) ** 2
    return out
