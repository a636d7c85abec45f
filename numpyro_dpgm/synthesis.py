"""Synthetic data from a fitted model: one data set from a point estimate, one per posterior draw.

A point estimate ``p_θ̂`` (a :class:`~numpyro_dpgm.MarkovRandomField`, or an estimator's
``Result``) gives synthetic records that carry the sampling variability of ``num_records`` draws
only. Noise-aware synthesis (Räisä et al. 2023, NAPSU-MQ, §3; the "fully synthetic data" of
Raghunathan, Reiter & Rubin 2003) draws ``m`` parameter values ``θ^(1..m)`` from the posterior
given the noisy release, and one data set ``D^(j) ~ p_{θ^(j)}`` of ``num_records`` records per
draw; analyses of the ``m`` data sets are combined with :func:`numpyro_dpgm.combining.rubin`.

Records are drawn by exact forward sampling on the junction tree
(:meth:`MarkovRandomField.sample`, ``sampling="sample"``), or made by rounding the model's
expected counts along it (``sampling="round"``, :mod:`numpyro_dpgm.oracles.rounding`, the
default of Private-PGM): every attribute's counts within each group of records that share its
parents are the floor or the ceiling of their expected counts, with no sampling noise. A
mechanism's ``Result`` names its own default (``extras["sampling"]``: ``"round"`` for MST and
AIM, as in Private-PGM); any other source is sampled unless told otherwise. Columns carry the
domain's attribute names; with ``categories`` (attribute -> labels, index = code) they are
pandas categoricals with the original labels, otherwise integer codes.

Attributes of the domain that are in none of the model's cliques (no released table measured
them) are kept: with no measurement, the maximum-entropy model makes them uniform over their
values and independent of the rest, and that is how they are sampled, with an
:class:`UnmodelledAttributesWarning` naming them. ``drop_unmodelled=True`` leaves them out.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ._warnings import warn
from .distributions.constraints import decomposable_layout
from .distributions.mrf import MarkovRandomField
from .infer.bayes import reference_coding
from .network import MarkovNetwork
from .oracles.rounding import check_rounding_memory, round_records
from .tables import project_table

__all__ = ["SAMPLE_CHUNK", "SyntheticChunk", "UnmodelledAttributesWarning", "iter_synthetic",
           "iter_synthetic_chunks", "posterior_models", "synthesize", "theta_from_counts",
           "unmodelled_attributes"]

Array = Any

#: Posterior sites :func:`posterior_models` turns into record models.
SITES = ("theta", "phi", "n")

#: How records are made: drawn at random, or rounded from expected counts.
SAMPLINGS = ("sample", "round")

#: Records drawn per call of the sampler. Data set ``j`` is drawn in chunks of this many records,
#: chunk ``c`` with the key ``fold_in(fold_in(rng_key, j), c)``, whether the records are
#: returned at once (:func:`synthesize`) or chunk by chunk (:func:`iter_synthetic_chunks`): the
#: records are the same either way, and the sampler's working memory (about 1.8 kB per record on
#: Adult's tree) is bounded by one chunk.
SAMPLE_CHUNK = 65_536


class SyntheticChunk(NamedTuple):
    """Consecutive records of one synthetic data set (see :func:`iter_synthetic_chunks`)."""

    dataset: int  #: index ``j`` of the data set, from 0
    start: int  #: index of the chunk's first record within its data set
    frame: pd.DataFrame  #: the records
    last: bool  #: whether this chunk ends its data set


class UnmodelledAttributesWarning(UserWarning):
    """Synthetic columns of attributes in no clique: sampled uniformly, independent of the rest."""


def unmodelled_attributes(network: MarkovNetwork) -> list[str]:
    """Attributes of ``network``'s domain in none of its cliques, in domain order."""
    covered = {a for c in network.cliques for a in c}
    return [a for a in network.domain.attrs if a not in covered]


