"""The privacy ledger: a total budget that every mechanism debits before it draws noise.

A :class:`PrivacyLedger` holds a total budget, is debited by every mechanism *before* it draws
noise, records the history of charges and raises :class:`BudgetExceededError` instead of
overspending.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .conversions import Conversion, approx_to_zcdp, check_conversion
from .guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP, as_cost

__all__ = ["BudgetExceededError", "LedgerEntry", "PrivacyBudget", "PrivacyLedger"]

#: Relative slack for floating-point rounding when a ledger compares spending with its total
#: (three debits of ε/3 must fit into ε even though they may sum to ε + 1 ulp).
_ROUNDING_SLACK = 1e-10


class BudgetExceededError(RuntimeError):
    """A charge would overspend a :class:`PrivacyLedger`; nothing was charged or released.

    Attributes
    ----------
    label : str
        What the refused charge was for.
    requested, remaining
        The charge and the budget left, in the ledger's currency (a float for ``"pure"`` (ε) and
        ``"zcdp"`` (ρ) ledgers, an ``(ε, δ)`` pair for ``"approx"`` ledgers).
    """

    def __init__(self, label: str, requested: Any, remaining: Any, currency: str):
        self.label, self.requested, self.remaining, self.currency = (
            label,
            requested,
            remaining,
            currency,
        )
        unit = {"pure": "ε", "zcdp": "ρ", "approx": "(ε, δ)"}[currency]
        super().__init__(
            f"privacy budget exceeded: {label!r} costs {unit} = {_fmt(requested)} but only "
            f"{unit} = {_fmt(remaining)} is left. Nothing was charged and no noise was drawn. "
            "Spend less on this release (a smaller ε or ρ, fewer cliques) or start from a "
            "larger total budget."
        )


def _fmt(amount: Any) -> str:
    if isinstance(amount, tuple):
        return "(" + ", ".join(f"{a:.6g}" for a in amount) + ")"
    return f"{amount:.6g}"


@dataclass(frozen=True)
class LedgerEntry:
    """One debit of a :class:`PrivacyLedger`.

    Attributes
    ----------
    label : str
        What was released.
    cost : PrivacyCost
        The guarantee of the mechanism that was charged.
    charge : float or (float, float)
        ``cost`` in the ledger's currency (ε, ρ or (ε, δ)).
    details : Mapping
        Mechanism, noise scale, sensitivity, neighbouring relation, sampler, ... (read-only).
    """

    label: str
    cost: PrivacyCost
    charge: float | tuple[float, float]
    details: Mapping[str, Any] = field(default_factory=dict)


Currency = Literal["pure", "zcdp", "approx"]


class PrivacyLedger:
    """A total privacy budget that mechanisms debit, with the history of charges.

    Parameters
    ----------
    total : PureDP, ZCDP, ApproxDP or float
        The whole budget (a float means ``PureDP(epsilon)``).
    currency : {"pure", "zcdp", "approx"}, optional
        How charges compose. ``PureDP`` totals compose in ``"pure"`` ε (ε's add), ``ZCDP`` totals
        in ``"zcdp"`` ρ (ρ's add). ``ApproxDP`` totals default to ``"approx"`` (basic
        composition: ε's and δ's add) and may choose ``"zcdp"``: the (ε, δ) total is turned into
        the ρ of :func:`approx_to_zcdp` ``(ε, δ, conversion)`` and all charges compose in ρ,
        which is much cheaper for many releases and still yields (ε, δ)-DP overall.
    conversion : {"bs16", "cks20"}
        The zCDP → (ε, δ) conversion of a ``"zcdp"`` ledger with an ``ApproxDP`` total
        (see :func:`zcdp_to_approx`).

    Notes
    -----
    What each currency accepts (a mechanism may offer several equivalent guarantees; the first
    one the currency accepts is charged):

    ============  ==========  ===================  ====================
    currency      PureDP(ε)   ZCDP(ρ)              ApproxDP(ε, δ)
    ============  ==========  ===================  ====================
    ``"pure"``    ε           refused              refused
    ``"zcdp"``    ε²/2        ρ                    refused
    ``"approx"``  (ε, 0)      refused (needs a δ)  (ε, δ)
    ============  ==========  ===================  ====================

    A charge is accepted when the new total spending stays within the budget up to a relative
    floating-point slack of 1e-10 (so that, e.g., three charges of ε/3 fit into ε).

    Examples
    --------
    >>> ledger = PrivacyLedger(ZCDP(0.5))
    >>> _ = ledger.debit(PureDP(0.6), "one-way tables")     # charged ρ = 0.18
    >>> round(ledger.remaining, 6)
    0.32
    """

    def __init__(
        self,
        total: PrivacyCost | float,
        *,
        currency: Currency | None = None,
        conversion: Conversion = "bs16",
    ):
        total = as_cost(total)
        self._conversion = check_conversion(conversion)
        default = {PureDP: "pure", ZCDP: "zcdp", ApproxDP: "approx"}[type(total)]
        currency = default if currency is None else currency
        allowed = {PureDP: ("pure",), ZCDP: ("zcdp",), ApproxDP: ("approx", "zcdp")}[type(total)]
        if currency not in allowed:
            raise ValueError(
                f"a {type(total).__name__} total cannot be kept in currency {currency!r}; "
                f"allowed: {list(allowed)} (ρ-zCDP does not imply pure DP, and a pure budget "
                "spent in ρ would not give ε-DP)"
            )
        self._total = total
        self._currency: Currency = currency
        self._entries: list[LedgerEntry] = []
        if currency == "pure":
            self._budget: float | tuple[float, float] = total.epsilon
        elif currency == "zcdp":
            self._budget = (
                total.rho
                if isinstance(total, ZCDP)
                else approx_to_zcdp(total.epsilon, total.delta, conversion)
            )
        else:
            self._budget = (total.epsilon, total.delta)

    # -- inspection -----------------------------------------------------------------------------
    @property
    def total(self) -> PrivacyCost:
        """The total budget as given."""
        return self._total

    @property
    def currency(self) -> Currency:
        return self._currency

    @property
    def conversion(self) -> Conversion:
        return self._conversion  # type: ignore[return-value]

    @property
    def budget(self) -> float | tuple[float, float]:
        """The total in the ledger's currency (ε, ρ, or (ε, δ))."""
        return self._budget

    @property
    def history(self) -> tuple[LedgerEntry, ...]:
        """The debits so far, oldest first."""
        return tuple(self._entries)

    @property
    def spent(self) -> float | tuple[float, float]:
        """Everything debited so far, composed in the ledger's currency."""
        if self._currency == "approx":
            return (
                math.fsum(e.charge[0] for e in self._entries),  # type: ignore[index]
                math.fsum(e.charge[1] for e in self._entries),  # type: ignore[index]
            )
        return math.fsum(e.charge for e in self._entries)  # type: ignore[misc]

    @property
    def remaining(self) -> float | tuple[float, float]:
        """The budget left, in the ledger's currency (never negative)."""
        spent = self.spent
        if isinstance(spent, tuple):
            return (max(0.0, self._budget[0] - spent[0]), max(0.0, self._budget[1] - spent[1]))  # type: ignore[index]
        return max(0.0, self._budget - spent)  # type: ignore[operator]

    def guarantee(self, delta: float | None = None) -> PrivacyCost | None:
        """The privacy guarantee of everything debited so far (``None`` before any debit).

        A ``"pure"`` ledger returns ``PureDP``; a ``"zcdp"`` ledger returns ``ZCDP`` when
        ``delta`` is ``None`` and its total was a ``ZCDP``, and otherwise ``ApproxDP`` at
        ``delta`` (default: the total's δ) by the ledger's conversion; an ``"approx"`` ledger
        returns ``ApproxDP`` (basic composition), or ``PureDP`` if no charge carried a δ.
        """
        if not self._entries:
            return None
        spent = self.spent
        if self._currency == "pure":
            return PureDP(spent)  # type: ignore[arg-type]
        if self._currency == "zcdp":
            if delta is None and isinstance(self._total, ZCDP):
                return ZCDP(spent)  # type: ignore[arg-type]
            if delta is None:
                delta = self._total.delta  # type: ignore[union-attr]
            return ZCDP(spent).to_approx(delta, self._conversion)  # type: ignore[arg-type]
        eps, dlt = spent  # type: ignore[misc]
        return PureDP(eps) if dlt == 0 else ApproxDP(eps, dlt)

    # -- charging -------------------------------------------------------------------------------
    def charge_of(self, cost: PrivacyCost | float | Sequence[PrivacyCost]) -> tuple[
        PrivacyCost, float | tuple[float, float]
    ]:
        """The guarantee that would be charged for ``cost`` and its amount in this currency.

        ``cost`` may be a sequence of guarantees that the mechanism satisfies simultaneously
        (e.g. a Gaussian mechanism is both ``ApproxDP(ε, δ)`` and ``ZCDP(ρ)``); the first one this
        ledger's currency accepts is used.

        Raises
        ------
        ValueError
            if no offered guarantee can be paid in this currency (see the class notes).
        """
        options = (
            [as_cost(c) for c in cost]
            if isinstance(cost, Sequence) and not isinstance(cost, str)
            else [as_cost(cost)]
        )
        if not options:
            raise ValueError("no privacy cost given")
        for c in options:
            amount = self._amount(c)
            if amount is not None:
                return c, amount
        offered = ", ".join(type(c).__name__ for c in options)
        hint = {
            "pure": "a pure ε-DP budget pays only for pure ε-DP mechanisms (Laplace, discrete "
            "Laplace); use a ZCDP or ApproxDP total for Gaussian mechanisms",
            "zcdp": "a zCDP budget cannot pay for a guarantee that is only (ε, δ)-DP; give the "
            "mechanism a ZCDP(rho) budget (its zCDP guarantee) instead",
            "approx": "an (ε, δ) budget with basic composition needs a δ for every charge; give "
            "the mechanism an ApproxDP(epsilon, delta) budget, or keep the ledger in "
            "currency='zcdp'",
        }[self._currency]
        raise ValueError(
            f"cannot charge {offered} to a ledger in currency {self._currency!r}: {hint}"
        )

    def _amount(self, cost: PrivacyCost) -> float | tuple[float, float] | None:
        if self._currency == "pure":
            return cost.epsilon if isinstance(cost, PureDP) else None
        if self._currency == "zcdp":
            return None if isinstance(cost, ApproxDP) else cost.to_zcdp().rho
        if isinstance(cost, PureDP):
            return (cost.epsilon, 0.0)
        if isinstance(cost, ApproxDP):
            return (cost.epsilon, cost.delta)
        return None

    def _fits(self, amount: float | tuple[float, float]) -> bool:
        spent = self.spent
        if isinstance(amount, tuple):
            return all(
                s + a <= b * (1.0 + _ROUNDING_SLACK)
                for s, a, b in zip(spent, amount, self._budget, strict=True)  # type: ignore[arg-type]
            )
        return spent + amount <= self._budget * (1.0 + _ROUNDING_SLACK)  # type: ignore[operator]

    def can_afford(self, cost: PrivacyCost | float | Sequence[PrivacyCost]) -> bool:
        """Whether :meth:`debit` of ``cost`` would succeed."""
        try:
            _, amount = self.charge_of(cost)
        except ValueError:
            return False
        return self._fits(amount)

    def check(self, cost: PrivacyCost | float | Sequence[PrivacyCost], label: str = "release") -> (
        tuple[PrivacyCost, float | tuple[float, float]]
    ):
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit; charge nothing.

        Returns the guarantee that would be charged and its amount (see :meth:`charge_of`).
        """
        chosen, amount = self.charge_of(cost)
        if not self._fits(amount):
            raise BudgetExceededError(label, amount, self.remaining, self._currency)
        return chosen, amount

    def debit(
        self,
        cost: PrivacyCost | float | Sequence[PrivacyCost],
        label: str,
        details: Mapping[str, Any] | None = None,
    ) -> LedgerEntry:
        """Charge ``cost`` for ``label``; call it *before* drawing any noise.

        Parameters
        ----------
        cost : PrivacyCost, float or sequence of PrivacyCost
            The mechanism's guarantee(s); see :meth:`charge_of`.
        label : str
            What is released (kept in :attr:`history`).
        details : Mapping, optional
            Extra facts to keep with the entry (mechanism, scale, sensitivity, ...).

        Raises
        ------
        BudgetExceededError
            if the charge would overspend; the ledger is unchanged.
        ValueError
            if the cost cannot be paid in this ledger's currency.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("a ledger debit needs a non-empty label saying what is released")
        chosen, amount = self.check(cost, label)
        entry = LedgerEntry(label, chosen, amount, MappingProxyType(dict(details or {})))
        self._entries.append(entry)
        return entry

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(total={self._total}, currency={self._currency!r}, "
            f"spent={_fmt(self.spent)}, remaining={_fmt(self.remaining)}, "
            f"entries={len(self._entries)})"
        )

    def summary(self) -> str:
        """A plain-text table of the history with the totals."""
        unit = {"pure": "ε", "zcdp": "ρ", "approx": "(ε, δ)"}[self._currency]
        lines = [f"privacy ledger: total {self._total} (currency {self._currency}, {unit})"]
        for i, e in enumerate(self._entries):
            lines.append(f"  {i:3d}  {_fmt(e.charge):>24}  {e.label}  [{e.cost}]")
        lines.append(f"  spent {_fmt(self.spent)}, remaining {_fmt(self.remaining)}")
        return "\n".join(lines)


#: The name used in the architecture overview: a total budget with its ledger.
PrivacyBudget = PrivacyLedger
