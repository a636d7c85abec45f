"""Imports point one way: every module of the package sits in a layer and imports only from its
own layer or the layers below, without cycles.

The layers, bottom to top:

1. core: domains, tables, networks, measurements, data in, accounting arithmetic;
2. oracles (``oracles/``): marginal inference and its inverse (the MLE fit);
3. distributions (``distributions/``) and the accuracy measures between models;
4. infer (``infer/``): NumPyro handlers, Bayesian models, EM with its E- and M-steps;
5. estimation (``estimation/``, ``learners/``): estimators from measurements, learners from
   records;
6. mechanisms and outputs: releases, MWEM-style mechanisms, synthesis, files;
7. front ends: the package namespace, the command line and the demo.

A package's ``__init__`` sits in the layer of the highest module it re-exports. Imports inside
functions count like module-level ones: a function-level import may save start-up time, but it
may not point upwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import numpyro_dpgm

PACKAGE = "numpyro_dpgm"
ROOT = Path(numpyro_dpgm.__file__).parent

CORE, ORACLES, DISTRIBUTIONS, INFER, ESTIMATION, MECHANISMS, FRONT = range(1, 8)

LAYERS = {
    # 1. core
    "numpyro_dpgm._cache": CORE,
    "numpyro_dpgm._jit": CORE,
    "numpyro_dpgm._warnings": CORE,
    "numpyro_dpgm._precision": CORE,
    "numpyro_dpgm._version": CORE,
    "numpyro_dpgm.domain": CORE,
    "numpyro_dpgm.tables": CORE,
    "numpyro_dpgm.network": CORE,
    "numpyro_dpgm.measurements": CORE,
    "numpyro_dpgm.encoding": CORE,
    "numpyro_dpgm.data": CORE,
    "numpyro_dpgm.combining": CORE,  # Rubin's rules: arithmetic on analyses, no models
    "numpyro_dpgm.privacy._validation": CORE,
    "numpyro_dpgm.privacy.guarantees": CORE,
    "numpyro_dpgm.privacy.conversions": CORE,
    "numpyro_dpgm.privacy.calibration": CORE,
    "numpyro_dpgm.privacy.ledger": CORE,
    "numpyro_dpgm.privacy.sensitivity": CORE,
    # 2. oracles
    "numpyro_dpgm.oracles": ORACLES,
    "numpyro_dpgm.oracles.junction_tree": ORACLES,
    "numpyro_dpgm.oracles.triangulation": ORACLES,
    "numpyro_dpgm.oracles.memory": ORACLES,
    "numpyro_dpgm.oracles.calibration": ORACLES,
    "numpyro_dpgm.oracles.queries": ORACLES,
    "numpyro_dpgm.oracles.factored": ORACLES,
    "numpyro_dpgm.oracles.region_graph": ORACLES,
    "numpyro_dpgm.oracles._region_layout": ORACLES,
    "numpyro_dpgm.oracles.gbp": ORACLES,
    "numpyro_dpgm.oracles.protocol": ORACLES,  # what mirror descent calls: exact, Convex-GBP
    "numpyro_dpgm.oracles.nlbp": ORACLES,
    "numpyro_dpgm.oracles.mle": ORACLES,  # θ from marginals: the oracle run backwards
    "numpyro_dpgm.oracles.rounding": ORACLES,  # records by rounding expected counts
    # 3. distributions
    "numpyro_dpgm.distributions": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.cgm": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.constraints": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.mrf": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.noise": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.normal_cgm": DISTRIBUTIONS,
    "numpyro_dpgm.distributions.relaxation": DISTRIBUTIONS,
    "numpyro_dpgm.metrics": DISTRIBUTIONS,  # compares MarkovRandomFields and tables
    # 4. infer
    "numpyro_dpgm.infer": INFER,
    "numpyro_dpgm.infer.handlers": INFER,
    "numpyro_dpgm.infer.bayes": INFER,
    "numpyro_dpgm.infer.bayes.labels": INFER,
    "numpyro_dpgm.infer.bayes.coding": INFER,
    "numpyro_dpgm.infer.bayes.conditional": INFER,
    "numpyro_dpgm.infer.bayes.dirichlet_prior": INFER,
    "numpyro_dpgm.infer.bayes.model": INFER,
    "numpyro_dpgm.infer.bayes.initialization": INFER,
    "numpyro_dpgm.infer.bayes.records": INFER,
    "numpyro_dpgm.infer.bayes.interweave": INFER,
    "numpyro_dpgm.infer.bayes.gibbs": INFER,
    "numpyro_dpgm.infer.bayes.count_sites": INFER,
    "numpyro_dpgm.infer.bayes.count_gibbs": INFER,
    "numpyro_dpgm.infer.bayes.collapsed_tree": INFER,
    "numpyro_dpgm.infer.bayes.collapse": INFER,
    "numpyro_dpgm.infer.bayes.laplace_mixture": INFER,
    "numpyro_dpgm.infer.bayes.laplace_metric": INFER,
    "numpyro_dpgm.infer.bayes.pilot_map": INFER,
    "numpyro_dpgm.infer.bayes.laplace": INFER,
    "numpyro_dpgm.infer.bayes.checks": INFER,
    "numpyro_dpgm.infer.bayes.extend": INFER,
    "numpyro_dpgm.infer.bayes.warmup": INFER,
    "numpyro_dpgm.infer.bayes.team": INFER,
    "numpyro_dpgm.infer.bayes.relax": INFER,
    "numpyro_dpgm.infer.sensitivity": INFER,
    "numpyro_dpgm.infer.bayes.nuts": INFER,
    "numpyro_dpgm.infer.bayes.paths": INFER,
    "numpyro_dpgm.infer.bayes.svi": INFER,
    "numpyro_dpgm.infer.diagnostics": INFER,
    "numpyro_dpgm.infer.estep": INFER,
    "numpyro_dpgm.infer.mstep": INFER,
    "numpyro_dpgm.infer.em": INFER,
    # 5. estimation
    "numpyro_dpgm.infer.result": INFER,
    "numpyro_dpgm.estimation.contract": ESTIMATION,  # the estimators' signature and registry
    "numpyro_dpgm.estimation.losses": ESTIMATION,
    "numpyro_dpgm.estimation.naive": ESTIMATION,
    "numpyro_dpgm.infer.em_program": INFER,
    "numpyro_dpgm.infer.em_start": INFER,
    "numpyro_dpgm.estimation.em_risk": ESTIMATION,
    "numpyro_dpgm.estimation.cgm_em": ESTIMATION,
    "numpyro_dpgm.estimation.variational_em": ESTIMATION,
    "numpyro_dpgm.estimation.mcem": ESTIMATION,
    "numpyro_dpgm.estimation.posterior_mean": ESTIMATION,
    "numpyro_dpgm.estimation.mirror_descent": ESTIMATION,
    "numpyro_dpgm.estimation.risk_stop": ESTIMATION,
    "numpyro_dpgm.estimation.prox_pgm": ESTIMATION,
    "numpyro_dpgm.learners": ESTIMATION,
    "numpyro_dpgm.learners.psgd": ESTIMATION,
    "numpyro_dpgm.learners.frank_wolfe": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf._inputs": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf._regressions": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf._charges": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.ising": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.pairwise": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.twise": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.parities": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.structure": ESTIMATION,
    "numpyro_dpgm.learners.private_mrf.conversions": ESTIMATION,
    # 6. mechanisms and outputs
    "numpyro_dpgm.privacy.samplers": MECHANISMS,  # needs distributions.noise
    "numpyro_dpgm.privacy.releases": MECHANISMS,  # needs distributions.noise and data only
    "numpyro_dpgm.privacy": MECHANISMS,
    "numpyro_dpgm.estimation": ESTIMATION,
    "numpyro_dpgm.mechanisms": MECHANISMS,
    "numpyro_dpgm.mechanisms._inputs": MECHANISMS,
    "numpyro_dpgm.mechanisms.selection": MECHANISMS,  # OpenDP's noisy max (privacy.samplers)
    "numpyro_dpgm.mechanisms.workload": MECHANISMS,
    "numpyro_dpgm.mechanisms.compression": MECHANISMS,
    "numpyro_dpgm.mechanisms.refit": MECHANISMS,
    "numpyro_dpgm.mechanisms.mwem": MECHANISMS,
    "numpyro_dpgm.mechanisms.mst": MECHANISMS,
    "numpyro_dpgm.mechanisms.aim": MECHANISMS,
    "numpyro_dpgm.synthesis": MECHANISMS,  # records from estimates and posteriors (infer.bayes)
    "numpyro_dpgm.io": MECHANISMS,  # files of releases (privacy.releases) and models
    "numpyro_dpgm.io._files": MECHANISMS,
    "numpyro_dpgm.io._json": MECHANISMS,
    "numpyro_dpgm.io.measurements": MECHANISMS,
    "numpyro_dpgm.io.models": MECHANISMS,
    "numpyro_dpgm.io.ledger": MECHANISMS,
    # 7. front ends
    "numpyro_dpgm": FRONT,
    "numpyro_dpgm.cli": FRONT,
    "numpyro_dpgm.cli.__main__": FRONT,
    "numpyro_dpgm.cli._common": FRONT,
    "numpyro_dpgm.cli._compilation_cache": FRONT,
    "numpyro_dpgm.cli._progress": FRONT,
    "numpyro_dpgm.cli._jobs": FRONT,
    "numpyro_dpgm.cli._release": FRONT,
    "numpyro_dpgm.cli._fit": FRONT,
    "numpyro_dpgm.cli._synth": FRONT,
    "numpyro_dpgm.cli._mechanism": FRONT,
    "numpyro_dpgm.demo": FRONT,
}


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted name of the module in ``path`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere in its source (any nesting).

    ``from X import a`` counts as an import of the module ``X.a`` when that is a module of the
    package, else of ``X``; relative imports are resolved against ``name``'s package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                       else source for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import numpyro_dpgm.a.b`` binds the package but depends on ``a.b``: take the
            # longest prefix that is a module of the package
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """The package's import graph: an edge from each module to each module it imports."""
    modules = package_modules(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in imported_modules(name, path,
                                                                             set(modules)))
    return graph


