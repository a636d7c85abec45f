"""The ``dpgm`` command line.

``dpgm demo`` runs the bundled demo (the papers' reproductions are ``python -m studies`` in a
source checkout). The private-data workflow is three commands, each reading the previous one's
file:

``dpgm release`` (records → measurements file), ``dpgm fit`` (measurements → model file),
``dpgm synth`` (model → synthetic CSV/Parquet; or, with ``--mechanism aim|mst``, records →
synthetic CSV/Parquet in one step); ``dpgm bench`` runs the benchmarks of a
source checkout. Bad input ends with a one-line ``error: ...`` on stderr, exit code 2, and no
file written. File formats: :mod:`numpyro_dpgm.io`.

Outputs: no command replaces an existing file unless ``--force`` is given; none ever replaces a
file it reads, nor a measurements or ledger file that records a release (its budget is spent:
losing the file loses the release). Files are written atomically (a temporary file in the same
folder, renamed into place). Messages are printed as plain text (no rich markup), so
``[labels]`` and other brackets show as written.

Modules: one per command group (``_jobs``: demo, bench; ``_release``; ``_fit``;
``_synth`` with ``_mechanism``), with the plumbing they share (``_common``: errors, tables,
output checks, budgets; ``_progress``: progress on stderr; ``_compilation_cache``: JAX's
persistent compilation cache, on for every command unless ``DPGM_COMPILATION_CACHE=off``, and
off for ``bench``, whose timings include compilation). This module holds the
app and registers the commands.
"""

from __future__ import annotations

import typer

from ._common import warnings_as_lines
from ._compilation_cache import enable_compilation_cache
from ._fit import fit
from ._jobs import bench, demo
from ._release import release
from ._synth import synth

app = typer.Typer(
    help="Differentially private learning of graphical models (numpyro_dpgm).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[labels]" must not be read as markup
)


#: Commands whose timings include compilation: no persistent compilation cache for them.
MEASURING = ("bench",)


@app.callback()
def main(ctx: typer.Context) -> None:
    """Differentially private learning of graphical models."""
    if ctx.invoked_subcommand not in MEASURING:
        enable_compilation_cache()
    ctx.call_on_close(warnings_as_lines())


# commands in the order of ``dpgm --help``: the front-end jobs, then the private-data workflow
app.command()(demo)
app.command()(release)
app.command()(fit)
app.command()(synth)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench)
