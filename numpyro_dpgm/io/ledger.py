"""Ledger files: a privacy ledger (total budget and debits) kept across releases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..privacy.ledger import PrivacyLedger
from ._files import LEDGER_FORMAT, _expect, _load, _write
from ._json import _ledger_from_json, _ledger_to_json


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
