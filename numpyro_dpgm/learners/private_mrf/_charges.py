"""Ledger charges of the MRF learners: a whole run is refused up front, else debited per entry."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ...privacy.guarantees import ZCDP
from ...privacy.ledger import PrivacyLedger


class Charge(NamedTuple):
    rho: float
    label: str
    details: dict


def debit_all(ledger: PrivacyLedger | None, charges: Sequence[Charge]) -> None:
    """Refuse the whole run up front if the ledger cannot pay all charges; then debit them."""
    if ledger is None or not charges:
        return
    ledger.check(ZCDP(math.fsum(c.rho for c in charges)), charges[0].label.split(":")[0])
    for c in charges:
        ledger.debit(ZCDP(c.rho), c.label, c.details)
