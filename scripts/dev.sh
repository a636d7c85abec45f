#!/usr/bin/env bash
# One entry point for a fresh machine: finds Python >= 3.12, builds .venv, installs the package
# with the exact versions of requirements/lock.txt, then runs what was asked.
#   bash scripts/dev.sh demo [args]   run the demo on the bundled Adult data
#   bash scripts/dev.sh test [paths]  run the test suite, notebooks included (what CI runs)
#   bash scripts/dev.sh plain         build the wheel, install it without extras into a new venv
#                                     (oldest Python >= 3.12 found), import every module, run a
#                                     tiny fit and `dpgm release` -> `fit` -> `synth` (CI runs it)
#   bash scripts/dev.sh setup         build .venv only (what `test` would build first)
#   bash scripts/dev.sh bench [args]  run the benchmarks (installs the peer, mbi)
#   bash scripts/dev.sh docs [args]   build the documentation site into site/ (mkdocs --strict)
#   bash scripts/dev.sh lint          ruff
#   bash scripts/dev.sh lock          refresh requirements/lock.txt: the newest versions that
#                                     pyproject.toml's ranges allow, for Python 3.12 and newer
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${DPGM_VENV:-$here/.venv}"
lock="$here/requirements/lock.txt"
uv_version="0.13.9"   # the resolver that writes the lock (`dev.sh lock`); pip installs from it

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

find_python_oldest() {  # the oldest interpreter >= 3.12 found, for the plain-install check
  local c v
  [ -n "${DPGM_PLAIN_PYTHON:-}" ] && ok_python "$DPGM_PLAIN_PYTHON" && return 0
  for v in 12 13 14; do
    for c in "python3.$v" "$(pyenv root 2>/dev/null)/versions/3.$v"*/bin/python; do
      command -v "$c" >/dev/null 2>&1 && ok_python "$c" && return 0
    done
  done
  find_python
}

no_python() {
  echo "error: numpyro_dpgm needs Python >= 3.12 and none was found." >&2
  echo "Install one (e.g. 'pyenv install 3.12', or your system's python3.12 package)," >&2
  echo "or point DPGM_PYTHON at it, then run this command again." >&2
  exit 2
}

new_venv() {  # new_venv PYTHON DIR: a venv with the locked pip, setuptools and wheel
  "$1" -m venv "$2"
  "$2/bin/python" -m pip install --quiet -c "$lock" pip setuptools wheel
}

ensure_venv() {
  local extras="$1" stamp py
  if [ ! -x "$venv/bin/python" ]; then
    py="$(find_python)" || no_python
    echo "[dev.sh] creating $venv with $py ($("$py" --version))" >&2
    new_venv "$py" "$venv"
  fi
  stamp="$venv/.installed-$(cat pyproject.toml "$lock" | sha1sum | cut -c1-12)-$extras"
  if [ ! -f "$stamp" ]; then
    echo "[dev.sh] installing numpyro_dpgm[$extras] into $venv (versions: requirements/lock.txt)" >&2
    "$venv/bin/python" -m pip install --quiet -c "$lock" pip setuptools wheel
    "$venv/bin/python" -m pip install --quiet --no-build-isolation -c "$lock" -e ".[$extras]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
  fi
}

plain_check() {  # the wheel, without extras, in a new venv, run from outside the source tree
  local py
  py="$(find_python_oldest)" || no_python
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp:-}"' EXIT
  echo "[dev.sh] plain install: wheel into a new venv with $py ($("$py" --version))" >&2
  new_venv "$py" "$tmp/venv"
  # build from a copy of the tracked and new files: a stale build/ folder would leak into the wheel
  mkdir "$tmp/src"
  git ls-files -co --exclude-standard -z | tar -cf - --null -T - | tar -xf - -C "$tmp/src"
  "$tmp/venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$tmp/dist" \
    "$tmp/src"
  "$tmp/venv/bin/python" -m pip install --quiet -c "$lock" "$tmp"/dist/numpyro_dpgm-*.whl
  (cd "$tmp" && "$tmp/venv/bin/python" "$here/scripts/plain_install_check.py")
}

refresh_lock() {
  local tool="${TMPDIR:-/tmp}/dpgm-uv-$uv_version" py
  if [ ! -x "$tool/bin/uv" ]; then
    py="$(find_python)" || no_python
    "$py" -m venv "$tool" && "$tool/bin/python" -m pip install --quiet "uv==$uv_version"
  fi
  "$tool/bin/uv" pip compile pyproject.toml requirements/tools.in --all-extras --universal \
    --python-version 3.12 --upgrade --quiet -o requirements/lock.txt
  echo "[dev.sh] wrote $lock; run 'bash scripts/dev.sh test' and commit it if the suite passes" >&2
}

cmd="${1:-help}"; shift || true
case "$cmd" in
  demo)  ensure_venv dev; exec "$venv/bin/dpgm" demo "$@" ;;
  test)  ensure_venv dev
         [ $# -eq 0 ] && set -- tests   # the suite (tests/test_notebooks.py runs the notebooks)
         # one persistent compilation cache for the workers, notebook kernels and subprocesses of
         # a run (JAX's own variables win): a program compiled by one process is loaded by the
         # next; a clean clone starts it empty (tests/estimation: 251 s cold, 213 s with it)
         export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$here/.jax-cache}"
         export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"
         export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="${JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES:-0}"
         # one thread per worker for XLA's programs: the workers already share the cores, and
         # two thread pools per core cost time (all tests on a fresh clone: 2,620 -> 2,338 s
         # summed, measured with --durations=0)
         export XLA_FLAGS="${XLA_FLAGS:---xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1}"
         # --durations: where CI's time goes, printed at the end of every run
         # --dist worksteal: a worker that runs out of tests takes the other's queued ones
         exec "$venv/bin/python" -m pytest -n "${DPGM_TEST_WORKERS:-2}" --dist worksteal \
           --durations=25 --durations-min=5 "$@" ;;
  bench) ensure_venv dev,bench; exec "$venv/bin/python" -m benchmarks "$@" ;;
  docs)  ensure_venv dev; exec "$venv/bin/mkdocs" build --strict --site-dir site "$@" ;;
  lint)  ensure_venv dev; exec "$venv/bin/ruff" check numpyro_dpgm studies tests benchmarks scripts ;;
  setup) ensure_venv dev ;;
  plain) plain_check ;;
  lock)  refresh_lock ;;
  *) sed -n '2,14p' "$0"; exit 1 ;;
esac