def upward_edges(graph: nx.DiGraph, layers: dict[str, int]) -> list[str]:
    """The imports that point to a higher layer, as readable lines (modules without a layer
    are left to :func:`test_every_module_has_a_layer`)."""
    return [f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]})"
            for a, b in sorted(graph.edges)
            if a in layers and b in layers and layers[b] > layers[a]]


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(package_modules()) - set(LAYERS))
    assert not missing, (
        f"module(s) without a layer: {missing}; add each to LAYERS in tests/test_layers.py "
        "(the lowest layer whose modules it needs)")
    stale = sorted(set(LAYERS) - set(package_modules()))
    assert not stale, f"LAYERS names module(s) that no longer exist: {stale}; remove them"


def test_imports_point_downwards() -> None:
    bad = upward_edges(import_graph(), LAYERS)
    assert not bad, "imports that point to a higher layer:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    cycles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(import_graph()))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_upward_and_function_level_imports(tmp_path: Path) -> None:
    """The parser finds relative, absolute, nested and ``from package import module`` edges."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from .sub import high\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "high.py").write_text("import numpyro_dpgm.low\nfrom .. import low as _\n")
    graph = import_graph(pkg)
    assert set(graph.edges) == {("numpyro_dpgm.low", "numpyro_dpgm.sub.high"),
                                ("numpyro_dpgm.sub.high", "numpyro_dpgm.low")}
    layers = {"numpyro_dpgm": 2, "numpyro_dpgm.low": 1, "numpyro_dpgm.sub": 2,
              "numpyro_dpgm.sub.high": 2}
    assert upward_edges(graph, layers) == [
        "numpyro_dpgm.low (layer 1) imports numpyro_dpgm.sub.high (layer 2)"]
    assert len(list(nx.simple_cycles(graph))) == 1


def test_layout_page_is_current() -> None:
    """``docs/api/layout.md`` lists every module with its layer and job."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "layout.py"
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