# ------------------------------------------------------------------------------------------------
# latent counts -> log-potentials
# ------------------------------------------------------------------------------------------------
def theta_from_counts(network: MarkovNetwork, n: Array) -> jax.Array:
    """Log-potentials of the maximum-entropy record model whose clique marginals are ``n / N``.

    On a decomposable network the model with clique marginals ``μ_C`` factorises over its
    junction tree as ``p(x) = Π_C μ_C(x_C) / Π_S μ_S(x_S)`` (Lauritzen 1996, Prop. 4.18 / the
    junction-tree form of the CGM in Bernstein & Sheldon, seed 002, §3): ``θ_C = log μ_C`` on
    the junction-tree cliques, ``− log μ_S`` of every separator added to a clique containing it,
    zero elsewhere. Attributes in no clique are uniform.

    Parameters
    ----------
    network : MarkovNetwork
        Decomposable (as for the relaxed CGM whose draws ``n`` are).
    n : array ``(..., num_params)``
        Consistent clique count tables in the network's layout (e.g. NUTS draws of the latent
        site ``n`` of :func:`numpyro_dpgm.infer.bayes.noisy_marginals_model`), every cell > 0.

    Returns
    -------
    array ``(..., num_params)``
    """
    n = jnp.asarray(n)
    if n.ndim < 1 or n.shape[-1] != network.num_params:
        raise ValueError(f"n has shape {n.shape}; this network needs (..., {network.num_params})")
    if not bool(jnp.all(n > 0)):
        raise ValueError(
            "n has zero or negative cells, whose log-potential would be -inf; use draws of "
            "the relaxed CGM (strictly inside N·M) or synthesize from the 'theta' draws instead"
        )
    layout = decomposable_layout(network)
    batch = n.shape[:-1]
    names = tuple(f"__b{i}" for i in range(len(batch)))
    tables = {c: jnp.reshape(n[..., network.slice_of(c)], batch + network.domain.shape_of(c))
              for c in network.cliques}
    theta = {c: jnp.zeros_like(t) for c, t in tables.items()}
    for c in layout.tree_cliques:
        theta[c] = theta[c] + jnp.log(tables[c])
    for host, sep in layout.separators:
        if sep:  # an empty separator joins two disconnected parts: nothing to divide by
            log_sep = jnp.log(project_table(tables[host], names + host, names + sep))
            theta[host] = theta[host] - _align(log_sep, sep, host, batch)
    # p ∝ Π n_C / Π n_S differs from Π μ_C / Π μ_S by a constant, which A(θ) absorbs
    return jnp.concatenate([jnp.reshape(theta[c], batch + (-1,)) for c in network.cliques],
                           axis=-1)


def _align(table: Array, sep: tuple, host: tuple, batch: tuple) -> Array:
    """A table over ``batch + sep`` reshaped to broadcast against ``batch + host``."""
    in_host = tuple(a for a in host if a in sep)
    perm = list(range(len(batch))) + [len(batch) + sep.index(a) for a in in_host]
    table = jnp.transpose(table, perm)
    shape = batch + tuple(table.shape[len(batch) + in_host.index(a)] if a in sep else 1
                          for a in host)
    return jnp.reshape(table, shape)


# ------------------------------------------------------------------------------------------------
# sources
# ------------------------------------------------------------------------------------------------
def _model_of(source: Any) -> Any:
    """The NumPyro model a posterior object was fitted with, or None."""
    sampler = getattr(source, "sampler", None)  # numpyro.infer.MCMC
    if sampler is not None:
        return getattr(sampler, "model", None)
    guide = getattr(source, "guide", None)  # infer.bayes.SVIFit
    return getattr(guide, "model", None)


def _draws_of(source: Any) -> Mapping[str, Array] | None:
    if hasattr(source, "get_samples"):  # MCMC
        return source.get_samples()
    if hasattr(source, "posterior") and hasattr(source.posterior, "data_vars"):  # InferenceData
        post = source.posterior
        return {k: np.asarray(post[k]).reshape((-1,) + post[k].shape[2:]) for k in post.data_vars}
    samples = getattr(source, "samples", None)  # SVIFit
    if isinstance(samples, Mapping):
        return samples
    if isinstance(source, Mapping):
        return source
    return None


