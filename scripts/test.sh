#!/usr/bin/env bash
# Install (scripts/install.sh: .venv from the lock), lint, and run the tests that need no GPU
# (Triton kernels run under TRITON_INTERPRET=1), spread over the machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
lint-imports --no-cache   # the layer rules of docs/ARCHITECTURE.md (.importlinter)
python -m pytest -m "not gpu" -q -n "${PYTEST_WORKERS:-auto}" "$@"
