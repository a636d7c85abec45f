#!/usr/bin/env bash
# One entry point for a fresh machine: finds Python >= 3.12, builds .venv, installs the package,
# then runs what was asked.
#   bash scripts/dev.sh demo [args]   run the demo on the bundled Adult data
#   bash scripts/dev.sh test [paths]  run the test suite and execute the notebooks (what CI runs)
#   bash scripts/dev.sh bench [args]  run the benchmarks (installs the peer, mbi)
#   bash scripts/dev.sh docs [args]   build the documentation site into site/ (mkdocs --strict)
#   bash scripts/dev.sh lint          ruff
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${DPGM_VENV:-$here/.venv}"

ok_python() {  # prints the interpreter if it is >= 3.12
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1 && echo "$1"
}

find_python() {
  local c
  for c in "${DPGM_PYTHON:-}" python3.14 python3.13 python3.12 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && ok_python "$c" && return 0
  done
  if command -v pyenv >/dev/null 2>&1; then
    local root; root="$(pyenv root)"
    for c in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
      ok_python "$c/bin/python" && return 0
    done
  fi
  return 1
}

ensure_venv() {
  local extras="$1" stamp py
  if [ ! -x "$venv/bin/python" ]; then
    if ! py="$(find_python)"; then
      echo "error: numpyro_dpgm needs Python >= 3.12 and none was found." >&2
      echo "Install one (e.g. 'pyenv install 3.12', or your system's python3.12 package)," >&2
      echo "or point DPGM_PYTHON at it, then run this command again." >&2
      exit 2
    fi
    echo "[dev.sh] creating $venv with $py ($("$py" --version))" >&2
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
  fi
  stamp="$venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)-$extras"
  if [ ! -f "$stamp" ]; then
    echo "[dev.sh] installing numpyro_dpgm[$extras] into $venv" >&2
    "$venv/bin/python" -m pip install --quiet -e ".[$extras]"
    touch "$stamp"
  fi
}

cmd="${1:-help}"; shift || true
case "$cmd" in
  demo)  ensure_venv dev; exec "$venv/bin/dpgm" demo "$@" ;;
  test)  ensure_venv dev
         [ $# -eq 0 ] && set -- tests notebooks   # the suite and the executed notebooks
         exec "$venv/bin/python" -m pytest -n "${DPGM_TEST_WORKERS:-2}" --nbmake "$@" ;;
  bench) ensure_venv dev,bench; exec "$venv/bin/python" -m benchmarks "$@" ;;
  docs)  ensure_venv dev; exec "$venv/bin/mkdocs" build --strict --site-dir site "$@" ;;
  lint)  ensure_venv dev; exec "$venv/bin/ruff" check numpyro_dpgm tests benchmarks ;;
  *) sed -n '2,9p' "$0"; exit 1 ;;
esac
