r"""A collapsed Gibbs sampler for large releases: the counts integrated out of ``θ``'s update.

Where a release pins many counts, NUTS on ``(θ, n)`` jointly fails (on 226,051 records, 319
cells, Laplace ε = 1: R-hat 108, every draw at the maximum depth) and record swaps crawl. This
path samples an approximation of the model of :mod:`.model` in which ``θ``'s update sees the
release through a smooth, low-dimensional density:

- the CGM of the tables is replaced by its normal relaxation
  (:mod:`numpyro_dpgm.distributions.normal_cgm`): ``n = Nμ(θ) + L(θ) z`` with the CGM's exact
  mean and covariance;
- Laplace noise is a scale mixture, ``e_i ∣ v_i ∼ N(0, v_i)``, ``v_i ∼ Exp(1/(2b²))``
  (Gaussian noise: ``v_i = σ²`` fixed, no ``v`` site);
- so ``n`` integrates out: ``y ∣ θ, v ∼ N(Q Nμ, Q NΣ Qᵀ + diag v)``, whose density and the
  tables' conditional draw take one pass each way along the junction tree
  (:mod:`.collapsed_tree`: per clique a diagonal-plus-low-rank factor for the density and a
  dense one for the draw, not the dense ``(Σ_K |K|)³``).

A model of your own gets the same path through the :class:`~.collapse.collapse` handler.

The model (:class:`CollapsedModel`) has the sites ``phi_std`` (NUTS), ``v`` and ``xi`` (Gibbs
blocks), the deterministic ``phi``, ``theta``, ``mu`` of the library's model, and ``n``,
deterministic given ``xi``:

.. math::

    φ = φ_0 + s ⊙ w,\quad w \sim \mathcal N(−φ_0/s,\ (σ/s)^2), \qquad
    ξ \sim \mathcal N(0, I), \qquad
    n = \mathrm{tables}_θ\big(z(θ, v, y, ξ)\big),                                          \tag{1}

the last being a draw of ``n`` from its exact conditional given ``(θ, v, y)``
(:func:`~.collapsed_tree.tree_conditional_coordinates`: ``z`` drawn block by block from the
root, ``ξ`` its standard normal input) whenever ``ξ`` is standard normal and independent of
``(θ, v)``. The prior on ``φ`` is the model's, exactly; ``φ₀`` (the released
tables' conditional log odds, clipped) and ``s = min(√(1/n₀(cell) + 1/n₀(ref)), σ)`` (the log
odds' standard error at the released counts ``n₀ = Nμ(θ₀)``) only precondition: without them
warm-up ran at the maximum tree depth (the posterior scales of full and empty cells differ
about 1000-fold).

One MCMC step (:class:`CollapsedGibbs`, blocks of :class:`numpyro.infer.Gibbs`) leaves the
joint posterior of ``(w, v, ξ)`` invariant, ``p(w, v | y) N(ξ; 0, I)``:

1. ``ξ ∼ N(0, I)``, its exact conditional;
2. ``v``: draw ``n* ∼ p(n | θ, v, y)`` with a key of its own, then ``1/v_i ∼
   InverseGaussian(1/(b|y_i − (Qn*)_i|), 1/b²)``: two steps of data augmentation on
   ``(n, v)`` given ``θ``, which leave ``p(v | θ, y)`` invariant;
3. NUTS on ``w`` given ``v`` with ``n`` integrated out.

So each stored draw's ``n`` (1) comes from ``p(n | θ, v, y)`` at the draw's own ``θ`` and ``v``:
unlike the cycle ``n | θ, v → v | n → θ | v``, whose stored ``n`` belongs to the previous
``θ``. :func:`~.nuts.run_nuts` runs it (``collapsed=True``, or by default on large
releases: :func:`~.nuts.choose_path`); ``mcmc.get_samples()`` holds ``phi``, ``theta``, ``mu``
and ``n`` as :func:`~.nuts.run_nuts` does, for :mod:`.checks` and ArviZ.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import NUTS, CustomGibbs, Gibbs

from ...distributions.normal_cgm import logit_conditionals, normal_tables
from ...oracles import junction_tree as jt
from .collapsed_tree import (
    TreeFunctions,
    TreeReleaseNormal,
    release_tree,
    tree_functions,
)
from .conditional import ConditionalCoding
from .gibbs import ExactState
from .laplace_mixture import noise_variances
from .model import OBSERVED, NoisyMarginalsModel

__all__ = ["PATH_REASON", "CollapsedGibbs", "CollapsedModel", "collapsed_kernel",
           "collapsed_start", "collapsed_unable", "gibbs_values", "preconditioner"]

Array = Any

#: What the collapsed path is (the start of ``mcmc.path_reason``).
PATH_REASON = ("collapsed Gibbs: the counts integrated out of θ's update under the normal "
               "relaxation of the CGM (Laplace noise as a normal scale mixture)")


def collapsed_unable(model: NoisyMarginalsModel, one_release: bool = True) -> str | None:
    """Why the collapsed path cannot sample ``model`` (``None`` where it can): it infers ``θ``
    from one release, with the prior on the conditional coding (on whose log odds
    :func:`preconditioner` is built)."""
    if model.theta is not None:
        return "θ is fixed: the tables' posterior given θ is the exact path's (exact=True)"
    if not one_release:
        return "y is a batch of releases; the collapsed path takes one"
    if not isinstance(model.coding, ConditionalCoding):
        return "the collapsed path needs the conditional coding (coding='conditional')"
    return None


def preconditioner(model: NoisyMarginalsModel) -> tuple[np.ndarray, np.ndarray]:
    """``(φ₀, s)`` of (1): the centre and scale of ``φ = φ₀ + s ⊙ w``.

    ``φ₀`` are the conditional coding's log odds of the released tables' conditionals
    (negative counts clipped, half a count added: the normal relaxation's reference
    conditionals) and ``s`` the standard error of a log odds at counts ``n₀ = Nμ(θ(φ₀))``,
    ``√(1/n₀(cell) + 1/n₀(ref))``, capped at the prior's scale.
    """
    scale_cap = np.broadcast_to(np.asarray(model.prior_scale, float), (model.coding.dim,))
    net, const = model.latent_network, model._normal
    log_cond = np.zeros(net.num_params)
    for b in const.plan.blocks:
        cells = net.offsets[net.clique_index(b.clique)] + b.to_rows
        log_cond[cells] = np.log(const.reference[b.offset:b.offset + b.rows * b.cols])
    coding = model.coding
    phi0 = np.asarray(coding.log_odds(jnp.asarray(log_cond)))
    counts = model.total_count * np.asarray(net.flatten(jt.marginals(net, coding.to_theta(phi0))))
    se = np.sqrt(1.0 / counts[coding._beta_cell] + 1.0 / counts[coding._beta_ref])
    return phi0, np.minimum(se, scale_cap)


class CollapsedModel:
    """The NumPyro model (1) of a release, for :class:`CollapsedGibbs`.

    Parameters
    ----------
    model : NoisyMarginalsModel
        ``θ`` inferred (a ``phi`` site), one release, the conditional coding
        (:func:`collapsed_unable`).

    Sites
    -----
    ``phi_std`` : latent ``(dim,)``, standardised ``φ`` (NUTS); ``v`` : latent ``(answers,)``,
    the noise variances (Laplace noise only); ``xi`` : latent ``(z cells,)``, standard normal;
    ``phi``, ``theta``, ``mu``, ``n`` : deterministic, as in the library's model; ``y`` :
    observed (``y=None``: ``n = Nμ + Lξ`` and ``y`` drawn given it).
    """

    #: The form of the CGM whose posterior this model samples.
    relaxation = "normal"

    def __init__(self, model: NoisyMarginalsModel):
        if not isinstance(model, NoisyMarginalsModel):
            raise TypeError(f"model must be a NoisyMarginalsModel, got {type(model).__name__}")
        unable = collapsed_unable(model)
        if unable is not None:
            raise ValueError(unable)
        self.base = model
        self.plan = model._normal.plan
        self.tree = release_tree(self.plan, model.predict)
        self.phi0, self.scale = preconditioner(model)
        self.laplace = model.noise_family == "laplace"
        self.coords = {**model.coords, "param": model.coding.labels,
                       "z_cell": model._normal.labels}
        self.dims = {**model.dims, "phi_std": ["param"], "xi": ["z_cell"], "phi": ["param"]}
        if self.laplace:
            self.dims["v"] = ["answer"]

    @property
    def noise_scales(self) -> Array:
        """Per answer, the Laplace ``b`` or Gaussian ``σ``."""
        return jnp.asarray(self.base.noise_scales)

    def conditionals(self, phi: Array) -> list:
        """The normal relaxation's ``(μ_S, p(r | s))`` per junction-tree block at ``φ``."""
        return logit_conditionals(self.plan, self.base.coding.block_logits(phi))

    def release(self, phi: Array, variance: Array) -> TreeReleaseNormal:
        """The answers' law (:class:`~.collapsed_tree.TreeReleaseNormal`) at ``φ`` and noise
        variances ``v``, the tables integrated out."""
        return TreeReleaseNormal(self.tree, self._conditionals(phi),
                                 float(self.base.total_count), variance,
                                 functions=self._passes)

    def conditional_tables(self, release: TreeReleaseNormal, y: Array, xi: Array) -> Array:
        """``n`` drawn from its conditional given ``(θ, v, y)`` at standard normal ``ξ``."""
        z = self._passes.coordinates(release.conditionals, y - release.loc, release.cov_diag,
                                     xi)
        return self._tables(release.conditionals, z)

    @functools.cached_property
    def _conditionals(self) -> Any:
        # jitted: outside a jit (a Gibbs kernel's init) one program instead of op by op
        return jax.jit(self.conditionals)

    @functools.cached_property
    def _passes(self) -> TreeFunctions:
        return tree_functions(self.tree, float(self.base.total_count))

    @functools.cached_property
    def _tables(self) -> Any:
        total = float(self.base.total_count)
        return jax.jit(lambda conds, z: normal_tables(self.plan, conds, total, z))

    def phi(self, phi_std: Array) -> Array:
        """``φ = φ₀ + s ⊙ w``."""
        return jnp.asarray(self.phi0) + jnp.asarray(self.scale) * phi_std

    def __call__(self, y: Any = OBSERVED) -> None:
        base = self.base
        obs = jnp.asarray(base.y) if y is OBSERVED else None if y is None else jnp.asarray(y)
        if obs is not None and obs.shape != base.y.shape:
            raise ValueError(f"y has shape {obs.shape}; the collapsed model takes one release "
                             f"{base.y.shape}")
        prior = jnp.broadcast_to(jnp.asarray(base.prior_scale), (base.coding.dim,))
        phi0, scale = jnp.asarray(self.phi0), jnp.asarray(self.scale)
        w = numpyro.sample("phi_std", dist.Normal(-phi0 / scale, prior / scale).to_event(1))
        phi = numpyro.deterministic("phi", self.phi(w))
        theta = numpyro.deterministic("theta", base.coding.to_theta(phi))
        if base.record_marginals:
            net = base.network
            numpyro.deterministic("mu", net.flatten(jt.marginals(net, theta)))
        b = self.noise_scales
        if self.laplace:
            v = numpyro.sample("v", dist.Exponential(0.5 / b**2).to_event(1))
        else:
            v = b**2
        xi = numpyro.sample("xi", dist.Normal(0.0, 1.0).expand([self.plan.dim]).to_event(1))
        release = self.release(phi, v)
        if obs is None:
            n = numpyro.deterministic("n", self._tables(release.conditionals, xi))
            numpyro.sample("y", dist.Normal(base.predict(n), jnp.sqrt(v)).to_event(1))
            return
        numpyro.deterministic("n", self.conditional_tables(release, obs, xi))
        numpyro.sample("y", release, obs=obs)


