"""The Bayesian model of a private release: prior on ``θ``, CGM counts, noisy tables.

The joint model of a private release is

.. math::

    φ \\sim \\mathcal N(0, s^2 I), \\qquad θ = M φ, \\qquad
    n \\mid θ \\sim \\mathrm{CGM}(θ, N), \\qquad
    y_k \\mid n \\sim \\text{noise}_k(Q_k\\, n_{C_k}),

with ``n`` the latent clique count tables and ``y_k`` the released noisy tables. The CGM of ``n``
is either relaxed (default): real tables on the scaled marginal polytope ``N·M`` with the
``lgamma`` density, sampled by NUTS through the junction-tree stick-breaking bijection; or exact
(``relaxed=False``): integer tables with the exact junction-tree pmf, moved by the record swaps
of :mod:`.records` inside :class:`numpyro.infer.HMCGibbs` (:mod:`.gibbs`). The relaxed density
moves mass into cells whose expected count is small
(:func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak`); the exact one does not. The
prior is on minimal parameters ``φ``: by default (``coding="auto"``) the log odds of the junction
tree's conditionals (:mod:`.conditional`) against each attribute's most frequent released level
where the network is decomposable, else the log-linear reference coding of :mod:`.coding`.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ..._precision import warn_if_float32
from ...distributions.cgm import CollectiveGraphicalModel
from ...distributions.constraints import (
    decomposable_layout,
    triangulated,
)
from ...distributions.noise import GaussianNoise, LaplaceNoise
from ...distributions.normal_cgm import (
    centring_shift,
    logit_conditionals,
    normal_tables,
    normal_tables_plan,
    tree_conditionals,
)
from ...distributions.relaxation import relaxation_leak
from ...domain import Clique
from ...measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
    measurement_list,
)
from ...network import MarkovNetwork
from ...oracles import junction_tree as jt
from ...oracles.calibration import clique_log_potentials
from ...tables import project_table
from .coding import reference_coding
from .conditional import ConditionalCoding, conditional_coding
from .labels import cell_label, cell_labels

__all__ = ["CODINGS", "DEFAULT_PRIOR_SCALE", "RELAXATIONS", "NoisyMarginalsModel",
           "noisy_marginals_model", "observed_answers", "released_reference", "y_argument"]

Array = Any

DEFAULT_PRIOR_SCALE = 3.0
#: The parameterisations of ``θ`` the prior can sit on: :mod:`.coding`, :mod:`.conditional`, or
#: ``"auto"``: the conditional one (at the released reference levels) on decomposable networks.
CODINGS = ("auto", "reference", "conditional")
#: Densities of the relaxed CGM site: the ``lgamma`` density of
#: :class:`~numpyro_dpgm.distributions.cgm.CollectiveGraphicalModel` on ``N·M``, or the normal
#: relaxation of :mod:`numpyro_dpgm.distributions.normal_cgm` (site ``z``, ``n`` deterministic).
RELAXATIONS = ("lgamma", "normal")


class _Observed:
    """Sentinel default of :meth:`NoisyMarginalsModel.__call__`: the released values."""

    def __repr__(self) -> str:
        return "<released values>"


OBSERVED = _Observed()


def y_argument(model_args: tuple, model_kwargs: dict) -> Any:
    """A run's ``y`` argument (first positional or ``y=``; :data:`OBSERVED` where none)."""
    return model_args[0] if model_args else model_kwargs.get("y", OBSERVED)


def observed_answers(model: NoisyMarginalsModel, model_args: tuple, model_kwargs: dict) -> Any:
    """The answers a run of ``model`` conditions on: its ``y`` argument, else the release's."""
    y = y_argument(model_args, model_kwargs)
    if y is None:
        raise ValueError("a posterior needs observed answers y (y=None draws from the prior)")
    return jnp.asarray(model.y if y is OBSERVED else y)

_LAPLACE = (Laplace, DiscreteLaplace)
_GAUSSIAN = (Gaussian, DiscreteGaussian)


class _Readout(NamedTuple):
    slot: int
    clique: Clique
    query: Any  # numpy (m, cells) or None


