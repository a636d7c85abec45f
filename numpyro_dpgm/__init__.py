"""numpyro_dpgm: differentially private learning of graphical models in NumPyro.

The package namespace is the front door: ``import numpyro_dpgm as dpgm`` gives the names of the
workflow (``__all__``, 37 of them): the core types (:class:`Domain`, :class:`MarkovNetwork`,
:class:`Measurement` and its noise specs, :class:`Dataset`), releases and privacy accounting
(:func:`release`, :class:`PrivacyLedger`, :class:`PureDP`, ...), every registered estimator
from measurements (:func:`naive_mle`, :func:`cgm_em`, :func:`prox_pgm`, ...) with their
:class:`Result`, the mechanisms :func:`mst` and :func:`aim`, synthesis, Rubin's rules and the
model and measurement files. The subpackages, also attributes (``dpgm.distributions``,
``dpgm.infer``, ``dpgm.oracles``, ``dpgm.estimation``, ``dpgm.learners``, ``dpgm.mechanisms``,
``dpgm.privacy``, ``dpgm.io``, ``dpgm.metrics``), hold the rest: the learners from records,
MWEM+PGM, ledger files, Spark and file counting, the combining rules' other forms.

The names load on first use (PEP 562), so ``import numpyro_dpgm`` and ``dpgm --help`` do not
pay for JAX, NumPyro and ArviZ until something needs them. Importing the package sets no global
JAX flag. Enable float64 yourself
(``numpyro.enable_x64()``) before working with counts: the library warns when it runs in float32.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

#: Where each name of the front door is defined: name -> submodule (relative).
_SOURCES: dict[str, str] = {
    "rubin": ".combining",
    "Dataset": ".data",
    "count": ".data",
    "load_demo": ".data",
    "MarkovRandomField": ".distributions",
    "Domain": ".domain",
    "decode": ".encoding",
    "encode": ".encoding",
    "read_domain": ".encoding",
    "Result": ".estimation",
    "cgm_em": ".estimation",
    "mcem": ".estimation",
    "naive_mle": ".estimation",
    "posterior_mean": ".estimation",
    "prox_pgm": ".estimation",
    "variational_em": ".estimation",
    "load_measurements": ".io",
    "load_model": ".io",
    "save_measurements": ".io",
    "save_model": ".io",
    "DiscreteGaussian": ".measurements",
    "DiscreteLaplace": ".measurements",
    "Gaussian": ".measurements",
    "Laplace": ".measurements",
    "Measurement": ".measurements",
    "aim": ".mechanisms",
    "mst": ".mechanisms",
    "MarkovNetwork": ".network",
    "ZCDP": ".privacy",
    "ApproxDP": ".privacy",
    "BudgetExceededError": ".privacy",
    "PrivacyLedger": ".privacy",
    "PureDP": ".privacy",
    "release": ".privacy",
    "simulate_release": ".privacy",
    "synthesize": ".synthesis",
    "CliqueTables": ".tables",
}

#: The subpackages the namespace gives as attributes (not in ``__all__``: the front door lists
#: the workflow's names).
_SUBPACKAGES = ("distributions", "estimation", "infer", "io", "learners", "mechanisms", "metrics",
                "oracles", "privacy")

__all__ = sorted(_SOURCES)

if TYPE_CHECKING:  # the static view of the lazy names
    from . import distributions as distributions
    from . import estimation as estimation
    from . import infer as infer
    from . import io as io
    from . import learners as learners
    from . import mechanisms as mechanisms
    from . import metrics as metrics
    from . import oracles as oracles
    from . import privacy as privacy
    from .combining import (
        rubin as rubin,
    )
    from .data import (
        Dataset as Dataset,
    )
    from .data import (
        count as count,
    )
    from .data import (
        load_demo as load_demo,
    )
    from .distributions import (
        MarkovRandomField as MarkovRandomField,
    )
    from .domain import (
        Domain as Domain,
    )
    from .encoding import (
        decode as decode,
    )
    from .encoding import (
        encode as encode,
    )
    from .encoding import (
        read_domain as read_domain,
    )
    from .estimation import (
        Result as Result,
    )
    from .estimation import (
        cgm_em as cgm_em,
    )
    from .estimation import (
        mcem as mcem,
    )
    from .estimation import (
        naive_mle as naive_mle,
    )
    from .estimation import (
        posterior_mean as posterior_mean,
    )
    from .estimation import (
        prox_pgm as prox_pgm,
    )
    from .estimation import (
        variational_em as variational_em,
    )
    from .io import (
        load_measurements as load_measurements,
    )
    from .io import (
        load_model as load_model,
    )
    from .io import (
        save_measurements as save_measurements,
    )
    from .io import (
        save_model as save_model,
    )
    from .measurements import (
        DiscreteGaussian as DiscreteGaussian,
    )
    from .measurements import (
        DiscreteLaplace as DiscreteLaplace,
    )
    from .measurements import (
        Gaussian as Gaussian,
    )
    from .measurements import (
        Laplace as Laplace,
    )
    from .measurements import (
        Measurement as Measurement,
    )
    from .mechanisms import (
        aim as aim,
    )
    from .mechanisms import (
        mst as mst,
    )
    from .network import (
        MarkovNetwork as MarkovNetwork,
    )
    from .privacy import (
        ZCDP as ZCDP,
    )
    from .privacy import (
        ApproxDP as ApproxDP,
    )
    from .privacy import (
        BudgetExceededError as BudgetExceededError,
    )
    from .privacy import (
        PrivacyLedger as PrivacyLedger,
    )
    from .privacy import (
        PureDP as PureDP,
    )
    from .privacy import (
        release as release,
    )
    from .privacy import (
        simulate_release as simulate_release,
    )
    from .synthesis import (
        synthesize as synthesize,
    )
    from .tables import (
        CliqueTables as CliqueTables,
    )


#: Names that live in a subpackage, not at the front door: where ``dpgm.<name>`` points to.
_ELSEWHERE = {
    **dict.fromkeys(("learn_ising", "learn_pairwise", "learn_structure", "learn_twise", "psgd"),
                    "learners"),
    **dict.fromkeys(("estimate_total",), "estimation"),
    **dict.fromkeys(("mwem_pgm",), "mechanisms"),
    **dict.fromkeys(("analyse", "CombinedEstimate"), "combining"),
    **dict.fromkeys(("count_file", "count_spark"), "data"),
    **dict.fromkeys(("Encoded",), "encoding"),
    **dict.fromkeys(("FileFormatError", "load_ledger", "save_ledger"), "io"),
    **dict.fromkeys(("PrivacyBudget", "release_tables"), "privacy"),
}


def __getattr__(name: str) -> Any:
    """Import a front-door name or subpackage on first use and keep it (PEP 562)."""
    if name in _SUBPACKAGES:
        value: Any = importlib.import_module(f".{name}", __name__)
    elif name in _SOURCES:
        value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
    elif name in _ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: it lives in "
                             f"{__name__}.{_ELSEWHERE[name]} (from {__name__}.{_ELSEWHERE[name]} "
                             f"import {name})")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
