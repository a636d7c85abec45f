"""ArviZ integration: inference data with named dims, predictive marginals, convergence reports.

:func:`to_inference_data` wraps :func:`arviz.from_numpyro` so that the sites of a relaxed-CGM
model carry meaningful dims: ``cell`` (one coordinate per cell of the network's flat layout,
``"a=0,b=1"``, which names the clique's attributes; :func:`clique_tables` reshapes a ``cell``
variable into one table per clique with one dim per attribute), ``param`` (the reference-coded
parameters, ``"a=1,b=2"``) and ``answer`` (the released answers). :func:`convergence_report`
tabulates split R-hat and bulk/tail ESS (ArviZ's rank-normalised estimators);
:func:`studies.convergence.demo_convergence` runs them on a small simulated
release.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from numpyro.infer import MCMC, Predictive

from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from .bayes import (
    LaplaceFit,
    NoisyMarginalsModel,
    SVIFit,
    cell_labels,
    reference_coding,
)

__all__ = [
    "ConvergenceReport",
    "clique_tables",
    "convergence_report",
    "marginal_summary",
    "posterior_marginals",
    "posterior_predictive",
    "to_inference_data",
]

Array = Any

_CELL_SITES = ("n", "theta", "mu")


def _coords_dims(
    model_or_network: NoisyMarginalsModel | MarkovNetwork, shapes: dict[str, tuple[int, ...]],
) -> tuple[dict, dict]:
    """Coords and dims of the sites whose per-draw shapes are ``shapes``.

    A leading axis beyond a site's documented dims (a batch of releases) gets the dim
    ``release``.
    """
    if isinstance(model_or_network, NoisyMarginalsModel):
        coords = dict(model_or_network.coords)
        dims = {}
        for k, v in model_or_network.dims.items():
            if k in shapes:
                extra = len(shapes[k]) - len(v)
                dims[k] = (["release"] if extra == 1 else []) + list(v)
        return coords, dims
    if not isinstance(model_or_network, MarkovNetwork):
        raise TypeError(
            "to_inference_data needs the NoisyMarginalsModel or the MarkovNetwork of the run, "
            f"got {type(model_or_network).__name__}"
        )
    net = model_or_network
    cells, _ = cell_labels(net)
    coords: dict[str, list[str]] = {"cell": cells}
    dims: dict[str, list[str]] = {}
    for k, shape in shapes.items():
        if k in _CELL_SITES and shape[-1:] == (net.num_params,):
            dims[k] = (["release"] if len(shape) == 2 else []) + ["cell"]
    coding = reference_coding(net)
    if "phi" in shapes and shapes["phi"][-1:] == (coding.dim,):
        coords["param"] = coding.labels
        dims["phi"] = (["release"] if len(shapes["phi"]) == 2 else []) + ["param"]
    return coords, dims


_STAT_NAMES = {
    "potential_energy": "lp",
    "adapt_state.step_size": "step_size",
    "num_steps": "n_steps",
    "accept_prob": "acceptance_rate",
}


def _sample_stats(mcmc: MCMC) -> dict[str, np.ndarray]:
    """NumPyro's extra fields under ArviZ's names (as :func:`arviz.from_numpyro` does)."""
    out = {}
    for stat, value in mcmc.get_extra_fields(group_by_chain=True).items():
        if isinstance(value, dict | tuple):
            continue
        value = np.asarray(value)
        name = _STAT_NAMES.get(stat, stat)
        out[name] = -value if stat == "potential_energy" else value
        if stat == "num_steps":
            depth = np.log2(np.maximum(value, 1)).astype(int) + 1
            out["tree_depth"] = depth
            max_depth = getattr(mcmc.sampler, "_max_tree_depth", None)
            if isinstance(max_depth, int):
                out["reached_max_tree_depth"] = depth >= max_depth
    return out


def pointwise_log_likelihood(model: NoisyMarginalsModel, n: Array, y: Array | None = None) -> Any:
    """``log p(y_i | n)`` of every released answer ``i`` for draws ``n`` of shape
    ``batch + (num_params,)``; returns ``batch + (num_answers,)`` (for LOO and WAIC)."""
    y = jnp.asarray(model.y if y is None else y)
    pred = model.predict(jnp.asarray(n))
    scale = jnp.asarray(model.noise_scales)
    if model.noise_family == "laplace":
        return -jnp.abs(y - pred) / scale - jnp.log(2.0 * scale)
    return -0.5 * ((y - pred) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2.0 * jnp.pi)


def clique_tables(
    tree: Any, network: MarkovNetwork, var: str = "n", group: str = "posterior",
) -> Any:
    """One variable per clique, with one dim per attribute (levels as coords).

    Parameters
    ----------
    tree : DataTree
        From :func:`to_inference_data`.
    network : MarkovNetwork
    var : str
        A variable with a ``cell`` dim (``"n"``, ``"theta"``, ``"mu"``).
    group : str

    Returns
    -------
    xarray.Dataset
        Variable ``"a,b"`` with dims ``(chain, draw, a, b)`` for clique ``("a", "b")``; cliques
        that share an attribute share its dim.
    """
    import xarray as xr

    da = tree[group].to_dataset()[var]
    if "cell" not in da.dims:
        raise ValueError(f"{group}/{var} has no 'cell' dim (dims {da.dims})")
    out = {}
    lead = [d for d in da.dims if d != "cell"]
    for c, shape in zip(network.cliques, network.shapes, strict=True):
        sl = network.slice_of(c)
        part = da.isel(cell=slice(sl.start, sl.stop)).transpose(*lead, "cell")
        values = np.asarray(part.values).reshape(part.shape[:-1] + shape)
        coords = {d: da.coords[d].values for d in lead if d in da.coords}
        coords.update({a: np.arange(k) for a, k in zip(c, shape, strict=True)})
        out[",".join(c)] = xr.DataArray(values, dims=lead + list(c), coords=coords)
    return xr.Dataset(out)


def posterior_predictive(
    model: Any, samples: dict[str, Array], rng_key: jax.Array, *model_args: Any,
    sites: Sequence[str] = ("y",), **model_kwargs: Any,
) -> dict[str, Array]:
    """Posterior predictive draws of the observed sites (``y`` left unobserved).

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
        Called with ``y=None`` (a :class:`NoisyMarginalsModel` then samples ``y``); a user
        model must accept the same convention, or take ``model_args``/``model_kwargs`` that
        leave its observed sites unobserved.
    samples : dict
        Posterior draws of the latent sites (``mcmc.get_samples()``), flat over chains.
    rng_key : JAX PRNG key
    sites : sequence of str
        The sites to return.
    """
    if "y" not in model_kwargs and not model_args:
        model_kwargs = {**model_kwargs, "y": None}
    latent = {k: v for k, v in samples.items() if k not in sites}
    pred = Predictive(model, posterior_samples=latent, return_sites=list(sites))
    return dict(pred(rng_key, *model_args, **model_kwargs))


def to_inference_data(
    posterior: MCMC | SVIFit | LaplaceFit,
    model: NoisyMarginalsModel | MarkovNetwork,
    *,
    predictive: bool | None = None,
    prior_draws: int = 0,
    rng_key: jax.Array | None = None,
    log_likelihood: bool = False,
) -> Any:
    """ArviZ ``DataTree`` of a NUTS run (or an SVI fit or a Laplace approximation) with
    meaningful dims and coords.

    Parameters
    ----------
    posterior : numpyro.infer.MCMC, SVIFit or LaplaceFit
        A finished MCMC run, or the output of :func:`~numpyro_dpgm.infer.bayes.run_svi` or
        :func:`~numpyro_dpgm.infer.bayes.laplace.run_laplace` (their draws become one chain).
    model : NoisyMarginalsModel or MarkovNetwork
        The model that was run, or the network of a model of your own. With the model, the tree
        is assembled here (observed data, sample stats, predictive groups, pointwise log
        likelihood per answer); with a network, :func:`arviz.from_numpyro` does it (for a fit
        or an approximation, :func:`arviz.from_dict` of its draws) and only the
        ``cell`` dims (sites ``n``/``theta``/``mu`` whose last axis has ``num_params``
        entries) and ``param`` dims (``phi``) are added. (``from_numpyro`` traces the model
        once with a prior draw of every latent site, which for a CGM site draws ``N`` records.)
    predictive : bool, optional
        Add a ``posterior_predictive`` group with draws of ``y``. Default: with a
        :class:`NoisyMarginalsModel` only.
    prior_draws : int
        Add ``prior`` and ``prior_predictive`` groups with this many draws (0: none; needs the
        model). Prior draws of ``n`` are exact CGM draws of ``N`` records each.
    rng_key : JAX PRNG key, optional
        For the predictive and prior draws (default ``jax.random.key(0)``).
    log_likelihood : bool
        Add the pointwise log likelihood of every answer (a ``log_likelihood`` group, for
        LOO).

    Returns
    -------
    xarray.DataTree
        Groups ``posterior``, ``sample_stats`` (MCMC: ``diverging``, ``lp``, ``step_size``,
        ``n_steps``, ``tree_depth``, ``acceptance_rate``, ``energy`` as collected by
        :func:`~numpyro_dpgm.infer.bayes.run_nuts`), ``observed_data`` and the requested
        groups. A batch of releases adds the dim ``release``. A run of
        :func:`~numpyro_dpgm.infer.bayes.run_nuts` records its path (``"exact"``,
        ``"relaxed"``, ``"normal"`` or ``"collapsed"``) in ``tree["posterior"].attrs["cgm_path"]``.
    """
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    k_pred, k_prior = jax.random.split(rng_key)
    if not isinstance(posterior, MCMC | SVIFit | LaplaceFit):
        raise TypeError("posterior must be a numpyro MCMC run, an SVIFit or a LaplaceFit, got "
                        f"{type(posterior).__name__}")
    if not isinstance(model, NoisyMarginalsModel | MarkovNetwork):
        raise TypeError(
            "to_inference_data needs the NoisyMarginalsModel or the MarkovNetwork of the run, "
            f"got {type(model).__name__}"
        )
    sampled = getattr(posterior, "model", None)  # run_nuts's: the form of the CGM site it ran
    if (isinstance(model, NoisyMarginalsModel) and isinstance(sampled, NoisyMarginalsModel)
            and sampled.network is model.network
            and sampled.measurements is model.measurements):
        model = sampled
    if predictive is None:
        predictive = isinstance(model, NoisyMarginalsModel)
    if isinstance(posterior, MCMC):
        flat = posterior.get_samples()
        by_chain = {k: np.asarray(v) for k, v in
                    posterior.get_samples(group_by_chain=True).items()}
        kwargs = dict(posterior._kwargs)  # the run's model keyword arguments (e.g. y=)
        args = tuple(posterior._args)
    else:
        flat = posterior.samples
        by_chain = {k: np.asarray(v)[None] for k, v in flat.items()}
        args, kwargs = tuple(posterior.model_args), dict(posterior.model_kwargs or {})
    shapes = {k: v.shape[2:] for k, v in by_chain.items()}

    if not isinstance(model, NoisyMarginalsModel):
        if prior_draws or predictive or log_likelihood:
            raise ValueError("predictive draws, prior draws and the pointwise log likelihood "
                             "need the NoisyMarginalsModel; pass it instead of the network")
        coords, dims = _coords_dims(model, shapes)
        if not isinstance(posterior, MCMC):
            return _with_path(az.from_dict({"posterior": by_chain}, coords=coords, dims=dims),
                              posterior)
        return _with_path(az.from_numpyro(posterior, coords=coords, dims=dims), posterior)

    y_obs = np.asarray(kwargs.get("y", model.y) if not args else args[0])
    if y_obs is None:
        raise ValueError("the run left y unobserved; there is no posterior to summarise")
    shapes["y"] = y_obs.shape
    coords, dims = _coords_dims(model, shapes)
    n_chain, n_draw = next(iter(by_chain.values())).shape[:2]
    groups: dict[str, Any] = {"posterior": by_chain, "observed_data": {"y": y_obs}}
    if isinstance(posterior, MCMC):
        groups["sample_stats"] = _sample_stats(posterior)
    if predictive:
        pp = posterior_predictive(model, dict(flat), k_pred)
        groups["posterior_predictive"] = {
            "y": np.asarray(pp["y"]).reshape((n_chain, n_draw) + y_obs.shape)}
    if log_likelihood:
        ll = pointwise_log_likelihood(model, by_chain["n"], y_obs)
        groups["log_likelihood"] = {"y": np.asarray(ll)}
    if prior_draws:
        if y_obs.ndim == 2:
            raise ValueError("prior draws of a batch of releases: draw them with "
                             "numpyro.infer.Predictive from the single-release model")
        draws = Predictive(model, num_samples=int(prior_draws))(k_prior, y=None)
        groups["prior"] = {k: np.asarray(v)[None] for k, v in draws.items() if k != "y"}
        groups["prior_predictive"] = {"y": np.asarray(draws["y"])[None]}
    return _with_path(az.from_dict(groups, coords=coords, dims=dims), posterior)


def _with_path(tree: Any, posterior: Any) -> Any:
    """``tree`` with run_nuts's path (``"exact"``: record moves within Gibbs, ``"relaxed"``,
    ``"normal"`` or ``"collapsed"``) in ``tree["posterior"].attrs["cgm_path"]``, where the
    run has one."""
    path = getattr(posterior, "path", None)
    if path is not None:
        tree["posterior"].attrs["cgm_path"] = path
    return tree


def posterior_marginals(
    network: MarkovNetwork, theta: Array, attrs: Sequence[str], total: float = 1.0,
) -> Array:
    """Marginal tables ``total · μ_attrs(θ)`` for every posterior draw of ``θ``.

    ``attrs`` is any attribute set, also one that no clique contains (an out-of-model marginal,
    computed exactly on the junction tree).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array ``batch + (num_params,)``
        Draws of the log-potentials (the ``theta`` site).
    attrs : sequence of str
    total : float
        ``1`` for probabilities, ``N`` for expected counts.

    Returns
    -------
    array ``batch + domain.shape_of(attrs)``
    """
    attrs = network.domain.check_clique(attrs)
    theta = jnp.asarray(theta)
    if theta.ndim < 1 or theta.shape[-1] != network.num_params:
        raise ValueError(f"theta has shape {theta.shape}; expected (..., {network.num_params})")
    flat = jnp.reshape(theta, (-1, network.num_params))
    fn = jax.jit(jax.vmap(lambda t: jt.marginal(network, t, attrs)))
    out = total * fn(flat)
    return jnp.reshape(out, theta.shape[:-1] + network.domain.shape_of(attrs))


def marginal_summary(
    network: MarkovNetwork, theta: Array, attrs: Sequence[str], *, prob: float = 0.89,
    total: float = 1.0, reference: Array | None = None,
) -> pd.DataFrame:
    """Posterior mean, sd and central interval of every cell of the marginal over ``attrs``.

    Parameters
    ----------
    network, theta, attrs, total :
        As in :func:`posterior_marginals`.
    prob : float
        Mass of the equal-tailed interval (ArviZ's default 0.89).
    reference : array, optional
        A table to show beside (e.g. a point estimate or the truth), same shape as the
        marginal.

    Returns
    -------
    pandas.DataFrame
        One row per cell (index ``"a=0,b=1"``) with ``mean``, ``sd``, ``lower``, ``upper``
        (and ``reference``).
    """
    if not 0 < prob < 1:
        raise ValueError(f"prob must be in (0, 1), got {prob}")
    attrs = network.domain.check_clique(attrs)
    draws = np.asarray(posterior_marginals(network, theta, attrs, total))
    shape = network.domain.shape_of(attrs)
    flat = draws.reshape(-1, int(np.prod(shape)))
    lo, hi = np.quantile(flat, [(1 - prob) / 2, (1 + prob) / 2], axis=0)
    index = [",".join(f"{a}={v}" for a, v in zip(attrs, idx, strict=True))
             for idx in np.ndindex(*shape)]
    frame = pd.DataFrame({"mean": flat.mean(0), "sd": flat.std(0, ddof=1), "lower": lo,
                          "upper": hi}, index=index)
    if reference is not None:
        ref = np.asarray(reference, dtype=float)
        if ref.shape != shape and ref.size != flat.shape[1]:
            raise ValueError(f"reference has shape {ref.shape}; expected {shape}")
        frame["reference"] = ref.ravel()
    return frame


class ConvergenceReport(NamedTuple):
    """Split R-hat and effective sample sizes of a run.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per scalar (e.g. ``n[a=0,b=1]``): ``r_hat``, ``ess_bulk``, ``ess_tail``.
    max_r_hat, min_ess_bulk, min_ess_tail : float
    divergences : int
        Divergent transitions after warmup (0 when the run has no such statistic).
    num_chains, num_draws : int
    """

    table: pd.DataFrame
    max_r_hat: float
    min_ess_bulk: float
    min_ess_tail: float
    divergences: int
    num_chains: int
    num_draws: int

    def __str__(self) -> str:
        return (f"{self.num_chains} chains x {self.num_draws} draws: max R-hat "
                f"{self.max_r_hat:.4f}, min bulk ESS {self.min_ess_bulk:.0f}, min tail ESS "
                f"{self.min_ess_tail:.0f}, {self.divergences} divergences")


def convergence_report(tree: Any, var_names: Sequence[str] | None = None) -> ConvergenceReport:
    """R-hat (rank-normalised split R-hat) and bulk/tail ESS of a run, from ArviZ.

    Parameters
    ----------
    tree : DataTree
        From :func:`to_inference_data` (or :func:`arviz.from_numpyro`).
    var_names : sequence of str, optional
        Default: the latent sites ``phi`` and ``n`` and the marginals ``mu`` that are present
        (``theta`` has cells fixed at zero by the gauge, whose R-hat is undefined).
    """
    post = tree["posterior"].to_dataset()
    if var_names is None:
        var_names = [v for v in ("phi", "n", "mu") if v in post.data_vars]
        if not var_names:
            var_names = list(post.data_vars)
    table = az.summary(tree, var_names=list(var_names), kind="diagnostics", round_to="none")
    cols = {c.lower(): c for c in table.columns}
    rhat = table[cols["r_hat"]].astype(float)
    bulk = table[cols["ess_bulk"]].astype(float)
    tail = table[cols["ess_tail"]].astype(float)
    out = pd.DataFrame({"r_hat": rhat, "ess_bulk": bulk, "ess_tail": tail})
    divergences = 0
    if "sample_stats" in tree.children:
        stats = tree["sample_stats"].to_dataset()
        if "diverging" in stats:
            divergences = int(stats["diverging"].sum())
    return ConvergenceReport(
        table=out,
        max_r_hat=float(np.nanmax(rhat.to_numpy())),
        min_ess_bulk=float(np.nanmin(bulk.to_numpy())),
        min_ess_tail=float(np.nanmin(tail.to_numpy())),
        divergences=divergences,
        num_chains=int(post.sizes["chain"]),
        num_draws=int(post.sizes["draw"]),
    )