def posterior_models(
    source: Any,
    network: MarkovNetwork | None = None,
    site: str = "theta",
) -> MarkovRandomField:
    """Posterior draws as one batched record model, batch shape ``(num_draws,)``.

    Parameters
    ----------
    source : MCMC, SVIFit, arviz.InferenceData or mapping site -> draws
        The output of :func:`numpyro_dpgm.infer.bayes.run_nuts` (chains are pooled),
        :func:`~numpyro_dpgm.infer.bayes.run_svi`, ``arviz.from_numpyro`` or
        :func:`~numpyro_dpgm.infer.diagnostics.to_inference_data`, or a plain mapping such as
        ``dict(np.load("fit.npz"))`` holding the site below with a leading draw axis.
    network : MarkovNetwork, optional
        Needed unless ``source`` was fitted with a
        :class:`~numpyro_dpgm.infer.bayes.NoisyMarginalsModel` (taken from it).
    site : {"theta", "phi", "n"}
        ``"theta"``: the record model's log-potentials (the noise-aware choice: new records
        from the population model, Räisä et al. 2023); ``"phi"``: the parameters the prior sits
        on, mapped to ``θ`` by the fitted model's coding (draws without their model: the
        reference coding at level 0, :class:`~numpyro_dpgm.infer.bayes.ReferenceCoding`);
        ``"n"``: the
        latent true count tables, each turned into the maximum-entropy model with their
        marginals (:func:`theta_from_counts`): records that resemble the confidential data
        set rather than its population.
    """
    if site not in SITES:
        raise ValueError(f"site must be one of {list(SITES)}, got {site!r}")
    model = _model_of(source)
    if network is None:
        network = getattr(model, "network", None)
        if network is None:
            raise TypeError(
                "pass network=: the posterior draws do not say which MarkovNetwork they belong to"
            )
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    draws = _draws_of(source)
    if draws is None:
        raise TypeError(
            f"cannot read posterior draws from a {type(source).__name__}; pass an MCMC, SVIFit, "
            "arviz.InferenceData, a mapping of site -> draws, or a MarkovRandomField"
        )
    if site not in draws:
        raise KeyError(f"the posterior has no draws of site {site!r}; it has {sorted(draws)}")
    values = jnp.asarray(draws[site])
    if site == "phi":
        coding = getattr(model, "coding", None) or reference_coding(network)
        if values.ndim != 2 or values.shape[-1] != coding.dim:
            raise ValueError(f"phi draws have shape {values.shape}; expected (draws, {coding.dim})")
        theta = coding.to_theta(values)
    elif site == "n":
        theta = theta_from_counts(network, _as_draws(values, network, site))
    else:
        theta = _as_draws(values, network, site)
    return MarkovRandomField(network, theta)


def _as_draws(values: jax.Array, network: MarkovNetwork, site: str) -> jax.Array:
    if values.ndim < 2 or values.shape[-1] != network.num_params:
        raise ValueError(
            f"{site} draws have shape {values.shape}; expected (draws, {network.num_params}) "
            "(chains are pooled; a single point estimate is a MarkovRandomField)"
        )
    return jnp.reshape(values, (-1, network.num_params))


# ------------------------------------------------------------------------------------------------
# records -> DataFrame
# ------------------------------------------------------------------------------------------------
def _category_map(categories: Any, network: MarkovNetwork) -> dict[str, list]:
    if categories is None:
        return {}
    cats = getattr(categories, "categories", categories)  # an encoding object or a mapping
    if not isinstance(cats, Mapping):
        raise TypeError(
            f"categories must map attribute -> list of labels, got {type(categories).__name__}"
        )
    domain = network.domain
    unknown = [a for a in cats if a not in domain]
    if unknown:
        raise KeyError(f"categories name attribute(s) {unknown} not in the domain {list(domain)}")
    out = {}
    for a, labels in cats.items():
        labels = list(labels)
        if len(labels) != domain[a]:
            raise ValueError(
                f"categories[{a!r}] has {len(labels)} labels but the domain gives {a!r} "
                f"{domain[a]} values; give one label per code 0..{domain[a] - 1}"
            )
        if len(set(labels)) != len(labels):
            raise ValueError(f"categories[{a!r}] has repeated labels; labels must be unique")
        out[a] = labels
    return out


def _columns(columns: Sequence[str] | None, network: MarkovNetwork) -> list[str]:
    domain = network.domain
    if columns is None:
        return list(domain.attrs)
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of attribute names, not one string")
    columns = list(columns)
    unknown = [c for c in columns if c not in domain]
    if unknown:
        raise KeyError(f"columns {unknown} are not attributes of the domain {list(domain)}")
    if len(set(columns)) != len(columns):
        raise ValueError(f"columns has repeated names: {columns}")
    return columns


def _frame(codes: np.ndarray, network: MarkovNetwork, cats: dict[str, list],
           columns: list[str], total: Any = None) -> pd.DataFrame:
    domain = network.domain
    data = {}
    for a in columns:
        col = codes[:, domain.index(a)].astype(np.int64)
        data[a] = pd.Categorical.from_codes(col, categories=cats[a]) if a in cats else col
    frame = pd.DataFrame(data, columns=columns)
    if total is not None:
        frame.attrs["total_count"] = float(total)
    return frame