class NoisyMarginalsModel:
    """NumPyro model of noisy clique tables: a CGM latent (relaxed or exact), a prior on ``θ``.

    Build it with :func:`noisy_marginals_model`. Calling it runs the model:

    ``model()`` conditions on the released values; ``model(y=None)`` leaves ``y`` unobserved
    (prior and posterior predictive draws); ``model(y=values)`` conditions on other values of
    the same shape (e.g. simulated releases, reusing one compiled sampler). ``y`` of shape
    ``(R, num_answers)`` is a batch of ``R`` independent releases (simulation studies): the
    model is repeated in a plate ``"release"``, every site gains a leading axis of size ``R``,
    and the joint posterior is the product of the ``R`` separate posteriors.

    Sites
    -----
    ``phi`` : latent, ``(dim,)``, dims ``("param",)``
        Reference-coded log-linear parameters (absent when ``theta`` is fixed).
    ``theta`` : deterministic, ``(num_params,)``, dims ``("cell",)``
        Clique log-potentials ``M φ`` in the network's layout.
    ``mu`` : deterministic, ``(num_params,)``, dims ``("cell",)``
        The model's clique marginals ``μ(θ)`` (probabilities); only with ``record_marginals``.
    ``n`` : latent, ``(num_params,)``, dims ``("cell",)``
        CGM count tables: real tables on ``N·M`` (relaxed) or integer tables (exact).
    ``y`` : observed, ``(num_answers,)``, dims ``("answer",)``
        Every measurement's answers, concatenated in the given order.

    Attributes
    ----------
    network, measurements, total_count, prior_scale, theta, coding
    relaxed : bool
        Whether the CGM site is the relaxed density (NUTS) or the exact pmf (HMCGibbs).
    y : numpy array
        The released values, concatenated.
    noise_scales : numpy array
        Per-answer Laplace scale ``b`` or Gaussian ``σ``.
    noise_family : {"laplace", "gaussian"}
    coords, dims : dict
        For :func:`arviz.from_numpyro` (see :mod:`numpyro_dpgm.infer.diagnostics`).
    """

    def __init__(
        self,
        network: MarkovNetwork,
        measurements: Sequence[Measurement],
        total_count: int,
        *,
        prior_scale: float | Array = DEFAULT_PRIOR_SCALE,
        theta: Array | None = None,
        relaxation: str = "lgamma",
        record_marginals: bool = True,
        triangulate: bool = False,
        relaxed: bool = True,
        coding: str = "auto",
        reference: Mapping[str, int] | str | None = None,
    ):
        if not isinstance(network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
        measurements = measurement_list(measurements, "the model needs at least one measurement")
        latent = triangulated(network) if triangulate else network
        decomposable_layout(latent)  # a clear error now rather than at the first draw
        if relaxation not in RELAXATIONS:
            raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {relaxation!r}")
        total = _check_total(total_count)
        families = {"laplace" if isinstance(m.noise, _LAPLACE) else "gaussian"
                    for m in measurements}
        if len(families) > 1:
            raise ValueError(
                "the measurements mix Laplace-type and Gaussian-type noise; one model takes one "
                "noise family (build the observation sites yourself for a mixed release: one "
                "LaplaceNoise and one GaussianNoise site downstream of the CGM site)"
            )
        self.noise_family: str = families.pop()
        readouts, scales, labels = [], [], []
        for k, m in enumerate(measurements):
            clique = network.domain.check_clique(m.clique)
            slot = _smallest_containing(latent, clique)
            if slot is None:
                raise ValueError(
                    f"measurement {k} of {clique} is not contained in any clique of the network "
                    f"{list(network.cliques)}"
                )
            cells = network.domain.size(clique)
            if m.num_cells != cells:
                raise ValueError(
                    f"measurement {k} of {clique} covers {m.num_cells} cells; the clique table "
                    f"has {cells} (shape {network.domain.shape_of(clique)})"
                )
            readouts.append(_Readout(slot, clique, m.query))
            scale = m.noise.scale if isinstance(m.noise, _LAPLACE) else m.noise.sigma
            scales.append(np.full(m.values.size, float(scale)))
            if m.query is None:
                labels.append([cell_label(clique, idx)
                               for idx in np.ndindex(*network.domain.shape_of(clique))])
            else:
                labels.append([f"{','.join(clique)}:q{i}" for i in range(m.values.size)])
        answer_labels = [lab for part in labels for lab in part]
        if len(set(answer_labels)) < len(answer_labels):  # a clique measured twice
            answer_labels = [f"m{k}:{lab}" for k, part in enumerate(labels) for lab in part]
        self.network = network
        self.latent_network = latent
        self.measurements = measurements
        self.total_count = total
        self.relaxation = relaxation
        self.relaxed = bool(relaxed)
        self.record_marginals = bool(record_marginals)
        if coding not in CODINGS:
            raise ValueError(f"coding must be one of {CODINGS}, got {coding!r}")
        if coding == "auto":
            coding = "conditional" if latent is network else "reference"
            if coding == "conditional" and reference is None:
                reference = "released"
        if reference == "released":
            reference = released_reference(network, measurements)
        elif isinstance(reference, str):
            raise ValueError(f"reference must be a mapping of attributes to levels, 'released' "
                             f"or None, got {reference!r}")
        if coding == "conditional":
            if latent is not network:
                raise ValueError(
                    "coding='conditional' needs a decomposable network (the junction tree's "
                    "conditionals of the network itself); use coding='reference' with "
                    "triangulate=True")
            self.coding = conditional_coding(network, reference)
        else:
            self.coding = reference_coding(network, reference)
        self._readouts = tuple(readouts)
        self.y = np.concatenate([m.values for m in measurements])
        self.noise_scales = np.concatenate(scales)
        if theta is not None:
            theta = jnp.asarray(theta)
            if theta.shape != (network.num_params,):
                raise ValueError(
                    f"theta has shape {theta.shape}; expected ({network.num_params},)")
            self.prior_scale = None
        else:
            ps = np.asarray(prior_scale, dtype=float)
            if ps.ndim > 1 or (ps.ndim == 1 and ps.shape[0] != self.coding.dim):
                raise ValueError(
                    f"prior_scale must be a float or an array of shape ({self.coding.dim},)")
            if not np.all(np.isfinite(ps)) or np.any(ps <= 0):
                raise ValueError(f"prior_scale must be positive and finite, got {prior_scale}")
            self.prior_scale = ps
        self.theta = theta
        cells, _ = cell_labels(network)
        self.coords: dict[str, list[str]] = {"cell": cells, "answer": answer_labels}
        self.dims: dict[str, list[str]] = {
            "theta": ["cell"], "n": ["cell"], "y": ["answer"],
        }
        if latent is not network:
            self.coords["latent_cell"] = cell_labels(latent)[0]
            self.dims["n"] = ["latent_cell"]
        if self.record_marginals:
            self.dims["mu"] = ["cell"]
        self._set_latent_dims()
        if theta is None:
            self.coords["param"] = self.coding.labels
            self.dims["phi"] = ["param"]
        warn_if_float32("NoisyMarginalsModel")

    # -- model ---------------------------------------------------------------------------------
    def predict(self, n: Array) -> Array:
        """The noise-free answers ``Q_k n_{C_k}`` of every measurement, concatenated.

        ``n`` is in the layout of :attr:`latent_network`."""
        n = jnp.asarray(n)
        nb = n.ndim - 1
        names = tuple(f"__b{i}" for i in range(nb))
        batch = n.shape[:-1]
        parts = []
        net = self.latent_network
        for r in self._readouts:
            sl = net.slice_of(net.cliques[r.slot])
            table = jnp.reshape(n[..., sl], batch + net.shapes[r.slot])
            pred = project_table(table, names + net.cliques[r.slot], names + r.clique)
            pred = jnp.reshape(pred, batch + (-1,))
            if r.query is not None:
                pred = pred @ jnp.asarray(r.query).T
            parts.append(pred)
        return jnp.concatenate(parts, axis=-1)

    def __call__(self, y: Any = OBSERVED) -> None:
        if y is OBSERVED:
            obs = jnp.asarray(self.y)
        elif y is None:
            obs = None
        else:
            obs = jnp.asarray(y)
            if obs.ndim not in (1, 2) or obs.shape[-1] != self.y.size:
                raise ValueError(
                    f"y has shape {obs.shape}; expected ({self.y.size},) or a batch of "
                    f"releases (R, {self.y.size})"
                )
        if obs is not None and obs.ndim == 2:
            with numpyro.plate("release", obs.shape[0]):
                self._body(obs)
        else:
            self._body(obs)

    def _body(self, obs: Array | None) -> None:
        net = self.network
        phi = None
        if self.theta is None:
            scale = jnp.broadcast_to(jnp.asarray(self.prior_scale), (self.coding.dim,))
            phi = numpyro.sample("phi", dist.Normal(0.0, scale).to_event(1))
            theta = numpyro.deterministic("theta", self.coding.to_theta(phi))
        else:
            theta = numpyro.deterministic("theta", self.theta)
        if self.record_marginals:
            mu_fn = lambda t: net.flatten(jt.marginals(net, t))  # noqa: E731
            for _ in range(theta.ndim - 1):
                mu_fn = jax.vmap(mu_fn)
            numpyro.deterministic("mu", mu_fn(theta))
        if self.relaxed and self.relaxation == "normal":
            n = self._normal_tables(phi, theta)
        else:
            n = numpyro.sample(
                "n",
                CollectiveGraphicalModel(self.latent_network, self.latent_theta(theta),
                                         self.total_count, relaxed=self.relaxed,
                                         relaxation=self.relaxation,
                                         normalized=self.normalized),
            )
        noise = LaplaceNoise if self.noise_family == "laplace" else GaussianNoise
        numpyro.sample("y", noise(self.predict(n), jnp.asarray(self.noise_scales)), obs=obs)

    @functools.cached_property
    def _normal(self) -> _NormalConstants:
        c = _normal_constants(self.latent_network, self.measurements)
        if isinstance(self.coding, ConditionalCoding):  # its block_logits follow the same tree
            ours = [(b.clique, b.sep, b.res) for b in c.plan.blocks]
            if ours != [tuple(block) for block in self.coding.blocks]:
                raise RuntimeError(f"the conditional coding's blocks {self.coding.blocks} are not "
                                   f"the normal relaxation's {ours}")
        return c

    def _set_latent_dims(self) -> None:
        """``z``'s coords and dims on the normal relaxation (none otherwise)."""
        self.coords, self.dims = dict(self.coords), dict(self.dims)
        if self.relaxed and self.relaxation == "normal":
            self.coords["z_cell"] = self._normal.labels
            self.dims["z"] = ["z_cell"]
        else:
            self.coords.pop("z_cell", None)
            self.dims.pop("z", None)

    def _normal_tables(self, phi: Array | None, theta: Array) -> Array:
        """The normal relaxation's sites: ``z`` (partially centred) and ``n`` (deterministic).

        With the conditional coding the conditionals come from ``φ``'s logits directly, without
        ``θ``'s normalisation and layout; either way they are computed once for both ``z``'s mean
        and the tables."""
        c = self._normal
        total = float(self.total_count)
        direct = phi is not None and isinstance(self.coding, ConditionalCoding)

        def conditionals(x: Array) -> list:
            if direct:
                return logit_conditionals(c.plan, self.coding.block_logits(x))
            return tree_conditionals(c.plan, self.latent_theta(x), self.normalized)

        def shift(conds: list) -> Array:
            return centring_shift(c.plan, conds, total, c.weight, c.reference)

        def tables(conds: list, z: Array) -> Array:
            return normal_tables(c.plan, conds, total, z)

        x = phi if direct else theta
        for _ in range(jnp.ndim(x) - 1):  # a batch of releases
            conditionals, shift, tables = (jax.vmap(conditionals), jax.vmap(shift),
                                           jax.vmap(tables))
        conds = conditionals(x)
        loc = shift(conds)
        z = numpyro.sample("z", dist.Normal(loc, 1.0).to_event(1), infer={"init_to_mean": True})
        return numpyro.deterministic("n", tables(conds, z - loc))

    @property
    def normalized(self) -> bool:
        """Whether ``θ = coding.to_theta(φ)`` is normalised (``A(θ) = 0``, the conditional
        coding) and ``θ`` is inferred."""
        return self.theta is None and isinstance(self.coding, ConditionalCoding)

    def latent_theta(self, theta: Array) -> Array:
        """``θ`` (network layout, any batch) re-expressed in :attr:`latent_network`'s layout."""
        if self.latent_network is self.network:
            return theta
        net, latent = self.network, self.latent_network
        # the tree `triangulated` took its cliques from
        tree = jt.build_junction_tree(net, "min_fill")
        index = {frozenset(c): i for i, c in enumerate(tree.cliques)}

        def fn(t: Array) -> Array:
            psi = clique_log_potentials(tree, net, t)
            return latent.flatten({c: psi[index[frozenset(c)]] for c in latent.cliques})

        for _ in range(jnp.ndim(theta) - 1):
            fn = jax.vmap(fn)
        return fn(theta)

    def with_cgm(self, relaxed: bool) -> NoisyMarginalsModel:
        """The same model with the relaxed (``True``) or exact (``False``) CGM site; ``self``
        if it already has it."""
        if bool(relaxed) == self.relaxed:
            return self
        out = copy.copy(self)
        out.relaxed = bool(relaxed)
        out._set_latent_dims()
        return out

    def with_relaxation(self, relaxation: str) -> NoisyMarginalsModel:
        """The same model with the relaxed CGM site of density ``relaxation`` (one of
        :data:`RELAXATIONS`); ``self`` if it already has it."""
        if relaxation not in RELAXATIONS:
            raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {relaxation!r}")
        if self.relaxed and relaxation == self.relaxation:
            return self
        out = copy.copy(self)
        out.relaxed, out.relaxation = True, relaxation
        out._set_latent_dims()
        return out

    def relaxation_leak(self, theta: Array) -> dict:
        """:func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak` of the latent tables
        at ``θ`` (network layout): per latent clique, the fraction of ``N`` that the relaxed
        density moves into its table beyond the exact law."""
        eta = np.asarray(self.latent_theta(jnp.asarray(theta)))
        return relaxation_leak(self.latent_network, eta, float(self.total_count))

    # -- starting points -----------------------------------------------------------------------
    def uniform_point(self) -> dict[str, Array]:
        """``φ = 0`` (uniform record model) and uniform count tables ``N / |X_C|``."""
        net = self.latent_network
        n = jnp.concatenate([jnp.full(s, self.total_count / s) for s in net.sizes])
        out = {"n": n}
        if self.theta is None:
            out["phi"] = jnp.zeros(self.coding.dim)
        return out

    def starting_point(self, init: str | Mapping[str, Array]) -> dict[str, Array]:
        """Resolve ``init`` (``"uniform"`` or a dict of site values).

        The NLBP-EM estimate is a starting point too:
        :func:`numpyro_dpgm.estimation.cgm_em.em_start` gives its dict of values.
        """
        if isinstance(init, str):
            if init == "uniform":
                return self.uniform_point()
            hint = (" (the NLBP-EM start is init=em_start(model), numpyro_dpgm.estimation.cgm_em)"
                    if init == "em" else "")
            raise ValueError(f"init must be 'uniform' or a dict of values, got {init!r}{hint}")
        if not isinstance(init, Mapping):
            raise TypeError(f"init must be 'uniform' or a dict, got {type(init).__name__}")
        values = dict(self.uniform_point())
        unknown = set(init) - set(values)
        if unknown:
            raise KeyError(f"init has values for unknown site(s) {sorted(unknown)}; "
                           f"latent sites are {sorted(values)}")
        values.update({k: jnp.asarray(v) for k, v in init.items()})
        return values

    def __repr__(self) -> str:
        cgm = f"relaxed ({self.relaxation})" if self.relaxed else "exact"
        return (f"NoisyMarginalsModel(cliques={list(self.network.cliques)}, "
                f"measurements={len(self.measurements)}, N={self.total_count}, "
                f"theta={'fixed' if self.theta is not None else 'inferred'}, cgm={cgm})")


class _NormalConstants(NamedTuple):
    plan: Any
    weight: np.ndarray
    reference: np.ndarray
    labels: list


def _normal_constants(latent: MarkovNetwork,
                      measurements: Sequence[Measurement]) -> _NormalConstants:
    """The normal relaxation's plan, and per cell of ``z`` its partial-centring weight (the
    noise's share ``V / (max(y, 1) + V)`` of the released count of the cell's table, 1 where the
    table is not released in full) and reference conditional (the released table's, clipped)."""
    plan = normal_tables_plan(latent)
    weight, reference, labels = np.ones(plan.dim), np.ones(plan.dim), []
    for b in plan.blocks:
        shape = latent.domain.shape_of(b.clique)
        cells = np.stack(np.unravel_index(b.to_rows, shape), axis=-1)
        labels += [cell_label(b.clique, idx) for idx in cells]
        sl = slice(b.offset, b.offset + b.rows * b.cols)
        reference[sl] = 1.0 / b.cols
        precision, weighted = 0.0, 0.0
        for m in measurements:
            if m.query is not None or set(m.clique) != set(b.clique):
                continue
            var = m.noise.variance
            values = np.transpose(np.asarray(m.values, float).reshape(
                latent.domain.shape_of(m.clique)), [m.clique.index(a) for a in b.clique])
            precision += 1.0 / var
            weighted += values.reshape(-1) / var
        if precision == 0.0:
            continue
        y = (weighted / precision)[b.to_rows]
        var = 1.0 / precision
        weight[sl] = var / (np.maximum(y, 1.0) + var)
        rows = np.maximum(y, 0.0).reshape(b.rows, b.cols) + 0.5
        reference[sl] = (rows / rows.sum(axis=1, keepdims=True)).reshape(-1)
    return _NormalConstants(plan, weight, reference, labels)


def _check_total(total_count: Any) -> int:
    try:
        value = float(total_count)
    except (TypeError, ValueError):
        raise TypeError(f"total_count must be a number, got {total_count!r}") from None
    if not math.isfinite(value) or value < 1 or value != round(value):
        raise ValueError(
            f"total_count must be a positive integer, got {total_count}. An estimate such as "
            "numpyro_dpgm.privacy.estimate_total(...) must be rounded: int(round(N_hat))"
        )
    return int(round(value))


def released_reference(network: MarkovNetwork,
                       measurements: Sequence[Measurement]) -> dict[str, int]:
    """Each attribute's most frequent level in the release: the argmax of its released counts,
    summed from the smallest table measured in full that contains it (attributes no such table
    contains keep level 0). A function of the released values only, so it costs no privacy.

    >>> import numpy as np
    >>> from numpyro_dpgm import Laplace, MarkovNetwork, Measurement
    >>> net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    >>> y = np.array([[5.0, 30.0, 1.0], [2.0, 40.0, 9.0]])
    >>> released_reference(net, [Measurement(("a", "b"), y, Laplace(1.0))])
    {'a': 1, 'b': 1}
    """
    ref = {}
    full = [m for m in measurement_list(measurements, "no measurements") if m.query is None]
    for a in network.domain.attrs:
        fits = [m for m in full if a in m.clique]
        if not fits:
            continue
        m = min(fits, key=lambda m: m.values.size)
        table = np.asarray(m.values, dtype=float).reshape(network.domain.shape_of(m.clique))
        axes = tuple(i for i, b in enumerate(m.clique) if b != a)
        ref[a] = int(np.argmax(table.sum(axis=axes)))
    return ref


def _smallest_containing(network: MarkovNetwork, clique: Clique) -> int | None:
    best = None
    for i, c in enumerate(network.cliques):
        if set(clique) <= set(c) and (best is None or network.sizes[i] < network.sizes[best]):
            best = i
    return best


def noisy_marginals_model(
    network: MarkovNetwork,
    measurements: Sequence[Measurement],
    total_count: int,
    *,
    prior_scale: float | Array = DEFAULT_PRIOR_SCALE,
    theta: Array | None = None,
    relaxation: str = "lgamma",
    record_marginals: bool = True,
    triangulate: bool = False,
    relaxed: bool = True,
    coding: str = "auto",
    reference: Mapping[str, int] | str | None = None,
) -> NoisyMarginalsModel:
    """A NumPyro model of a release of noisy clique tables, for NUTS, SVI and ArviZ.

    Parameters
    ----------
    network : MarkovNetwork
        Decomposable, or any network with ``triangulate=True`` (the relaxed CGM's bijection
        follows a junction tree). Every measured clique must lie inside one of its cliques.
    measurements : sequence of Measurement
        The release (e.g. from :func:`numpyro_dpgm.privacy.release`). Laplace-type noise
        (``Laplace``, ``DiscreteLaplace``) or Gaussian-type noise (``Gaussian``,
        ``DiscreteGaussian``), one family per model; discrete noise is modelled by its
        continuous counterpart, matching the relaxed (continuous) counts.
    total_count : int
        ``N``, the number of records (public, or a rounded private estimate).
    prior_scale : float or array ``(dim,)``
        Standard deviation ``s`` of the independent ``Normal(0, s)`` prior on each parameter of
        the coding (log odds / log odds ratios against the reference levels, see the module
        notes). The default 3 is weakly informative on the log-odds scale.
    theta : array ``(num_params,)``, optional
        Fix the record model's log-potentials instead of inferring them (then there is no
        ``phi`` site and the posterior is that of ``n`` given ``y`` and ``θ``).
    relaxation : {"lgamma", "normal"}
        The relaxed CGM: the ``"lgamma"`` density on ``N·M`` (see
        :class:`CollectiveGraphicalModel`), or ``"normal"``, the normal relaxation of
        :mod:`numpyro_dpgm.distributions.normal_cgm`: tables with exactly the CGM's mean and
        covariance, built along the junction tree from standard normal coordinates (latent
        site ``z``, dims ``("z_cell",)``; ``n`` becomes deterministic), partially centred per
        cell by the noise's share of its released count. It moves no mass into near-empty
        cells (no relaxation leak); its cells can go below zero.
    record_marginals : bool
        Record the deterministic site ``mu = μ(θ)``.
    triangulate : bool
        On a network that is not decomposable, put the latent site ``n`` on the tables of its
        triangulation's junction-tree cliques (:func:`~numpyro_dpgm.distributions.constraints.\
triangulated`, layout :attr:`NoisyMarginalsModel.latent_network`, dims ``("latent_cell",)``);
        the measured tables are their projections and ``θ``, ``φ``, ``mu`` stay in the network's
        layout. ``False`` (default) raises on such a network.
    relaxed : bool
        The relaxed CGM site (NUTS moves it) or the exact one (:mod:`.gibbs` moves it).
    coding : {"auto", "reference", "conditional"}
        The parameters ``φ`` the prior sits on: the log-linear reference coding of
        :mod:`.coding` (any network), or the log odds of the junction tree's conditionals of
        :mod:`.conditional` (decomposable networks; ``θ`` is then normalised, ``A(θ) = 0``, and
        given the tables the parameters' blocks are independent). ``"auto"`` (default): the
        conditional coding with ``reference="released"`` unless given otherwise, on a
        decomposable network; the reference coding on others (``triangulate=True``). Measured
        on six releases of Adult's tables without a leak, relaxed NUTS with the conditional
        coding had 1.2–7.6 times the smallest-ESS per second of the path the reference coding's
        rule chose, and mixed where the release pins the counts (:func:`~.nuts.choose_path`;
        docs: "Where the prior sits").
    reference : mapping, "released" or None
        The coding's reference level of each attribute (default level 0, except ``"released"``
        under ``coding="auto"``); ``"released"`` takes each attribute's most frequent level in
        the release (:func:`released_reference`).

    Returns
    -------
    NoisyMarginalsModel
        Callable NumPyro model with sites ``phi``, ``theta``, ``mu``, ``n``, ``y``.

    Examples
    --------
    >>> import numpy as np, numpyro
    >>> from numpyro import handlers
    >>> from numpyro_dpgm import Laplace, MarkovNetwork, Measurement
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    >>> y = np.array([[30.0, 10.0], [20.0, 40.0]])
    >>> model = noisy_marginals_model(net, [Measurement(("a", "b"), y, Laplace(2.0))], 100)
    >>> tr = handlers.trace(handlers.seed(model, 0)).get_trace()
    >>> [(name, site["type"]) for name, site in tr.items()]  # doctest: +NORMALIZE_WHITESPACE
    [('phi', 'sample'), ('theta', 'deterministic'), ('mu', 'deterministic'),
     ('n', 'sample'), ('y', 'sample')]
    >>> round(float(tr["n"]["value"].sum()), 6)  # relaxed counts of N = 100 records
    100.0

    Posterior draws by NUTS (compiling it takes seconds, so it is not run here):

    >>> from numpyro_dpgm.infer.bayes import run_nuts                 # doctest: +SKIP
    >>> mcmc = run_nuts(model, jax.random.key(0), num_chains=4)       # doctest: +SKIP
    """
    return NoisyMarginalsModel(network, measurements, total_count, prior_scale=prior_scale,
                               theta=theta, relaxation=relaxation,
                               record_marginals=record_marginals, triangulate=triangulate,
                               relaxed=relaxed, coding=coding, reference=reference)
