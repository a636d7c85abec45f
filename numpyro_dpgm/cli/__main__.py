"""``python -m numpyro_dpgm.cli``: the ``dpgm`` command line."""

from . import app

if __name__ == "__main__":  # pragma: no cover
    app()