def _check_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _key(rng_key: Any) -> jax.Array:
    if isinstance(rng_key, (int, np.integer)) and not isinstance(rng_key, bool):
        return jax.random.key(int(rng_key))
    if isinstance(rng_key, jax.Array) and (
            jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key)
            or (rng_key.dtype == jnp.uint32 and rng_key.shape == (2,))):
        return rng_key
    raise TypeError(f"rng_key must be an int seed or a JAX PRNG key, got "
                    f"{type(rng_key).__name__}")


def _default_num_records(source: Any) -> int:
    total = getattr(_model_of(source), "total_count", None)  # N of a NoisyMarginalsModel
    if total is None:
        raise TypeError(
            "pass num_records=: the source does not say how many records the data had"
        )
    return int(total)


# ------------------------------------------------------------------------------------------------
# the entry point
# ------------------------------------------------------------------------------------------------
def synthesize(
    source: Any,
    num_records: int | None,
    num_datasets: int = 1,
    *,
    rng_key: Any,
    categories: Any = None,
    columns: Sequence[str] | None = None,
    network: MarkovNetwork | None = None,
    site: str = "theta",
    drop_unmodelled: bool = False,
    sampling: str | None = None,
) -> pd.DataFrame | list[pd.DataFrame]:
    """Synthetic data sets from a fitted model: a point estimate, or posterior draws.

    Parameters
    ----------
    source :
        A point estimate: a :class:`~numpyro_dpgm.MarkovRandomField` with empty batch shape,
        or an estimator's ``Result`` (its ``.model``). Posterior draws: an MCMC from
        :func:`~numpyro_dpgm.infer.bayes.run_nuts`, an
        :class:`~numpyro_dpgm.infer.bayes.SVIFit`, an ``arviz.InferenceData``, a mapping
        site -> draws (see :func:`posterior_models`), or a MarkovRandomField with batch shape
        ``(num_draws,)``.
    num_records : int or None
        Records per data set. ``None`` takes the release's ``total_count`` from a posterior
        fitted with a :class:`~numpyro_dpgm.infer.bayes.NoisyMarginalsModel` (the
        "same size" choice of the combining rules; see :mod:`numpyro_dpgm.combining`).
    num_datasets : int
        ``m``. From posterior draws: one data set per draw, the ``m`` draws evenly spaced over
        the pooled chains (``m`` must not exceed the number of draws). From a point estimate:
        ``m`` independent data sets of the same model (they share its estimation error:
        not for combining rules).
    rng_key : int or JAX PRNG key
        Seed of the record sampler (keyword-only, required).
    categories : mapping attribute -> sequence of labels, or an object with ``.categories``
        Label of every code (index = code) of the attributes it names; those columns become
        pandas categoricals with these categories. Other columns hold integer codes.
    columns : sequence of str, optional
        Attributes to output, in this order (default: all, in domain order).
    network : MarkovNetwork, optional
        For posterior draws that do not carry their model (a mapping of arrays).
    site : {"theta", "phi", "n"}
        Which posterior site makes the record models (see :func:`posterior_models`).
    drop_unmodelled : bool
        Leave out the attributes in no clique of the model. By default they are kept, drawn
        uniformly over their values independently of the rest (the maximum-entropy answer given
        no measurement of them), with an :class:`UnmodelledAttributesWarning` naming them.
    sampling : {"sample", "round"}, optional
        ``"sample"``: records drawn independently by forward sampling, :data:`SAMPLE_CHUNK` at a
        time (memory bounded by a chunk). ``"round"``: the model's expected counts rounded to
        integers along the junction tree (:mod:`numpyro_dpgm.oracles.rounding`): within each
        group of records sharing an attribute's parents, that attribute's counts are the floor
        or ceiling of their expected counts, so the first attribute's one-way counts are within
        1 of ``N·p`` and no sampling noise is added; the same ``rng_key`` gives the same
        records. Rounding makes all records of a data set at once, in host memory (about
        ``16 d + 48`` bytes a record for ``d`` attributes: 0.9 GB for 3 million records of
        Adult's 15), and raises :class:`~numpyro_dpgm.oracles.rounding.RoundingMemoryError`
        where that exceeds the machine's memory. Default: the source's own choice, a
        mechanism's ``Result.extras["sampling"]`` (``"round"`` for MST and AIM), otherwise
        ``"sample"``.

    Returns
    -------
    pandas.DataFrame or list of DataFrame
        A point estimate with ``num_datasets=1``: one DataFrame. Otherwise a list of
        ``num_datasets`` DataFrames, in draw order. Where the source knows the release's number
        of records ``N`` (a posterior of a :class:`~numpyro_dpgm.infer.bayes.NoisyMarginalsModel`),
        each DataFrame carries it as ``df.attrs["total_count"]``, from which
        :func:`~numpyro_dpgm.combining.analyse` takes the size ratio ``n_syn / N``.

    Examples
    --------
    From a point estimate (e.g. an estimator's ``Result``):

    >>> import jax, numpyro
    >>> from numpyro_dpgm import MarkovNetwork, MarkovRandomField
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    >>> point = MarkovRandomField(net, jax.numpy.zeros(net.num_params))
    >>> df = synthesize(point, 100, rng_key=0, categories={"a": ["no", "yes"]})
    >>> df.shape, list(df.columns), df["a"].dtype.name
    ((100, 2), ['a', 'b'], 'category')

    From posterior draws, one data set per draw; here a batch of ten models stands in for
    ``mcmc = run_nuts(noisy_marginals_model(net, measurements, N), key)``, which is passed the
    same way (``synthesize(mcmc, None, num_datasets=10, rng_key=0)``, ``N`` records each):

    >>> draws = MarkovRandomField(net, jax.random.normal(jax.random.key(1), (10, net.num_params)))
    >>> sets = synthesize(draws, 100, num_datasets=5, rng_key=0)
    >>> len(sets), sets[0].shape
    (5, (100, 2))

    Rounding: of 101 records, 50.5 are expected in each value of ``a``, so it gets 50 and 51

    >>> sorted(synthesize(point, 101, rng_key=0, sampling="round")["a"].value_counts())
    [50, 51]
    """
    out = list(_whole_datasets(_chunks(_plan(locals()))))
    return out[0] if _is_point(source) and num_datasets == 1 else out


