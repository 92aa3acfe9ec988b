#!/usr/bin/env bash
# Wheels for the packages the GPU machine lacks (it has torch, triton, transformers, numpy, pandas,
# prometheus-client, ...; nothing can be fetched there). Run here, before scripts/gpu_run.sh travels:
# they land in .whl/ (git-ignored; copy it to the GPU machine with the tree) for CPython 3.10-3.13,
# and gpu_run.sh installs the ones that fit its python.
set -euo pipefail
cd "$(dirname "$0")/.."
# openai (+ distro, jiter): transformers serve's API types (scripts/gpu_hf_serve.sh); 2.x is the last line on httpx
# (the machine has httpx; openai 3.x needs httpx2)
# uvloop, httptools: the server's event loop and HTTP parser in C; hypothesis (+ attrs, sortedcontainers):
# the sampling fuzz (tests/test_server_sampling_fuzz.py)
PACKAGES=(msgspec gguf fastapi starlette uvicorn sse-starlette pydantic pydantic-core annotated-types
          typing-inspection opentelemetry-api importlib-metadata h11 anyio sniffio click openai==2.54.0 distro jiter
          simpy uvloop httptools hypothesis attrs sortedcontainers)
mkdir -p .whl
for py in 3.10 3.11 3.12 3.13; do
  python3 -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --python-version "$py" --no-deps -d .whl "${PACKAGES[@]}" 2>&1 | grep -v "^WARNING" || true
done
ls .whl | wc -l
# the tokenizer of the default model (random-weight real shapes are served with it) and a trace slice
mkdir -p .gpu/tokenizer
.venv/bin/python - <<'PY'
import shutil
from runtime.executor.model.gguf import converted_folder
from runtime.executor.model.loader import default_model_path, file_identity

path = default_model_path()
folder = converted_folder(path, file_identity(path))
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (folder / name).exists():
        shutil.copy(folder / name, ".gpu/tokenizer/")
PY
.venv/bin/python scripts/widen_tokenizer.py .gpu/tokenizer .gpu/tokenizer_152k --vocab 151936  # Qwen3-0.6B shapes
head -n 1201 data/traces/AzureLLMInferenceTrace_conv.csv > .gpu/conv_head1200.csv
head -n 1201 data/traces/AzureLLMInferenceTrace_code.csv > .gpu/code_head1200.csv
# the Mooncake synthetic trace's requests that fit Qwen3-0.6B's 40,960 positions (3,686 of 3,993)
.venv/bin/python -c "import json, sys
rows = [l for l in open('data/traces/synthetic_trace.jsonl') if l.strip()]
keep = [l for l in rows if (lambda r: r['input_length'] + r['output_length'] <= 40960)(json.loads(l))]
open('.gpu/mooncake_40k.jsonl', 'w').writelines(keep)
print(f'.gpu/mooncake_40k.jsonl: {len(keep)} of {len(rows)} requests')"