def _xi_update(dim: int) -> Any:
    """Block 1: ``ξ ∼ N(0, I)``."""

    def update(rng_key: Array, gibbs_sites: dict, hmc_sites: dict) -> dict:
        xi = gibbs_sites["xi"]
        return {"xi": jax.random.normal(rng_key, xi.shape, xi.dtype)}

    return update


def _v_update(model: CollapsedModel, y: Array) -> Any:
    """Block 2: ``n* ∼ p(n | θ, v, y)``, then ``v ∼ p(v | n*, y)`` by (1) of
    :mod:`.laplace_mixture`."""
    y = jnp.asarray(y)

    def update(rng_key: Array, gibbs_sites: dict, hmc_sites: dict) -> dict:
        k_z, k_v = jax.random.split(rng_key)
        release = model.release(model.phi(hmc_sites["phi_std"]), gibbs_sites["v"])
        xi = jax.random.normal(k_z, (model.plan.dim,), release.loc.dtype)
        n = model.conditional_tables(release, y, xi)
        return {"v": noise_variances(k_v, y - model.base.predict(n), model.noise_scales)}

    return update


class CollapsedGibbs(Gibbs):
    """:class:`numpyro.infer.Gibbs` of the blocks of (1): ``ξ``, ``v`` (Laplace noise only),
    then NUTS on ``phi_std``; its state (:class:`~.gibbs.ExactState`) forwards NUTS's
    statistics, so that ``extra_fields`` read as with plain NUTS.

    Parameters
    ----------
    model : CollapsedModel
    inner_kernel : NUTS
        On ``model``.
    y : array, optional
        The answers the run conditions on (default the released values).
    """

    _state_cls = ExactState

    def __init__(self, model: CollapsedModel, inner_kernel: NUTS, y: Array | None = None):
        y = model.base.y if y is None else y
        blocks = [(CustomGibbs(_xi_update(model.plan.dim)), ["xi"])]
        if model.laplace:
            blocks.append((CustomGibbs(_v_update(model, y)), ["v"]))
        super().__init__(blocks + [(inner_kernel, None)])
        self._max_tree_depth = getattr(inner_kernel, "_max_tree_depth", None)