def _unwrap(source: Any) -> Any:
    """An estimator's ``Result`` as its model; any other source as it is."""
    if hasattr(source, "model") and isinstance(source.model, MarkovRandomField):
        return source.model
    return source


def _is_point(source: Any) -> bool:
    source = _unwrap(source)
    return isinstance(source, MarkovRandomField) and not source.batch_shape


class _Plan(NamedTuple):
    models: list[MarkovRandomField]
    sampling: str
    key: jax.Array
    num_records: int
    network: MarkovNetwork
    categories: dict[str, list]
    columns: list[str]
    total: Any


def _plan(arguments: Mapping[str, Any]) -> _Plan:
    """Every check of :func:`synthesize`'s arguments (by name), and the model of each data
    set."""
    (source, num_records, num_datasets, rng_key, categories, columns, network, site,
     drop_unmodelled, sampling) = (arguments[name] for name in _ARGUMENTS)
    num_datasets = _check_count(num_datasets, "num_datasets")
    key = _key(rng_key)
    sampling = _sampling(sampling, source)
    source = _unwrap(source)
    if _is_point(source):
        mrf, point = source, True
    elif isinstance(source, MarkovRandomField):
        if len(source.batch_shape) != 1:
            raise ValueError(
                f"a batched MarkovRandomField must have batch shape (num_draws,), got "
                f"{source.batch_shape}"
            )
        mrf, point = source, False
    else:
        mrf, point = posterior_models(source, network, site), False
    total = getattr(_model_of(source), "total_count", None)  # N of the release, where known
    if num_records is None:
        num_records = _default_num_records(source)
    num_records = _check_count(num_records, "num_records")
    net = mrf.network
    if sampling == "round":
        check_rounding_memory(num_records, len(net.domain))
    cats = _category_map(categories, net)
    cols = _columns(columns, net)
    free = [a for a in unmodelled_attributes(net) if a in cols]
    if free and drop_unmodelled:
        cols = [a for a in cols if a not in free]
    elif free:
        warn(
            f"attribute(s) {free} are in no clique of the model (no released table measured "
            "them): sampled uniformly over their values, independently of the other attributes "
            "(the maximum-entropy choice given no measurement); pass drop_unmodelled=True to "
            "leave them out", UnmodelledAttributesWarning)
    if point:
        models = [mrf] * num_datasets
    else:
        num_draws = mrf.batch_shape[0]
        if num_datasets > num_draws:
            raise ValueError(
                f"num_datasets={num_datasets} exceeds the {num_draws} posterior draws; draw "
                "more samples or ask for fewer data sets"
            )
        index = np.round(np.linspace(0, num_draws - 1, num_datasets)).astype(int)
        models = [MarkovRandomField(net, mrf.theta[i], method=mrf.method) for i in index]
    return _Plan(models, sampling, key, num_records, net, cats, cols, total)


