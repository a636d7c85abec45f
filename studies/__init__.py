"""Reproductions of the papers the library implements, beside the package in a source checkout.

Run one with ``python -m studies NAME [--quick] [--out DIR] [--force] [--set KEY=VALUE ...]``
from the repository's root (``python -m studies --list`` names them). Each study is a module or
package here with ``run(out, quick=False, **settings)`` that writes CSV tables and PNG figures;
they use the library's public API and are not part of the installed package.
"""

from __future__ import annotations

#: The reproductions, by name: seed 002 (Bernstein et al. 2017), seed 003 (McKenna et al. 2021),
#: seed 001 (Zhang et al. 2020).
STUDIES = ("bernstein2017", "mckenna2021", "zhang2020")
