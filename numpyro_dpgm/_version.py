"""The library's version (kept apart so that any module can read it without a cycle)."""

__version__ = "0.1.0"