def _sampling(sampling: Any, source: Any) -> str:
    """``sampling`` checked, or the source's own choice (a mechanism's ``Result``), or
    ``"sample"``."""
    if sampling is None:
        extras = getattr(source, "extras", None)
        sampling = extras.get("sampling", "sample") if isinstance(extras, Mapping) else "sample"
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {sampling!r}")
    return sampling


def iter_synthetic(*args: Any, **kwargs: Any) -> Iterator[pd.DataFrame]:
    """The data sets of :func:`synthesize`, one at a time (same arguments).

    Data set ``j`` is drawn when it is asked for, so a caller that writes each one before asking
    for the next holds one data set in memory, whatever ``num_datasets``. All checks run before
    the first data set is drawn. For memory independent of the number of records too, take the
    records chunk by chunk: :func:`iter_synthetic_chunks`.
    """
    return _whole_datasets(_chunks(_plan(_bind(args, kwargs))))


def _whole_datasets(chunks: Iterator[SyntheticChunk]) -> Iterator[pd.DataFrame]:
    parts: list[pd.DataFrame] = []
    for chunk in chunks:
        parts.append(chunk.frame)
        if chunk.last:
            frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
            frame.attrs = dict(parts[0].attrs)
            parts = []
            yield frame


def iter_synthetic_chunks(*args: Any, **kwargs: Any) -> Iterator[SyntheticChunk]:
    """The records of :func:`synthesize` in chunks of at most :data:`SAMPLE_CHUNK` records.

    Same arguments and the same records as :func:`synthesize`: concatenating the chunks of data
    set ``j`` in order gives its ``j``-th data set. A caller that writes each chunk before asking
    for the next (``dpgm synth``) holds one chunk in memory, whatever the number of records and
    of data sets; with ``sampling="round"``, one data set's codes besides (rounding makes a data
    set's records at once). All checks run before the first chunk is drawn.

    Examples
    --------
    >>> import jax, numpyro
    >>> from numpyro_dpgm import MarkovNetwork, MarkovRandomField
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 3}, [("a", "b")])
    >>> point = MarkovRandomField(net, jax.numpy.zeros(net.num_params))
    >>> [(c.dataset, c.start, len(c.frame), c.last)
    ...  for c in iter_synthetic_chunks(point, 100_000, rng_key=0)]
    [(0, 0, 65536, False), (0, 65536, 34464, True)]
    """
    return _chunks(_plan(_bind(args, kwargs)))


def _chunks(plan: _Plan) -> Iterator[SyntheticChunk]:
    for j, model in enumerate(plan.models):
        key_j = jax.random.fold_in(plan.key, j)
        whole = (round_records(model.network, model.theta, key_j, plan.num_records,
                               model.method) if plan.sampling == "round" else None)
        for c, start in enumerate(range(0, plan.num_records, SAMPLE_CHUNK)):
            size = min(SAMPLE_CHUNK, plan.num_records - start)
            x = (whole[start:start + size] if whole is not None
                 else np.asarray(model.sample(jax.random.fold_in(key_j, c), (size,))))
            frame = _frame(x, plan.network, plan.categories, plan.columns, plan.total)
            if start:
                frame.index = pd.RangeIndex(start, start + size)
            yield SyntheticChunk(j, start, frame, start + size == plan.num_records)


#: The arguments of :func:`synthesize`, in order.
_ARGUMENTS = ("source", "num_records", "num_datasets", "rng_key", "categories", "columns",
              "network", "site", "drop_unmodelled", "sampling")


def _bind(args: tuple, kwargs: dict) -> dict[str, Any]:
    """``args`` and ``kwargs`` read as :func:`synthesize` reads them."""
    try:
        bound = inspect.signature(synthesize).bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{err} (the arguments are those of synthesize)") from None
    bound.apply_defaults()
    return bound.arguments


for _fn, _returns in ((iter_synthetic, Iterator[pd.DataFrame]),
                      (iter_synthetic_chunks, Iterator[SyntheticChunk])):
    _fn.__signature__ = inspect.signature(synthesize).replace(  # type: ignore[attr-defined]
        return_annotation=_returns)
