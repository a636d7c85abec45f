"""Domains of discrete attributes.

A :class:`Domain` is an ordered mapping from attribute names to the number of values each attribute
takes; attribute ``a`` takes the integer codes ``0, ..., domain[a] - 1``. It is immutable and
hashable, so it can sit in the static (auxiliary) part of a JAX pytree.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

__all__ = ["Domain", "Clique"]

Clique = tuple[str, ...]


class Domain(Mapping[str, int]):
    """Ordered attribute names with their numbers of values.

    Parameters
    ----------
    attrs : Mapping[str, int]
        Attribute name -> number of values (a positive integer). The mapping's order is the
        domain's order, which fixes the column order of record arrays.

    Examples
    --------
    >>> d = Domain({"a": 2, "b": 3, "c": 4})
    >>> d.size(("a", "c"))
    8
    >>> d.project(("c", "a"))
    Domain({'c': 4, 'a': 2})
    """

    __slots__ = ("_attrs", "_sizes", "_index", "_hash")

    def __init__(self, attrs: Mapping[str, int]):
        if isinstance(attrs, Domain):
            items = list(attrs.items())
        elif isinstance(attrs, Mapping):
            items = list(attrs.items())
        else:
            raise TypeError(
                "Domain expects a mapping attribute -> number of values, got "
                f"{type(attrs).__name__}"
            )
        names, sizes = [], []
        for name, size in items:
            if not isinstance(name, str) or not name:
                raise TypeError(f"attribute names must be non-empty strings, got {name!r}")
            try:
                k = operator.index(size)
            except TypeError:
                raise TypeError(
                    f"attribute {name!r}: the number of values must be an integer, got {size!r}"
                ) from None
            if k < 1:
                raise ValueError(
                    f"attribute {name!r}: the number of values must be at least 1, got {k}"
                )
            names.append(name)
            sizes.append(int(k))
        self._attrs: tuple[str, ...] = tuple(names)
        self._sizes: tuple[int, ...] = tuple(sizes)
        self._index: dict[str, int] = {a: i for i, a in enumerate(names)}
        self._hash = hash((self._attrs, self._sizes))

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_json(cls, path: str | Path) -> Domain:
        """Read a domain file of the form ``{"attr": size, ...}`` (attribute order is kept)."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a domain file holds one JSON object {{attr: size}}")
        return cls(data)

    def to_json(self, path: str | Path) -> None:
        """Write the domain as ``{"attr": size, ...}``."""
        with open(path, "w") as f:
            json.dump(dict(self.items()), f)

    # -- mapping protocol ----------------------------------------------------------------------
    def __getitem__(self, attr: str) -> int:
        try:
            return self._sizes[self._index[attr]]
        except KeyError:
            raise KeyError(self._unknown_message([attr])) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._attrs)

    def __len__(self) -> int:
        return len(self._attrs)

    def __contains__(self, attr: object) -> bool:
        return attr in self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Domain):
            return NotImplemented
        return self._attrs == other._attrs and self._sizes == other._sizes

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Domain({dict(zip(self._attrs, self._sizes, strict=True))!r})"

    # -- queries -------------------------------------------------------------------------------
    @property
    def attrs(self) -> tuple[str, ...]:
        """Attribute names in domain order."""
        return self._attrs

    @property
    def shape(self) -> tuple[int, ...]:
        """Number of values of every attribute, in domain order."""
        return self._sizes

    def index(self, attr: str) -> int:
        """Position of ``attr`` in the domain order."""
        self.check(attr)
        return self._index[attr]

    def shape_of(self, attrs: Iterable[str]) -> tuple[int, ...]:
        """Table shape of the attributes ``attrs`` in the given order."""
        attrs = self.check(attrs)
        return tuple(self._sizes[self._index[a]] for a in attrs)

    def size(self, attrs: Iterable[str] | None = None) -> int:
        """Number of cells of the table over ``attrs`` (all attributes when ``None``)."""
        if attrs is None:
            return math.prod(self._sizes)
        return math.prod(self.shape_of(attrs))

    def project(self, attrs: Iterable[str] | str) -> Domain:
        """The sub-domain over ``attrs``, in the order given."""
        attrs = self.check(attrs)
        return Domain({a: self[a] for a in attrs})

    def sorted(self, attrs: Iterable[str]) -> Clique:
        """``attrs`` re-ordered into domain order."""
        return tuple(sorted(self.check(attrs), key=self._index.__getitem__))

    def check(self, attrs: Iterable[str] | str) -> Clique:
        """Validate attribute names and return them as a tuple.

        Raises
        ------
        KeyError
            naming every attribute that is not in the domain.
        """
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        unknown = [a for a in attrs if a not in self._index]
        if unknown:
            raise KeyError(self._unknown_message(unknown))
        return attrs

    def check_clique(self, clique: Iterable[str] | str) -> Clique:
        """Validate a clique: known attributes, none repeated, not empty."""
        if isinstance(clique, str):
            clique = (clique,)
        try:
            clique = tuple(clique)
        except TypeError:
            raise TypeError(
                f"a clique is a tuple of attribute names, got {clique!r}"
            ) from None
        if not clique:
            raise ValueError("empty clique: a clique needs at least one attribute")
        self.check(clique)
        if len(set(clique)) != len(clique):
            dup = sorted({a for a in clique if clique.count(a) > 1})
            raise ValueError(f"clique {clique} repeats attribute(s) {dup}")
        return clique

    def _unknown_message(self, unknown: list[object]) -> str:
        return (
            f"unknown attribute(s) {unknown}; the domain has {list(self._attrs)}"
        )
