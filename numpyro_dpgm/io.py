"""Files of released measurements and of fitted models: a documented, versioned JSON format.

Why one JSON document per file
------------------------------
A release and a fitted model are small next to the data they summarise (Adult's 27 released
tables and its model are tens of thousands of numbers), they are archived and passed between
people, and they must be auditable: the privacy ledger inside a measurements file is read by
humans. One JSON file is self-contained, readable with any tool, diffable and safe to load
(no pickle, no code). Python writes every float64 as its shortest round-trip decimal
(``repr``), so arrays come back bit for bit; a JSON+NPZ pair would be more compact but splits
one artefact into two files that can drift apart. A SHA-256 checksum of the content detects
truncated or altered files.

Format (version 1)
------------------
All three kinds of file are a JSON object with the header

``format``
    ``"numpyro_dpgm.measurements"``, ``"numpyro_dpgm.model"`` or ``"numpyro_dpgm.ledger"``.
``version``
    ``1``. A reader refuses a newer version (upgrade the library) and an unknown one.
``library_version``
    The ``numpyro_dpgm`` version that wrote the file (information only).
``checksum``
    ``"sha256:<hex>"`` of the compact JSON serialisation (``separators=(",", ":")``,
    ``ensure_ascii=False``) of the object without this key, in file order.

A ledger file (a privacy budget kept across releases) has one more key, ``ledger`` (below).
Measurements and model files have the body

``domain``
    ``{"attrs": [names in order], "sizes": [number of values]}``.
``categories``
    ``{attr: [label of code 0, label of code 1, ...]}`` for the attributes that have labels
    (strings, integers, floats or booleans).
``total``
    The number of records ``N`` when it is public (``null`` otherwise; it is then estimated
    from the measurements).

A measurements file adds

``measurements``
    A list, in release order, of ``{"clique": [attrs], "noise": NOISE, "values": ARRAY,
    "query": ARRAY or null}``. ``values`` are ``y = Q·vec(n_C) + noise`` (``vec`` ravels the
    clique's table in C order); ``query`` is ``Q`` (``null``: the identity).
``ledger``
    ``null``, or ``{"total": COST, "currency": "pure" | "zcdp" | "approx", "conversion":
    "bs16" | "cks20", "entries": [{"label": str, "cost": COST, "charge": number or
    [ε, δ], "details": VALUE}]}``: the state of the
    :class:`~numpyro_dpgm.privacy.ledger.PrivacyLedger` after the release (its total budget
    and every debit so far). Loading replays the debits into a fresh ledger and checks every
    charge.

A model file adds

``cliques``
    The network's cliques, ``[[attrs], ...]`` (with ``domain``, the
    :class:`~numpyro_dpgm.network.MarkovNetwork`).
``theta``
    ARRAY of log-potentials, shape ``batch + (num_params,)`` in the network's layout.
``triangulation``
    The ``method`` of the :class:`~numpyro_dpgm.distributions.mrf.MarkovRandomField`.
``provenance``
    ``{"estimator": name, "options": VALUE, ...}``: how the model was fitted (estimator, its
    options, iterations, convergence, time, the measurements file it came from).

Encodings: ARRAY is ``{"dtype": "float64", "shape": [...], "data": [flat, C order]}`` with
non-finite entries written as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. NOISE is
``{"kind": "laplace" | "discrete_laplace", "scale": b}`` or ``{"kind": "gaussian" |
"discrete_gaussian", "sigma": σ}``. COST is ``{"kind": "pure", "epsilon": ε}``, ``{"kind":
"zcdp", "rho": ρ}`` or ``{"kind": "approx", "epsilon": ε, "delta": δ}``. VALUE is JSON where
objects with a single key starting with ``$`` are tagged: ``{"$tuple": [...]}``,
``{"$noise": NOISE}``, ``{"$cost": COST}``, ``{"$sensitivity": [l1, l2]}``,
``{"$array": ARRAY}``, ``{"$float": "inf"}`` (a non-finite number), ``{"$dict": {...}}`` (a
mapping with a key that starts with ``$``).

Saving validates everything first and writes the file atomically (a temporary file renamed
into place), so a failed save leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._version import __version__
from .distributions.mrf import MarkovRandomField
from .domain import Domain
from .measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
    NoiseSpec,
)
from .network import MarkovNetwork
from .privacy.guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP
from .privacy.ledger import PrivacyLedger
from .privacy.sensitivity import Sensitivity

__all__ = [
    "FORMAT_VERSION",
    "FileFormatError",
    "SavedMeasurements",
    "SavedModel",
    "save_measurements",
    "load_measurements",
    "save_model",
    "load_model",
    "save_ledger",
    "load_ledger",
]

#: The version this library writes, and the newest it reads.
FORMAT_VERSION = 1
MEASUREMENTS_FORMAT = "numpyro_dpgm.measurements"
MODEL_FORMAT = "numpyro_dpgm.model"
LEDGER_FORMAT = "numpyro_dpgm.ledger"


class FileFormatError(ValueError):
    """A file is not a readable measurements / model file (wrong kind, newer version, corrupt)."""


class SavedMeasurements(NamedTuple):
    """What :func:`load_measurements` returns.

    Attributes
    ----------
    measurements : list of Measurement
    domain : Domain
    categories : dict attr -> list of labels
    total : float or None
        ``N`` when public.
    ledger : PrivacyLedger or None
        The ledger after the release (total budget and debits so far).
    """

    measurements: list[Measurement]
    domain: Domain
    categories: dict[str, list[Any]]
    total: float | None
    ledger: PrivacyLedger | None


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


# ------------------------------------------------------------------------------------------------
# value encodings
# ------------------------------------------------------------------------------------------------
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _array_to_json(a: Any) -> dict[str, Any]:
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"cannot save an array of dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    flat = arr.ravel()
    if np.all(np.isfinite(flat)):
        data: list[Any] = flat.tolist()
    else:
        data = [v if math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else
                                                                  "-Infinity"))
                for v in flat.tolist()]
    return {"dtype": "float64", "shape": list(arr.shape), "data": data}


def _array_from_json(obj: Any, what: str) -> np.ndarray:
    _expect(isinstance(obj, dict) and set(obj) == {"dtype", "shape", "data"},
            f"{what} is not an array object")
    _expect(obj["dtype"] == "float64", f"{what} has unknown dtype {obj['dtype']!r}")
    shape = obj["shape"]
    _expect(isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape),
            f"{what} has a bad shape")
    data = obj["data"]
    _expect(isinstance(data, list) and len(data) == math.prod(shape),
            f"{what} holds {len(data) if isinstance(data, list) else '?'} numbers for shape "
            f"{shape}")
    try:
        values = [_NONFINITE[v] if isinstance(v, str) else v for v in data]
    except KeyError:
        raise FileFormatError(f"{what} holds a non-number") from None
    _expect(all(isinstance(v, int | float) and not isinstance(v, bool) for v in values),
            f"{what} holds a non-number")
    return np.asarray(values, dtype=np.float64).reshape(shape)


def _noise_to_json(noise: NoiseSpec) -> dict[str, Any]:
    if isinstance(noise, Laplace):
        return {"kind": "laplace", "scale": noise.scale}
    if isinstance(noise, DiscreteLaplace):
        return {"kind": "discrete_laplace", "scale": noise.scale}
    if isinstance(noise, Gaussian):
        return {"kind": "gaussian", "sigma": noise.sigma}
    if isinstance(noise, DiscreteGaussian):
        return {"kind": "discrete_gaussian", "sigma": noise.sigma}
    raise TypeError(f"noise must be a NoiseSpec, got {type(noise).__name__}")


_NOISE_KINDS = {"laplace": (Laplace, "scale"), "discrete_laplace": (DiscreteLaplace, "scale"),
                "gaussian": (Gaussian, "sigma"), "discrete_gaussian": (DiscreteGaussian, "sigma")}


def _noise_from_json(obj: Any) -> NoiseSpec:
    _expect(isinstance(obj, dict) and obj.get("kind") in _NOISE_KINDS, "unknown noise")
    cls, field = _NOISE_KINDS[obj["kind"]]
    _expect(set(obj) == {"kind", field}, f"noise {obj['kind']} needs exactly {field!r}")
    return cls(obj[field])


def _cost_to_json(cost: PrivacyCost) -> dict[str, Any]:
    if isinstance(cost, PureDP):
        return {"kind": "pure", "epsilon": cost.epsilon}
    if isinstance(cost, ZCDP):
        return {"kind": "zcdp", "rho": cost.rho}
    if isinstance(cost, ApproxDP):
        return {"kind": "approx", "epsilon": cost.epsilon, "delta": cost.delta}
    raise TypeError(f"not a privacy cost: {cost!r}")


def _cost_from_json(obj: Any) -> PrivacyCost:
    kinds = {"pure": (PureDP, ("epsilon",)), "zcdp": (ZCDP, ("rho",)),
             "approx": (ApproxDP, ("epsilon", "delta"))}
    _expect(isinstance(obj, dict) and obj.get("kind") in kinds, "unknown privacy cost")
    cls, fields = kinds[obj["kind"]]
    _expect(set(obj) == {"kind", *fields}, f"privacy cost {obj['kind']} needs {fields}")
    return cls(*(obj[f] for f in fields))


def _value_to_json(value: Any) -> Any:
    """Tagged JSON of ledger details and fit options (module docstring, VALUE)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        v = float(value)
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(value, Laplace | Gaussian | DiscreteLaplace | DiscreteGaussian):
        return {"$noise": _noise_to_json(value)}
    if isinstance(value, PureDP | ZCDP | ApproxDP):
        return {"$cost": _cost_to_json(value)}
    if isinstance(value, Sensitivity):
        return {"$sensitivity": [float(value.l1), float(value.l2)]}
    if isinstance(value, np.ndarray) or hasattr(value, "__jax_array__") or (
        type(value).__module__.startswith("jax") and hasattr(value, "shape")
    ):
        return {"$array": _array_to_json(value)}
    if isinstance(value, tuple):
        return {"$tuple": [_value_to_json(v) for v in value]}
    if isinstance(value, list):
        return [_value_to_json(v) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot save a mapping with non-string keys: {list(value)[:3]}")
        body = {k: _value_to_json(v) for k, v in value.items()}
        tagged = any(k.startswith("$") for k in value) and len(value) >= 1
        return {"$dict": body} if tagged else body
    raise TypeError(f"cannot save a value of type {type(value).__name__}: {value!r}")


def _value_from_json(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_value_from_json(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, body), = obj.items()
        if tag == "$tuple":
            return tuple(_value_from_json(v) for v in body)
        if tag == "$noise":
            return _noise_from_json(body)
        if tag == "$cost":
            return _cost_from_json(body)
        if tag == "$sensitivity":
            return Sensitivity(*body)
        if tag == "$array":
            return _array_from_json(body, "an array")
        if tag == "$float":
            return float(body)
        if tag == "$dict":
            return {k: _value_from_json(v) for k, v in body.items()}
        _expect(not tag.startswith("$"), f"unknown tag {tag!r}")
    return {k: _value_from_json(v) for k, v in obj.items()}


def _labels_to_json(categories: Mapping[str, Sequence[Any]] | None,
                    domain: Domain) -> dict[str, list[Any]]:
    out = {}
    for a, labels in (categories or {}).items():
        if a not in domain:
            raise ValueError(f"categories name {a!r}, which is not in the domain {list(domain)}")
        labels = [v.item() if isinstance(v, np.generic) else v for v in labels]
        bad = [v for v in labels if not isinstance(v, str | int | float | bool)
               or (isinstance(v, float) and not math.isfinite(v))]
        if bad:
            raise TypeError(f"categories[{a!r}]: labels must be strings, numbers or booleans, "
                            f"got {bad[0]!r}")
        if len(labels) != domain[a]:
            raise ValueError(f"categories[{a!r}] has {len(labels)} labels but the domain gives "
                             f"{domain[a]} values")
        out[a] = labels
    return out


def _domain_to_json(domain: Domain) -> dict[str, Any]:
    return {"attrs": list(domain.attrs), "sizes": list(domain.shape)}


def _domain_from_json(obj: Any) -> Domain:
    _expect(isinstance(obj, dict) and set(obj) == {"attrs", "sizes"}, "bad domain")
    _expect(isinstance(obj["attrs"], list) and isinstance(obj["sizes"], list)
            and len(obj["attrs"]) == len(obj["sizes"]), "bad domain")
    return Domain(dict(zip(obj["attrs"], obj["sizes"], strict=True)))


def _total_to_json(total: Any) -> float | None:
    if total is None:
        return None
    t = float(total)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"total must be a positive number of records, got {total!r}")
    return t


# ------------------------------------------------------------------------------------------------
# the ledger
# ------------------------------------------------------------------------------------------------
def _ledger_to_json(ledger: PrivacyLedger | None) -> dict[str, Any] | None:
    if ledger is None:
        return None
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    return {
        "total": _cost_to_json(ledger.total),
        "currency": ledger.currency,
        "conversion": ledger.conversion,
        "entries": [
            {
                "label": e.label,
                "cost": _cost_to_json(e.cost),
                "charge": list(e.charge) if isinstance(e.charge, tuple) else e.charge,
                "details": _value_to_json(dict(e.details)),
            }
            for e in ledger.history
        ],
    }


def _ledger_from_json(obj: Any) -> PrivacyLedger | None:
    if obj is None:
        return None
    _expect(isinstance(obj, dict) and set(obj) == {"total", "currency", "conversion", "entries"},
            "bad ledger")
    ledger = PrivacyLedger(_cost_from_json(obj["total"]), currency=obj["currency"],
                           conversion=obj["conversion"])
    _expect(isinstance(obj["entries"], list), "bad ledger entries")
    for i, e in enumerate(obj["entries"]):
        _expect(isinstance(e, dict) and set(e) == {"label", "cost", "charge", "details"},
                f"bad ledger entry {i}")
        entry = ledger.debit(_cost_from_json(e["cost"]), e["label"], _value_from_json(e["details"]))
        charge = tuple(e["charge"]) if isinstance(e["charge"], list) else e["charge"]
        _expect(entry.charge == charge,
                f"ledger entry {i} records charge {e['charge']} but its cost gives {entry.charge}")
    return ledger


# ------------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------------
def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise FileFormatError(message)


def _library_version() -> str:
    return __version__


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _layout(doc: Mapping[str, Any]) -> str:
    """JSON text with one top-level key per line and one list item (a measurement, a clique,
    a ledger entry) per line; arrays stay on their item's line."""

    def dumps(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, allow_nan=False)

    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v:
            inner = ",\n".join(f"  {dumps(item)}" for item in v)
            lines.append(f" {dumps(k)}: [\n{inner}\n ]")
        else:
            lines.append(f" {dumps(k)}: {dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def _write(path: str | Path, kind: str, body: dict[str, Any]) -> Path:
    """Serialise fully, then write atomically: nothing is left behind on failure."""
    path = Path(path)
    doc = {"format": kind, "version": FORMAT_VERSION, "library_version": _library_version()}
    doc.update(body)
    checksum = "sha256:" + hashlib.sha256(_canonical(doc).encode()).hexdigest()
    text = _layout({**doc, "checksum": checksum})
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: str | Path, kind: str) -> dict[str, Any]:
    path = Path(path)
    what = {MEASUREMENTS_FORMAT: "measurements", MODEL_FORMAT: "model"}.get(kind, "ledger")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {path} does not exist") from None
    except UnicodeDecodeError:
        raise FileFormatError(f"{path} is not a {what} file (not UTF-8 text)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise FileFormatError(f"{path} is corrupt or not a {what} file (invalid JSON at line "
                              f"{err.lineno}: {err.msg})") from None
    if not isinstance(doc, dict) or "format" not in doc:
        raise FileFormatError(f"{path} is not a {what} file (no 'format' header)")
    if doc["format"] != kind:
        raise FileFormatError(f"{path} is a {doc['format']!r} file, not a {what} file ({kind!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FileFormatError(f"{path} has an invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise FileFormatError(
            f"{path} has format version {version}, newer than this numpyro_dpgm "
            f"({_library_version()}) reads (up to {FORMAT_VERSION}); upgrade numpyro_dpgm"
        )
    checksum = doc.pop("checksum", None)
    actual = "sha256:" + hashlib.sha256(_canonical(doc).encode()).hexdigest()
    if checksum != actual:
        raise FileFormatError(f"{path} is corrupt: its checksum does not match its content")
    return doc


def _body(path: Path, doc: dict[str, Any], keys: set[str]) -> None:
    header = {"format", "version", "library_version"}
    missing = sorted(keys - set(doc))
    extra = sorted(set(doc) - keys - header)
    if missing or extra:
        raise FileFormatError(f"{path} is corrupt: missing {missing}, unexpected {extra}")


def _load(path: str | Path, kind: str, keys: set[str], parse: Any) -> Any:
    doc = _read(path, kind)
    _body(Path(path), doc, keys)
    try:
        return parse(doc)
    except FileFormatError as err:
        raise FileFormatError(f"{path} is corrupt: {err}") from None
    except (TypeError, ValueError, KeyError) as err:
        raise FileFormatError(f"{path} is corrupt: {err}") from None


_MEAS_KEYS = {"domain", "categories", "total", "measurements", "ledger"}
_MODEL_KEYS = {"domain", "cliques", "theta", "triangulation", "categories", "total",
               "provenance"}


def save_measurements(
    path: str | Path,
    measurements: Sequence[Measurement],
    domain: Domain | Mapping[str, int],
    *,
    categories: Mapping[str, Sequence[Any]] | None = None,
    total: float | None = None,
    ledger: PrivacyLedger | None = None,
) -> Path:
    """Write released measurements, their domain, labels and the ledger (module docstring).

    Parameters
    ----------
    path : str or Path
    measurements : sequence of Measurement
    domain : Domain
        Every measured clique must be over its attributes, with matching table sizes.
    categories : mapping attr -> labels, optional
    total : float, optional
        ``N`` when public (e.g. under replace-one neighbours).
    ledger : PrivacyLedger, optional
        The ledger the release was debited from.

    Returns
    -------
    Path
        ``path``.
    """
    domain = domain if isinstance(domain, Domain) else Domain(domain)
    items = []
    for m in measurements:
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements must be Measurements, got {type(m).__name__}")
        clique = domain.check_clique(m.clique)
        if m.num_cells != domain.size(clique):
            raise ValueError(f"measurement of {clique} has {m.num_cells} cells; the domain "
                             f"gives {domain.size(clique)}")
        items.append({"clique": list(clique), "noise": _noise_to_json(m.noise),
                      "values": _array_to_json(m.values),
                      "query": None if m.query is None else _array_to_json(m.query)})
    body = {"domain": _domain_to_json(domain),
            "categories": _labels_to_json(categories, domain),
            "total": _total_to_json(total),
            "measurements": items,
            "ledger": _ledger_to_json(ledger)}
    return _write(path, MEASUREMENTS_FORMAT, body)


def _parse_measurements(doc: dict[str, Any]) -> SavedMeasurements:
    domain = _domain_from_json(doc["domain"])
    _expect(isinstance(doc["measurements"], list), "measurements is not a list")
    out = []
    for i, m in enumerate(doc["measurements"]):
        _expect(isinstance(m, dict) and set(m) == {"clique", "noise", "values", "query"},
                f"measurement {i} is malformed")
        clique = domain.check_clique(m["clique"])
        values = _array_from_json(m["values"], f"measurement {i} values")
        query = None if m["query"] is None else _array_from_json(m["query"], f"measurement {i} "
                                                                 "query")
        meas = Measurement(clique, values, _noise_from_json(m["noise"]), query)
        _expect(meas.num_cells == domain.size(clique),
                f"measurement {i} has {meas.num_cells} cells; the domain gives "
                f"{domain.size(clique)}")
        out.append(meas)
    categories = _categories_from_json(doc["categories"], domain)
    total = doc["total"]
    _expect(total is None or (isinstance(total, int | float) and total > 0), "bad total")
    return SavedMeasurements(out, domain, categories,
                             None if total is None else float(total),
                             _ledger_from_json(doc["ledger"]))


def _categories_from_json(obj: Any, domain: Domain) -> dict[str, list[Any]]:
    _expect(isinstance(obj, dict), "categories is not an object")
    for a, labels in obj.items():
        _expect(a in domain and isinstance(labels, list) and len(labels) == domain[a],
                f"categories of {a!r} do not match the domain")
    return {a: list(v) for a, v in obj.items()}


def load_measurements(path: str | Path) -> SavedMeasurements:
    """Read a file written by :func:`save_measurements`.

    Raises
    ------
    FileFormatError
        Not a measurements file, a newer or unknown format version, or a corrupt file.
    """
    return _load(path, MEASUREMENTS_FORMAT, _MEAS_KEYS, _parse_measurements)


def save_model(
    path: str | Path,
    model: Any,
    *,
    categories: Mapping[str, Sequence[Any]] | None = None,
    total: float | None = None,
    provenance: Mapping[str, Any] | None = None,
    domain: Domain | Mapping[str, int] | None = None,
) -> Path:
    """Write a fitted model (module docstring).

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
        privacy costs and arrays (see VALUE in the module docstring).
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
    body = {"domain": _domain_to_json(net.domain),
            "cliques": [list(c) for c in net.cliques],
            "theta": _array_to_json(model.theta),
            "triangulation": model.method,
            "categories": _labels_to_json(categories, net.domain),
            "total": _total_to_json(total),
            "provenance": _value_to_json(prov)}
    return _write(path, MODEL_FORMAT, body)


def _widen(model: Any, domain: Domain) -> Any:
    """``model`` over ``domain`` (a superset of its own): same cliques and parameters."""
    from .distributions.mrf import MarkovRandomField

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

    domain = _domain_from_json(doc["domain"])
    _expect(isinstance(doc["cliques"], list), "cliques is not a list")
    net = MarkovNetwork(domain, [tuple(c) for c in doc["cliques"]])
    theta = _array_from_json(doc["theta"], "theta")
    _expect(theta.ndim >= 1 and theta.shape[-1] == net.num_params,
            f"theta has shape {theta.shape}; the network needs (..., {net.num_params})")
    _expect(isinstance(doc["triangulation"], str), "bad triangulation")
    model = MarkovRandomField(net, jnp.asarray(theta), method=doc["triangulation"])
    total = doc["total"]
    _expect(total is None or (isinstance(total, int | float) and total > 0), "bad total")
    prov = _value_from_json(doc["provenance"])
    _expect(isinstance(prov, dict), "provenance is not an object")
    return SavedModel(model, _categories_from_json(doc["categories"], domain),
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
    return _load(path, MODEL_FORMAT, _MODEL_KEYS, _parse_model)


def save_ledger(path: str | Path, ledger: PrivacyLedger) -> Path:
    """Write a privacy ledger (total budget and debits) to keep a budget across releases."""
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    return _write(path, LEDGER_FORMAT, {"ledger": _ledger_to_json(ledger)})


def load_ledger(path: str | Path) -> PrivacyLedger:
    """Read a ledger written by :func:`save_ledger` (or the ledger of a measurements file).

    Raises
    ------
    FileFormatError
        Not a ledger file, a newer or unknown format version, or a corrupt file.
    """

    def parse(doc: dict[str, Any]) -> PrivacyLedger:
        ledger = _ledger_from_json(doc["ledger"])
        _expect(ledger is not None, "the ledger is null")
        return ledger

    return _load(path, LEDGER_FORMAT, {"ledger"}, parse)
