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

from ._files import LEDGER_FORMAT as LEDGER_FORMAT
from ._files import MEASUREMENTS_FORMAT as MEASUREMENTS_FORMAT
from ._files import MODEL_FORMAT as MODEL_FORMAT

# isort: off
# in the order of the API reference (members_order: source): measurements, models, ledgers;
# save, then load
from ._files import FORMAT_VERSION, FileFormatError
from .measurements import SavedMeasurements
from .models import SavedModel
from .measurements import save_measurements, load_measurements
from .models import save_model, load_model
from .ledger import save_ledger, load_ledger
# isort: on

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
