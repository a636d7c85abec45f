"""A bounded least-recently-used cache for module-level registries of models and engines.

Compiled E-step engines, M-steps and cached models hold device buffers and jitted functions;
kept in a plain module-level dict they would pile up for the life of the process (one entry per
release structure, noise scale, option set...). :class:`LRUCache` keeps at most ``maxsize``
entries and drops the least recently used one when a new entry would exceed that bound. An
evicted entry is simply rebuilt (and recompiled) the next time it is asked for, so eviction
costs time, never correctness.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

__all__ = ["LRUCache"]

_MISSING = object()


class LRUCache:
    """A mapping of at most ``maxsize`` entries that evicts the least recently used one.

    A lookup (:meth:`get`, ``cache[key]``, :meth:`setdefault`) or a store marks the entry as
    the most recently used. Keys must be hashable (an unhashable key raises ``TypeError``, as
    with a dict). Safe to use from several threads.

    Parameters
    ----------
    maxsize : int
        The bound, at least 1.

    Examples
    --------
    >>> cache = LRUCache(maxsize=2)
    >>> cache["a"], cache["b"] = 1, 2
    >>> cache.get("a")          # "a" is now the most recently used
    1
    >>> cache["c"] = 3          # evicts "b"
    >>> list(cache), len(cache)
    (['a', 'c'], 2)
    """

    def __init__(self, maxsize: int):
        if int(maxsize) != maxsize or maxsize < 1:
            raise ValueError(f"maxsize must be a positive integer, got {maxsize!r}")
        self.maxsize = int(maxsize)
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.RLock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._data.move_to_end(key)
            return value

    def __getitem__(self, key: Hashable) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def setdefault(self, key: Hashable, default: Any) -> Any:
        """The value of ``key`` if present, else store and return ``default``."""
        with self._lock:
            value = self.get(key, _MISSING)
            if value is _MISSING:
                self[key] = value = default
            return value

    def __delitem__(self, key: Hashable) -> None:
        with self._lock:
            del self._data[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Hashable]:
        """The keys, least recently used first (a snapshot)."""
        with self._lock:
            return iter(list(self._data))

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()

    def __repr__(self) -> str:
        return f"LRUCache(maxsize={self.maxsize}, size={len(self)})"