def collapsed_kernel(model: NoisyMarginalsModel | CollapsedModel, *, y: Array | None = None,
                     **nuts_options: Any) -> CollapsedGibbs:
    """The kernel of the collapsed path of :func:`~.nuts.run_nuts`; ``nuts_options`` go to
    :class:`numpyro.infer.NUTS` (``init_strategy``, ``target_accept_prob``, ``dense_mass``,
    ``max_tree_depth``)."""
    model = model if isinstance(model, CollapsedModel) else CollapsedModel(model)
    return CollapsedGibbs(model, NUTS(model, **nuts_options), y=y)


def collapsed_start(model: CollapsedModel, phi: Array | None, num_chains: int,
                    ) -> tuple[dict[str, Array], dict[str, Array] | None]:
    """Where the chains start: the centre of ``phi_std``'s starting points (``w = 0``, i.e.
    ``φ = φ₀`` of :func:`preconditioner`, or a given ``φ`` such as the NLBP-EM estimate) and
    the initial ``v`` (Laplace noise: its prior mean ``2b²`` per answer, one row per chain)."""
    centre = (jnp.zeros(model.base.coding.dim) if phi is None
              else jnp.asarray((np.asarray(phi, float) - model.phi0) / model.scale))
    if not model.laplace:
        return {"phi_std": centre}, None
    v0 = gibbs_values(model)["v"]
    return {"phi_std": centre}, {"v": v0 if num_chains == 1
                                 else jnp.broadcast_to(v0, (num_chains,) + v0.shape)}


def gibbs_values(model: CollapsedModel) -> dict[str, Array]:
    """One chain's values of the Gibbs sites where NUTS's metric is computed
    (:mod:`.laplace_metric`): ``v`` at its prior mean ``2b²`` (Laplace noise) and ``ξ = 0``."""
    out = {"xi": jnp.zeros(model.plan.dim)}
    if model.laplace:
        out["v"] = 2.0 * model.noise_scales ** 2
    return out
