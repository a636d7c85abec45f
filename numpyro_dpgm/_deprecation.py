"""Old spellings of arguments that keep working, with a warning, for one release."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["old_spellings", "renamed_key", "renamed_keywords"]


def old_spellings(fn: Callable, start: int | Callable[[tuple, dict], int],
                   legacy_positional: Sequence[str], names: Mapping[str, str]) -> Callable:
    """``fn`` that maps positional arguments from index ``start`` on to the keywords
    ``legacy_positional`` and old keywords to ``names[old]``, warning about each."""
    qualified = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first = start(args, kwargs) if callable(start) else start
        if len(args) > first:
            extra = args[first:]
            if len(extra) > len(legacy_positional):
                raise TypeError(f"{qualified}() takes {first} positional arguments but "
                                f"{len(args)} were given")
            for old, value in zip(legacy_positional, extra, strict=False):
                new = names.get(old, old)
                if new in kwargs:
                    raise TypeError(f"{qualified}() got multiple values for {new!r}")
                warnings.warn(
                    f"{qualified}(): passing {old!r} by position is deprecated; pass it as "
                    f"the keyword {new}=...", DeprecationWarning, stacklevel=2)
                kwargs[new] = value
            args = args[:first]
        for old in [k for k in kwargs if k in names]:
            new = names[old]
            if new in kwargs:
                raise TypeError(f"{qualified}() got both {old!r} (deprecated) and {new!r}")
            warnings.warn(f"{qualified}(): the keyword {old!r} is deprecated; use {new}=...",
                          DeprecationWarning, stacklevel=2)
            kwargs[new] = kwargs.pop(old)
        return fn(*args, **kwargs)

    return wrapper


def renamed_keywords(names: Mapping[str, str]) -> Callable[[Callable], Callable]:
    """Decorator: ``fn`` also accepts each old keyword ``old`` of ``names`` (``old -> new``),
    with a ``DeprecationWarning`` naming the new spelling."""
    return lambda fn: old_spellings(fn, 10**6, (), dict(names))


def renamed_key(fn: Callable) -> Callable:
    """``fn`` that also accepts its ``rng_key`` as the keyword ``key`` (NumPyro's name is
    ``rng_key``), with a ``DeprecationWarning``.

    >>> @renamed_key
    ... def draw(rng_key=None):
    ...     return rng_key
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     draw(key=3)
    3
    >>> str(caught[0].message)
    "draw(): the keyword 'key' is deprecated; use rng_key=..."
    """
    return renamed_keywords({"key": "rng_key"})(fn)
