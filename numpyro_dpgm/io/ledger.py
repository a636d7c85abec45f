"""Ledger files: a privacy ledger (total budget and debits) kept across releases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..privacy.ledger import PrivacyLedger
from ._files import LEDGER_FORMAT, expect_format, load_document, write_document
from ._json import ledger_from_json, ledger_to_json


def save_ledger(path: str | Path, ledger: PrivacyLedger) -> Path:
    """Write a privacy ledger (total budget and debits) to keep a budget across releases."""
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    return write_document(path, LEDGER_FORMAT, {"ledger": ledger_to_json(ledger)})


def load_ledger(path: str | Path) -> PrivacyLedger:
    """Read a ledger written by :func:`save_ledger` (or the ledger of a measurements file).

    Raises
    ------
    FileFormatError
        Not a ledger file, a newer or unknown format version, or a corrupt file.
    """

    def parse(doc: dict[str, Any]) -> PrivacyLedger:
        ledger = ledger_from_json(doc["ledger"])
        expect_format(ledger is not None, "the ledger is null")
        return ledger

    return load_document(path, LEDGER_FORMAT, {"ledger"}, parse)
