"""Model files: a fitted MarkovRandomField (or posterior draws of one), its labels and
provenance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..distributions.mrf import MarkovRandomField
from ..domain import Domain
from ..network import MarkovNetwork
from ._files import MODEL_FORMAT, expect_format, load_document, write_document
from ._json import (
    array_from_json,
    array_to_json,
    categories_from_json,
    domain_from_json,
    domain_to_json,
    labels_to_json,
    total_to_json,
    value_from_json,
    value_to_json,
)


class SavedModel(NamedTuple):
    """What :func:`load_model` returns.

    Attributes
    ----------
    model : MarkovRandomField
    categories : dict attr -> list of labels
    total : float or None
        Records behind the fit (the default size of synthetic data sets).
    provenance : dict
        Estimator, options and other facts of the fit.
    """

    model: Any
    categories: dict[str, list[Any]]
    total: float | None
    provenance: dict[str, Any]


_MODEL_KEYS = {"domain", "cliques", "theta", "triangulation", "categories", "total",
               "provenance"}


def save_model(
    path: str | Path,
    model: Any,
    *,
    categories: Mapping[str, Sequence[Any]] | None = None,
    total: float | None = None,
    provenance: Mapping[str, Any] | None = None,
    domain: Domain | Mapping[str, int] | None = None,
) -> Path:
    """Write a fitted model (format: :mod:`numpyro_dpgm.io`).

    Parameters
    ----------
    path : str or Path
    model : MarkovRandomField or an estimator's Result
        A ``Result`` also contributes its iterations, convergence flag and time to the
        provenance.
    categories : mapping attr -> labels, optional
    total : float, optional
        Records behind the fit (default size of synthetic data).
    provenance : mapping, optional
        ``{"estimator": name, "options": {...}, ...}``; any JSON-able values, tuples, NoiseSpecs,
        privacy costs and arrays (see VALUE in :mod:`numpyro_dpgm.io`).
    domain : Domain, optional
        The whole domain of the data, when the model's cliques cover only part of it (the
        attributes of no released table). The file then keeps every attribute: those in no
        clique have no parameters, are independent of the rest and uniform over their values
        when sampled (the maximum-entropy model given no measurement of them). It must hold
        the model's attributes with the same sizes; ``categories`` may label all of them.
    """
    prov = dict(provenance or {})
    if not isinstance(model, MarkovRandomField) and isinstance(
        getattr(model, "model", None), MarkovRandomField
    ):
        prov.setdefault("iterations", int(model.iterations))
        prov.setdefault("converged", bool(model.converged))
        prov.setdefault("elapsed", float(model.elapsed))
        model = model.model
    if not isinstance(model, MarkovRandomField):
        raise TypeError(f"model must be a MarkovRandomField or a Result, got "
                        f"{type(model).__name__}")
    if domain is not None:
        model = _widen(model, domain if isinstance(domain, Domain) else Domain(domain))
    net = model.network
    body = {"domain": domain_to_json(net.domain),
            "cliques": [list(c) for c in net.cliques],
            "theta": array_to_json(model.theta),
            "triangulation": model.method,
            "categories": labels_to_json(categories, net.domain),
            "total": total_to_json(total),
            "provenance": value_to_json(prov)}
    return write_document(path, MODEL_FORMAT, body)


def _widen(model: Any, domain: Domain) -> Any:
    """``model`` over ``domain`` (a superset of its own): same cliques and parameters."""
    from ..distributions.mrf import MarkovRandomField

    own = model.network.domain
    missing = [a for a in own.attrs if a not in domain]
    if missing:
        raise ValueError(f"domain lacks the model's attribute(s) {missing}")
    differ = [a for a in own.attrs if domain[a] != own[a]]
    if differ:
        raise ValueError(f"domain gives attribute(s) {differ} other sizes than the model")
    if domain == own:
        return model
    network = MarkovNetwork(domain, model.network.cliques)
    return MarkovRandomField(network, model.theta, method=model.method)


def _parse_model(doc: dict[str, Any]) -> SavedModel:
    import jax.numpy as jnp

    domain = domain_from_json(doc["domain"])
    expect_format(isinstance(doc["cliques"], list), "cliques is not a list")
    net = MarkovNetwork(domain, [tuple(c) for c in doc["cliques"]])
    theta = array_from_json(doc["theta"], "theta")
    expect_format(theta.ndim >= 1 and theta.shape[-1] == net.num_params,
                  f"theta has shape {theta.shape}; the network needs (..., {net.num_params})")
    expect_format(isinstance(doc["triangulation"], str), "bad triangulation")
    model = MarkovRandomField(net, jnp.asarray(theta), method=doc["triangulation"])
    total = doc["total"]
    expect_format(total is None or (isinstance(total, int | float) and total > 0), "bad total")
    prov = value_from_json(doc["provenance"])
    expect_format(isinstance(prov, dict), "provenance is not an object")
    return SavedModel(model, categories_from_json(doc["categories"], domain),
                      None if total is None else float(total), prov)


def load_model(path: str | Path) -> SavedModel:
    """Read a file written by :func:`save_model`.

    ``theta`` is returned in float64 when JAX runs in float64 (``numpyro.enable_x64()``), and
    rounded to float32 otherwise (with the library's float32 warning).

    Raises
    ------
    FileFormatError
        Not a model file, a newer or unknown format version, or a corrupt file.
    """
    return load_document(path, MODEL_FORMAT, _MODEL_KEYS, _parse_model)
