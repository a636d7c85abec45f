"""JSON codecs of :mod:`numpyro_dpgm.io`: arrays, noise, privacy costs, tagged values,
labels, domains, totals and ledgers (the encodings of the format)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..domain import Domain
from ..measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    NoiseSpec,
)
from ..privacy.guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP
from ..privacy.ledger import PrivacyLedger
from ..privacy.sensitivity import Sensitivity
from ._files import FileFormatError, expect_format

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def array_to_json(a: Any) -> dict[str, Any]:
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


def array_from_json(obj: Any, what: str) -> np.ndarray:
    expect_format(isinstance(obj, dict) and set(obj) == {"dtype", "shape", "data"},
                  f"{what} is not an array object")
    expect_format(obj["dtype"] == "float64", f"{what} has unknown dtype {obj['dtype']!r}")
    shape = obj["shape"]
    expect_format(isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape),
                  f"{what} has a bad shape")
    data = obj["data"]
    expect_format(isinstance(data, list) and len(data) == math.prod(shape),
                  f"{what} holds {len(data) if isinstance(data, list) else '?'} numbers for shape "
                  f"{shape}")
    try:
        values = [_NONFINITE[v] if isinstance(v, str) else v for v in data]
    except KeyError:
        raise FileFormatError(f"{what} holds a non-number") from None
    expect_format(all(isinstance(v, int | float) and not isinstance(v, bool) for v in values),
                  f"{what} holds a non-number")
    return np.asarray(values, dtype=np.float64).reshape(shape)


def noise_to_json(noise: NoiseSpec) -> dict[str, Any]:
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


def noise_from_json(obj: Any) -> NoiseSpec:
    expect_format(isinstance(obj, dict) and obj.get("kind") in _NOISE_KINDS, "unknown noise")
    cls, field = _NOISE_KINDS[obj["kind"]]
    expect_format(set(obj) == {"kind", field}, f"noise {obj['kind']} needs exactly {field!r}")
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
    expect_format(isinstance(obj, dict) and obj.get("kind") in kinds, "unknown privacy cost")
    cls, fields = kinds[obj["kind"]]
    expect_format(set(obj) == {"kind", *fields}, f"privacy cost {obj['kind']} needs {fields}")
    return cls(*(obj[f] for f in fields))


def value_to_json(value: Any) -> Any:
    """Tagged JSON of ledger details and fit options (VALUE in :mod:`numpyro_dpgm.io`)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        v = float(value)
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(value, Laplace | Gaussian | DiscreteLaplace | DiscreteGaussian):
        return {"$noise": noise_to_json(value)}
    if isinstance(value, PureDP | ZCDP | ApproxDP):
        return {"$cost": _cost_to_json(value)}
    if isinstance(value, Sensitivity):
        return {"$sensitivity": [float(value.l1), float(value.l2)]}
    if isinstance(value, np.ndarray) or hasattr(value, "__jax_array__") or (
        type(value).__module__.startswith("jax") and hasattr(value, "shape")
    ):
        return {"$array": array_to_json(value)}
    if isinstance(value, tuple):
        return {"$tuple": [value_to_json(v) for v in value]}
    if isinstance(value, list):
        return [value_to_json(v) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot save a mapping with non-string keys: {list(value)[:3]}")
        body = {k: value_to_json(v) for k, v in value.items()}
        tagged = any(k.startswith("$") for k in value) and len(value) >= 1
        return {"$dict": body} if tagged else body
    raise TypeError(f"cannot save a value of type {type(value).__name__}: {value!r}")


def value_from_json(obj: Any) -> Any:
    if isinstance(obj, list):
        return [value_from_json(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, body), = obj.items()
        if tag == "$tuple":
            return tuple(value_from_json(v) for v in body)
        if tag == "$noise":
            return noise_from_json(body)
        if tag == "$cost":
            return _cost_from_json(body)
        if tag == "$sensitivity":
            return Sensitivity(*body)
        if tag == "$array":
            return array_from_json(body, "an array")
        if tag == "$float":
            return float(body)
        if tag == "$dict":
            return {k: value_from_json(v) for k, v in body.items()}
        expect_format(not tag.startswith("$"), f"unknown tag {tag!r}")
    return {k: value_from_json(v) for k, v in obj.items()}


def labels_to_json(categories: Mapping[str, Sequence[Any]] | None,
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


def categories_from_json(obj: Any, domain: Domain) -> dict[str, list[Any]]:
    expect_format(isinstance(obj, dict), "categories is not an object")
    for a, labels in obj.items():
        expect_format(a in domain and isinstance(labels, list) and len(labels) == domain[a],
                      f"categories of {a!r} do not match the domain")
    return {a: list(v) for a, v in obj.items()}


def domain_to_json(domain: Domain) -> dict[str, Any]:
    return {"attrs": list(domain.attrs), "sizes": list(domain.shape)}


def domain_from_json(obj: Any) -> Domain:
    expect_format(isinstance(obj, dict) and set(obj) == {"attrs", "sizes"}, "bad domain")
    expect_format(isinstance(obj["attrs"], list) and isinstance(obj["sizes"], list)
                  and len(obj["attrs"]) == len(obj["sizes"]), "bad domain")
    return Domain(dict(zip(obj["attrs"], obj["sizes"], strict=True)))


def total_to_json(total: Any) -> float | None:
    if total is None:
        return None
    t = float(total)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"total must be a positive number of records, got {total!r}")
    return t


def ledger_to_json(ledger: PrivacyLedger | None) -> dict[str, Any] | None:
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
                "details": value_to_json(dict(e.details)),
            }
            for e in ledger.history
        ],
    }


def ledger_from_json(obj: Any) -> PrivacyLedger | None:
    if obj is None:
        return None
    keys = {"total", "currency", "conversion", "entries"}
    expect_format(isinstance(obj, dict) and set(obj) == keys, "bad ledger")
    ledger = PrivacyLedger(_cost_from_json(obj["total"]), currency=obj["currency"],
                           conversion=obj["conversion"])
    expect_format(isinstance(obj["entries"], list), "bad ledger entries")
    for i, e in enumerate(obj["entries"]):
        expect_format(isinstance(e, dict) and set(e) == {"label", "cost", "charge", "details"},
                      f"bad ledger entry {i}")
        entry = ledger.debit(_cost_from_json(e["cost"]), e["label"], value_from_json(e["details"]))
        charge = tuple(e["charge"]) if isinstance(e["charge"], list) else e["charge"]
        expect_format(entry.charge == charge, f"ledger entry {i} records charge "
                      f"{e['charge']} but its cost gives {entry.charge}")
    return ledger
