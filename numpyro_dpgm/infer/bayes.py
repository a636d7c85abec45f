"""Full Bayesian inference on the relaxed collective graphical model: priors, models, NUTS, SVI.

The joint model of a private release is

.. math::

    φ \\sim \\mathcal N(0, s^2 I), \\qquad θ = M φ, \\qquad
    n \\mid θ \\sim \\mathrm{CGM}_{\\text{relaxed}}(θ, N), \\qquad
    y_k \\mid n \\sim \\text{noise}_k(Q_k\\, n_{C_k}),

with ``n`` the latent clique count tables on the scaled marginal polytope ``N·M`` (the relaxed CGM
with the ``lgamma`` density, sampled through the junction-tree stick-breaking bijection) and
``y_k`` the released noisy tables.

**Gauge.** The clique log-potentials ``θ`` are overcomplete: adding a constant to one clique
table and subtracting it from another, or moving a function of a separator from one clique to a
neighbour, leaves ``p_θ`` unchanged, so a prior placed directly on ``θ`` puts mass along
directions the likelihood cannot see. The prior is therefore placed on *minimal reference-coded*
(corner-constraint) parameters ``φ``: for every non-empty attribute set ``A`` contained in some
clique (the cliques' downward closure) and every cell ``v`` of ``A`` in which **no** attribute
takes its reference value 0, one parameter ``λ_A(v)``; the log-density of a record is

.. math:: \\log p(x) = \\sum_A λ_A(x_A)\\, 1[x_a ≠ 0\\ ∀ a ∈ A] - \\log Z(φ).

Each ``λ_A`` is written into the table of one clique containing ``A`` (the first in the
network's order), which defines the 0/1 matrix ``M``. These indicator features and the constant
form a basis of the functions ``Σ_C g_C(x_C)``, so ``φ ↦ p_{Mφ}`` reaches every distribution of
the model family exactly once (:meth:`ReferenceCoding.from_theta` is the inverse, by Möbius
inversion at the reference cell). Main effects ``λ_{a}(v)`` are log odds of level ``v`` against
level 0 at the reference of the other attributes; interactions are log odds ratios. The prior is
not invariant to the choice of reference level (level 0 of every attribute).

The number of free parameters is ``Σ_A Π_{a∈A}(k_a − 1)``, far fewer than ``num_params``.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import (
    AutoDelta,
    AutoMultivariateNormal,
    AutoNormal,
)
from numpyro.infer.initialization import init_to_uniform

from .._precision import warn_if_float32
from ..distributions.cgm import CollectiveGraphicalModel
from ..distributions.constraints import (
    _ScaledMarginalPolytope,
    decomposable_layout,
    triangulated,
)
from ..distributions.noise import GaussianNoise, LaplaceNoise
from ..domain import Clique
from ..inference import junction_tree as jt
from ..measurements import DiscreteGaussian, DiscreteLaplace, Gaussian, Laplace, Measurement
from ..network import MarkovNetwork
from ..tables import project_table

__all__ = [
    "NoisyMarginalsModel",
    "ReferenceCoding",
    "SVIFit",
    "cell_labels",
    "init_to_interior",
    "noisy_marginals_model",
    "reference_coding",
    "run_nuts",
    "run_svi",
]

Array = Any

DEFAULT_PRIOR_SCALE = 3.0

#: Statistics :func:`run_nuts` collects per draw (besides ``diverging``), for ArviZ.
NUTS_FIELDS = ("num_steps", "accept_prob", "potential_energy", "energy", "adapt_state.step_size")


# ------------------------------------------------------------------------------------------------
# labels
# ------------------------------------------------------------------------------------------------
def _cell_label(attrs: Sequence[str], values: Sequence[int]) -> str:
    return ",".join(f"{a}={v}" for a, v in zip(attrs, values, strict=True))


def cell_labels(network: MarkovNetwork) -> tuple[list[str], list[str]]:
    """Labels of the cells of the network's flat layout, and of the clique each belongs to.

    Returns
    -------
    cells : list of str
        ``"a=0,b=1"`` for the cell ``(0, 1)`` of clique ``("a", "b")`` (attributes in the
        clique's order), in the network's layout; unique because no two cliques have the same
        attribute set.
    cliques : list of str
        ``"a,b"``, the clique of each cell.
    """
    cells, owners = [], []
    for c, shape in zip(network.cliques, network.shapes, strict=True):
        for idx in np.ndindex(*shape):
            cells.append(_cell_label(c, idx))
            owners.append(",".join(c))
    return cells, owners


# ------------------------------------------------------------------------------------------------
# gauge: minimal reference-coded parameters
# ------------------------------------------------------------------------------------------------
class ReferenceCoding:
    """Minimal reference-coded parameterisation ``θ = M φ`` of a network (see the module notes).

    Build it with :func:`reference_coding` (cached per network).

    Attributes
    ----------
    network : MarkovNetwork
    terms : tuple of (attribute tuple, host clique index)
        The interaction sets ``A`` (attributes in domain order, ordered by size then domain
        order) and the network clique whose table holds ``λ_A``.
    dim : int
        Number of parameters ``φ``.
    labels : list of str
        ``"a=1,b=2"`` for ``λ_{(a,b)}(1, 2)``.
    """

    def __init__(self, network: MarkovNetwork):
        if not isinstance(network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
        domain = network.domain
        subsets: set[frozenset[str]] = set()
        for c in network.cliques:
            for r in range(1, len(c) + 1):
                subsets.update(frozenset(s) for s in itertools.combinations(c, r))
        order = {a: i for i, a in enumerate(domain.attrs)}
        terms = sorted((domain.sorted(s) for s in subsets),
                       key=lambda t: (len(t), [order[a] for a in t]))
        hosts = []
        for t in terms:
            hosts.append(next(i for i, c in enumerate(network.cliques) if set(t) <= set(c)))
        self.network = network
        self.terms: tuple[tuple[Clique, int], ...] = tuple(zip(terms, hosts, strict=True))

        labels: list[str] = []
        to_rows, to_cols = [], []  # θ index, φ index: θ = segment-sum of φ
        inv_rows, inv_cols, inv_sign = [], [], []  # φ index, θ index, ±1: φ = R θ
        j = 0
        for attrs, host in self.terms:
            levels = [range(1, domain[a]) for a in attrs]
            hc = network.cliques[host]
            hshape = network.shapes[host]
            containing = [i for i, c in enumerate(network.cliques) if set(attrs) <= set(c)]
            for v in itertools.product(*levels):
                labels.append(_cell_label(attrs, v))
                val = dict(zip(attrs, v, strict=True))
                # M: every cell of the host table with x_A = v
                for cell in np.ndindex(*hshape):
                    if all(cell[hc.index(a)] == val[a] for a in attrs):
                        to_rows.append(network.offsets[host] + np.ravel_multi_index(cell, hshape))
                        to_cols.append(j)
                # R: λ_A(v) = Σ_{C ⊇ A} Σ_{B ⊆ A} (−1)^{|A∖B|} θ_C((v_B, 0)_C)
                for ci in containing:
                    c, shape = network.cliques[ci], network.shapes[ci]
                    for r in range(len(attrs) + 1):
                        for b in itertools.combinations(attrs, r):
                            cell = tuple(val[a] if a in b else 0 for a in c)
                            inv_rows.append(j)
                            inv_cols.append(network.offsets[ci]
                                            + int(np.ravel_multi_index(cell, shape)))
                            inv_sign.append((-1.0) ** (len(attrs) - r))
                j += 1
        self.dim: int = j
        self.labels: list[str] = labels
        self._to_rows = np.asarray(to_rows, dtype=np.int64)
        self._to_cols = np.asarray(to_cols, dtype=np.int64)
        self._inv_rows = np.asarray(inv_rows, dtype=np.int64)
        self._inv_cols = np.asarray(inv_cols, dtype=np.int64)
        self._inv_sign = np.asarray(inv_sign, dtype=np.float64)

    def __repr__(self) -> str:
        return f"ReferenceCoding(cliques={list(self.network.cliques)}, dim={self.dim})"

    def to_theta(self, phi: Array) -> Array:
        """``θ = M φ`` for ``phi`` of shape ``batch + (dim,)``; shape ``batch + (num_params,)``."""
        phi = jnp.asarray(phi)
        if phi.ndim < 1 or phi.shape[-1] != self.dim:
            raise ValueError(f"phi has shape {phi.shape}; expected (..., {self.dim})")
        out = jnp.zeros(phi.shape[:-1] + (self.network.num_params,), dtype=phi.dtype)
        return out.at[..., self._to_rows].add(phi[..., self._to_cols])

    def from_theta(self, theta: Array) -> Array:
        """The ``φ`` with ``p_{Mφ} = p_θ`` (Möbius inversion at the reference cell).

        ``theta`` of shape ``batch + (num_params,)`` in the network's layout, any gauge.
        """
        theta = jnp.asarray(theta)
        if theta.ndim < 1 or theta.shape[-1] != self.network.num_params:
            raise ValueError(
                f"theta has shape {theta.shape}; expected (..., {self.network.num_params})")
        out = jnp.zeros(theta.shape[:-1] + (self.dim,), dtype=theta.dtype)
        return out.at[..., self._inv_rows].add(self._inv_sign * theta[..., self._inv_cols])

    @property
    def matrix(self) -> np.ndarray:
        """The dense 0/1 matrix ``M`` of shape ``(num_params, dim)``."""
        m = np.zeros((self.network.num_params, self.dim))
        m[self._to_rows, self._to_cols] = 1.0
        return m


@functools.lru_cache(maxsize=64)
def reference_coding(network: MarkovNetwork) -> ReferenceCoding:
    """The minimal reference-coded parameterisation of ``network`` (cached per network)."""
    return ReferenceCoding(network)


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
class _Observed:
    """Sentinel default of :meth:`NoisyMarginalsModel.__call__`: the released values."""

    def __repr__(self) -> str:
        return "<released values>"


OBSERVED = _Observed()

_LAPLACE = (Laplace, DiscreteLaplace)
_GAUSSIAN = (Gaussian, DiscreteGaussian)


class _Readout(NamedTuple):
    slot: int
    clique: Clique
    query: Any  # numpy (m, cells) or None


class NoisyMarginalsModel:
    """A NumPyro model of noisy clique tables with a relaxed CGM latent and a prior on ``θ``.

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
        Relaxed CGM count tables on ``N·M``.
    ``y`` : observed, ``(num_answers,)``, dims ``("answer",)``
        Every measurement's answers, concatenated in the given order.

    Attributes
    ----------
    network, measurements, total_count, prior_scale, theta, coding
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
    ):
        if not isinstance(network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
        if isinstance(measurements, Measurement):
            measurements = [measurements]
        measurements = list(measurements)
        if not measurements:
            raise ValueError("the model needs at least one measurement")
        for k, m in enumerate(measurements):
            if not isinstance(m, Measurement):
                raise TypeError(f"measurements[{k}] is a {type(m).__name__}, not a Measurement")
        latent = triangulated(network) if triangulate else network
        decomposable_layout(latent)  # a clear error now rather than at the first draw
        if relaxation not in ("lgamma", "stirling"):
            raise ValueError(f"relaxation must be 'lgamma' or 'stirling', got {relaxation!r}")
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
                labels.append([_cell_label(clique, idx)
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
        self.record_marginals = bool(record_marginals)
        self.coding = reference_coding(network)
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
        n = numpyro.sample(
            "n",
            CollectiveGraphicalModel(self.latent_network, self.latent_theta(theta),
                                     self.total_count, relaxed=True, relaxation=self.relaxation),
        )
        noise = LaplaceNoise if self.noise_family == "laplace" else GaussianNoise
        numpyro.sample("y", noise(self.predict(n), jnp.asarray(self.noise_scales)), obs=obs)

    def latent_theta(self, theta: Array) -> Array:
        """``θ`` (network layout, any batch) re-expressed in :attr:`latent_network`'s layout."""
        if self.latent_network is self.network:
            return theta
        net, latent = self.network, self.latent_network
        # the tree `triangulated` took its cliques from
        tree = jt.build_junction_tree(net, "min_fill")
        index = {frozenset(c): i for i, c in enumerate(tree.cliques)}

        def fn(t: Array) -> Array:
            psi = jt.clique_log_potentials(tree, net, t)
            return latent.flatten({c: psi[index[frozenset(c)]] for c in latent.cliques})

        for _ in range(jnp.ndim(theta) - 1):
            fn = jax.vmap(fn)
        return fn(theta)

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
        return (f"NoisyMarginalsModel(cliques={list(self.network.cliques)}, "
                f"measurements={len(self.measurements)}, N={self.total_count}, "
                f"theta={'fixed' if self.theta is not None else 'inferred'})")


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
        Standard deviation ``s`` of the independent ``Normal(0, s)`` prior on each
        reference-coded parameter (log odds / log odds ratios against level 0, see the module
        notes). The default 3 is weakly informative on the log-odds scale.
    theta : array ``(num_params,)``, optional
        Fix the record model's log-potentials instead of inferring them (then there is no
        ``phi`` site and the posterior is that of ``n`` given ``y`` and ``θ``).
    relaxation : {"lgamma", "stirling"}
        Density of the relaxed CGM (see :class:`CollectiveGraphicalModel`); ``"lgamma"`` is
        the one to use with ``θ`` inferred.
    record_marginals : bool
        Record the deterministic site ``mu = μ(θ)``.
    triangulate : bool
        On a network that is not decomposable, put the latent site ``n`` on the tables of its
        triangulation's junction-tree cliques (:func:`~numpyro_dpgm.distributions.constraints.\
triangulated`, layout :attr:`NoisyMarginalsModel.latent_network`, dims ``("latent_cell",)``);
        the measured tables are their projections and ``θ``, ``φ``, ``mu`` stay in the network's
        layout. ``False`` (default) raises on such a network.

    Returns
    -------
    NoisyMarginalsModel
        Callable NumPyro model with sites ``phi``, ``theta``, ``mu``, ``n``, ``y``.

    Examples
    --------
    >>> model = noisy_marginals_model(net, measurements, N)          # doctest: +SKIP
    >>> mcmc = run_nuts(model, jax.random.key(0), num_chains=4)       # doctest: +SKIP
    """
    return NoisyMarginalsModel(network, measurements, total_count, prior_scale=prior_scale,
                               theta=theta, relaxation=relaxation,
                               record_marginals=record_marginals, triangulate=triangulate)


# ------------------------------------------------------------------------------------------------
# initialisation
# ------------------------------------------------------------------------------------------------
def init_to_interior(
    site: dict | None = None,
    values: Mapping[str, Array] | None = None,
    radius: float = 0.5,
) -> Any:
    """Initialisation strategy: given interior values, jittered in the unconstrained space.

    For a latent site with a value in ``values``: ``T(T⁻¹(value) + U(−radius, radius))`` with
    ``T = biject_to(support)``, drawn from the site's random key (so every chain starts at its
    own point). A relaxed CGM site without a value starts from uniform tables ``N / |X_C|``
    jittered likewise; other sites fall back to :func:`numpyro.infer.init_to_uniform`.

    Exact CGM draws contain zero cells, which the bijection maps to ``−∞``; that is why NumPyro's
    ``init_to_median`` / ``init_to_sample`` fail on a relaxed CGM site and this strategy is used.

    Parameters
    ----------
    values : mapping site name -> constrained value, optional
    radius : float
        Half-width of the jitter (0: start exactly at the values).
    """
    if site is None:
        return functools.partial(init_to_interior, values=values, radius=radius)
    values = {} if values is None else values
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    support = fn.support
    name = site["name"]
    if name in values:
        center = jnp.broadcast_to(jnp.asarray(values[name]), fn.shape())
    elif isinstance(support, _ScaledMarginalPolytope):
        center = support.feasible_like(jnp.zeros(fn.shape()))
    else:
        return init_to_uniform(site, radius=2.0 if radius <= 0 else radius)
    transform = biject_to(support)
    u = transform.inv(center)
    finite = jnp.all(jnp.isfinite(u))
    if not isinstance(finite, jax.core.Tracer) and not bool(finite):
        raise ValueError(
            f"the starting value of site {name!r} is on the boundary of its support (a zero "
            "cell?); start from an interior point such as uniform tables or the NLBP-EM estimate"
        )
    if radius > 0:
        rng_key = site["kwargs"].get("rng_key")
        if rng_key is not None:
            sample_shape = site["kwargs"].get("sample_shape", ())
            u = u + dist.Uniform(-radius, radius)(rng_key=rng_key,
                                                  sample_shape=sample_shape + u.shape)
    return transform(u)


# ------------------------------------------------------------------------------------------------
# NUTS
# ------------------------------------------------------------------------------------------------
def run_nuts(
    model: NoisyMarginalsModel | Callable[..., Any],
    key: jax.Array,
    *model_args: Any,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    init: str | Mapping[str, Array] = "uniform",
    radius: float = 0.5,
    chain_method: str = "sequential",
    progress_bar: bool = False,
    target_accept_prob: float = 0.8,
    dense_mass: bool = False,
    max_tree_depth: int = 10,
    **model_kwargs: Any,
) -> MCMC:
    """Run NUTS on a model with a relaxed CGM site from an interior starting point.

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
        Any NumPyro model.
    key : JAX PRNG key
    *model_args, **model_kwargs
        Passed to the model (e.g. ``y=`` for a simulated release).
    num_warmup, num_samples, num_chains : int
    init : "uniform" or mapping site -> value
        Centre of the starting points: uniform tables and ``φ = 0`` (a
        :class:`NoisyMarginalsModel`'s sites); or given constrained values, such as the NLBP-EM
        estimate :func:`numpyro_dpgm.estimation.cgm_em.em_start`.
    radius : float
        Jitter of each chain's start in the unconstrained space (:func:`init_to_interior`).
    chain_method : {"sequential", "parallel", "vectorized"}
    progress_bar : bool
    target_accept_prob, dense_mass, max_tree_depth :
        NUTS options.

    Returns
    -------
    numpyro.infer.MCMC
        After ``run``; ``mcmc.get_samples()`` holds every latent and deterministic site and
        ``mcmc.get_extra_fields()`` the statistics :data:`NUTS_FIELDS` and ``diverging``.
    """
    values = _init_values(model, init)
    kernel = NUTS(model, init_strategy=init_to_interior(values=values, radius=radius),
                  target_accept_prob=target_accept_prob, dense_mass=dense_mass,
                  max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=progress_bar)
    mcmc.run(key, *model_args, extra_fields=NUTS_FIELDS, **model_kwargs)
    return mcmc


def _init_values(model: Any, init: str | Mapping[str, Array]) -> dict[str, Array]:
    if isinstance(model, NoisyMarginalsModel):
        return model.starting_point(init)
    if isinstance(init, str):
        if init == "uniform":
            return {}
        raise ValueError(f"init={init!r} needs a NoisyMarginalsModel; pass a dict of values")
    return dict(init)


# ------------------------------------------------------------------------------------------------
# SVI
# ------------------------------------------------------------------------------------------------
_GUIDES = {"normal": AutoNormal, "mvn": AutoMultivariateNormal, "delta": AutoDelta}


class SVIFit(NamedTuple):
    """Output of :func:`run_svi`.

    Attributes
    ----------
    guide : numpyro.infer.autoguide.AutoGuide
    params : dict
        The optimised variational parameters.
    losses : array ``(num_steps,)``
        The negative ELBO at every step.
    samples : dict
        ``num_samples`` draws of every latent and deterministic site from the guide (one
        repeated point for ``"delta"``).
    elapsed : float
        Seconds, compilation included.
    model_args, model_kwargs : tuple, dict
        The arguments the model was fitted with (e.g. ``y=`` for a simulated release).
    """

    guide: Any
    params: dict
    losses: Any
    samples: dict
    elapsed: float
    model_args: tuple = ()
    model_kwargs: dict | None = None


def run_svi(
    model: NoisyMarginalsModel | Callable[..., Any],
    key: jax.Array,
    *model_args: Any,
    guide: str = "normal",
    num_steps: int = 3000,
    learning_rate: float = 0.02,
    num_particles: int = 1,
    num_samples: int = 1000,
    init: str | Mapping[str, Array] = "uniform",
    progress_bar: bool = False,
    **model_kwargs: Any,
) -> SVIFit:
    """Variational inference on a model with a relaxed CGM site.

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
    key : JAX PRNG key
    guide : {"normal", "mvn", "delta"}
        ``AutoNormal`` (mean field in the unconstrained space), ``AutoMultivariateNormal``
        (full covariance) or ``AutoDelta`` (MAP of the relaxed posterior density, no
        Jacobian: a point estimate, not the NLBP objective).
    num_steps, learning_rate, num_particles :
        Adam steps, step size and Monte-Carlo particles of the ELBO.
    num_samples : int
        Draws returned in :attr:`SVIFit.samples`.
    init : "uniform" or mapping site -> value
        Where the guide's location starts (as in :func:`run_nuts`, without jitter).
    """
    if guide not in _GUIDES:
        raise ValueError(f"guide must be one of {sorted(_GUIDES)}, got {guide!r}")
    start = time.perf_counter()
    values = _init_values(model, init)
    init_fn = init_to_interior(values=values, radius=0.0)
    auto = _GUIDES[guide](model, init_loc_fn=init_fn)
    svi = SVI(model, auto, numpyro.optim.Adam(learning_rate), Trace_ELBO(num_particles))
    k_fit, k_draw = jax.random.split(key)
    result = svi.run(k_fit, num_steps, *model_args, progress_bar=progress_bar, **model_kwargs)
    sites = _latent_and_deterministic_sites(model, model_args, model_kwargs)
    predictive = Predictive(model, guide=auto, params=result.params, num_samples=num_samples,
                            return_sites=sites)
    draws = predictive(k_draw, *model_args, **model_kwargs)
    return SVIFit(auto, result.params, result.losses, draws, time.perf_counter() - start,
                  tuple(model_args), dict(model_kwargs))


def _latent_and_deterministic_sites(model: Any, args: tuple, kwargs: dict) -> list[str]:
    tr = handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)
    return [name for name, site in tr.items()
            if (site["type"] == "sample" and not site["is_observed"])
            or site["type"] == "deterministic"]
