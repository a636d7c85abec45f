"""Measurements files: the released noisy tables, their domain, labels and privacy ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..domain import Domain
from ..measurements import Measurement
from ..privacy.ledger import PrivacyLedger
from ._files import MEASUREMENTS_FORMAT, expect_format, load_document, write_document
from ._json import (
    array_from_json,
    array_to_json,
    categories_from_json,
    domain_from_json,
    domain_to_json,
    labels_to_json,
    ledger_from_json,
    ledger_to_json,
    noise_from_json,
    noise_to_json,
    total_to_json,
)


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


_MEAS_KEYS = {"domain", "categories", "total", "measurements", "ledger"}


def save_measurements(
    path: str | Path,
    measurements: Sequence[Measurement],
    domain: Domain | Mapping[str, int],
    *,
    categories: Mapping[str, Sequence[Any]] | None = None,
    total: float | None = None,
    ledger: PrivacyLedger | None = None,
) -> Path:
    """Write released measurements, their domain, labels and the ledger (format:
    :mod:`numpyro_dpgm.io`).

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
        items.append({"clique": list(clique), "noise": noise_to_json(m.noise),
                      "values": array_to_json(m.values),
                      "query": None if m.query is None else array_to_json(m.query)})
    body = {"domain": domain_to_json(domain),
            "categories": labels_to_json(categories, domain),
            "total": total_to_json(total),
            "measurements": items,
            "ledger": ledger_to_json(ledger)}
    return write_document(path, MEASUREMENTS_FORMAT, body)


def _parse_measurements(doc: dict[str, Any]) -> SavedMeasurements:
    domain = domain_from_json(doc["domain"])
    expect_format(isinstance(doc["measurements"], list), "measurements is not a list")
    out = []
    for i, m in enumerate(doc["measurements"]):
        expect_format(isinstance(m, dict) and set(m) == {"clique", "noise", "values", "query"},
                      f"measurement {i} is malformed")
        clique = domain.check_clique(m["clique"])
        values = array_from_json(m["values"], f"measurement {i} values")
        query = None if m["query"] is None else array_from_json(m["query"], f"measurement {i} "
                                                                "query")
        meas = Measurement(clique, values, noise_from_json(m["noise"]), query)
        expect_format(meas.num_cells == domain.size(clique),
                      f"measurement {i} has {meas.num_cells} cells; the domain gives "
                      f"{domain.size(clique)}")
        out.append(meas)
    categories = categories_from_json(doc["categories"], domain)
    total = doc["total"]
    expect_format(total is None or (isinstance(total, int | float) and total > 0), "bad total")
    return SavedMeasurements(out, domain, categories,
                             None if total is None else float(total),
                             ledger_from_json(doc["ledger"]))


def load_measurements(path: str | Path) -> SavedMeasurements:
    """Read a file written by :func:`save_measurements`.

    Raises
    ------
    FileFormatError
        Not a measurements file, a newer or unknown format version, or a corrupt file.
    """
    return load_document(path, MEASUREMENTS_FORMAT, _MEAS_KEYS, _parse_measurements)
