#!/usr/bin/env bash
# Install, lint, and run the tests that need no GPU (Triton kernels run under TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
ruff check .
lint-imports --no-cache   # the layer rules of docs/ARCHITECTURE.md (.importlinter)
python3 -m pytest -m "not gpu" -q "$@"
