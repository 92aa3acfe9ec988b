#!/usr/bin/env bash
# HF transformers' own OpenAI server (`transformers serve --continuous-batching`) as a peer under the same
# client as our server (`minivllm bench serve`), on the GPU machine (scripts/gpu_run.sh hfserve calls it):
#   1. a random-weight Qwen3-0.6B checkpoint (the shapes `--model random:qwen3-0.6b` serves, vocab 151,936,
#      bf16, eos off in its generation config) with SmolLM2's tokenizer from .gpu/tokenizer, in $CKPT
#   2. transformers serve on it (cuda, bf16, continuous batching, + $HF_SERVE_FLAGS), /health, 4 warm-up requests
#   3. bench serve: the first $LIMIT Azure conv requests, arrivals $RATE_SCALE x compressed, prompts sent as text
#      (the peer takes no token ids), no ignore_eos field (it rejects unknown fields), cut at $BENCH_S seconds
#      (requests still running count as errors "time limit", unsent ones "not sent") -> $OUT/hf_serve.json
#   4. the peer stopped, the end of its log printed
#   WITH_OURS=1: then our server under the very same client flags (text prompts, time limit) -> $OUT/ours_text.json,
#   and a side-by-side table (adds our server's start, ~1-2 min on a fresh machine)
# Env: OUT (out/gpu), LIMIT (800), RATE_SCALE (6), BENCH_S (90), READY_S (150), PORT (8012), CKPT (/tmp/hf_qwen3-0.6b;
# an existing one is reused), HF_SERVE_FLAGS (e.g. "--cb-use-cuda-graph"), DEVICE (cuda), DTYPE (bfloat16); with
# WITH_OURS=1 also ENGINE_FLAGS and OURS_MODEL (random:qwen3-0.6b). A CPU try: DEVICE=cpu DTYPE=float32 CKPT=<a tiny
# checkpoint> HF_SERVE_FLAGS="--cb-num-blocks 1024 --cb-max-batch-tokens 512" (on CPU its KV cache otherwise sizes
# itself to the RAM).
# Without WITH_OURS it takes ~BENCH_S + 60 s; a peer that fails says why and the script exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import openai, fastapi, uvicorn" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --find-links .whl --no-deps --no-compile --no-cache-dir --target /tmp/site \
    $(ls .whl | sed -E 's/-[0-9].*//' | sort -u) || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
OUT="${OUT:-out/gpu}" LIMIT="${LIMIT:-800}" RATE_SCALE="${RATE_SCALE:-6}" BENCH_S="${BENCH_S:-90}"
READY_S="${READY_S:-150}" PORT="${PORT:-8012}" CKPT="${CKPT:-/tmp/hf_qwen3-0.6b}" DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
mkdir -p "$OUT"
for need in .gpu/tokenizer/tokenizer.json .gpu/conv_head1200.csv; do
  [ -e "$need" ] || { echo "hf_serve: $need missing (run scripts/gpu_wheels.sh first and copy .gpu to this machine)"; exit 1; }
done
python3 -c "from transformers.utils.import_utils import is_serve_available as ok; import sys; sys.exit(not ok())" ||
  { echo "hf_serve: transformers serve's packages are missing (openai, fastapi, uvicorn, pydantic: copy .whl from scripts/gpu_wheels.sh)"; exit 1; }
python3 -c "import transformers; print('hf_serve: transformers', transformers.__version__)"

if [ ! -f "$CKPT/model.safetensors" ]; then
  timeout 180 python3 -m runtime.bench.hf_checkpoint "$CKPT" --shape qwen3-0.6b --tokenizer .gpu/tokenizer \
    --dtype "$DTYPE" --device "$DEVICE" || { echo "hf_serve: could not write the checkpoint $CKPT"; exit 1; }
fi
CLIENT=(.gpu/conv_head1200.csv --limit "$LIMIT" --rate-scale "$RATE_SCALE" --slo ttft_ms=1000,tpot_ms=50 --no-progress
        --text-prompts .gpu/tokenizer --time-limit "$BENCH_S")
python3 -m runtime.bench.hf_serve_peer "$CKPT" --device "$DEVICE" --dtype "$DTYPE" --port "$PORT" \
  --serve-flags="${HF_SERVE_FLAGS:-}" --log /tmp/hf_serve.log --ready-timeout "$READY_S" --warmup-timeout 120 \
  --run-timeout $((BENCH_S + 60)) -- \
  python3 -m runtime bench serve "${CLIENT[@]}" --url "http://127.0.0.1:$PORT/v1" --served-model-name "$CKPT" \
    --no-ignore-eos --json "$OUT/hf_serve.json"
status=$?
[ $status -eq 0 ] || echo "hf_serve: the peer run failed (status $status; 2: not up, 3: warm-up failed, 124: timed out)"

if [ -n "${WITH_OURS:-}" ]; then
  timeout $((BENCH_S + 420)) python3 -m runtime bench serve "${CLIENT[@]}" --json "$OUT/ours_text.json" \
    --server-trace /tmp/ours_text.jsonl --server-log /tmp/ours_text.log --ready-timeout 300 \
    --launch --model "${OURS_MODEL:-random:qwen3-0.6b}" --tokenizer .gpu/tokenizer --device "$DEVICE" --dtype "$DTYPE" --max-model-len 8192 \
    ${ENGINE_FLAGS:-} || { echo "hf_serve: our server's run failed"; tail -n 20 /tmp/ours_text.log; status=1; }
  python3 - "$OUT/ours_text.json" "$OUT/hf_serve.json" <<'PY'
import json, sys
from pathlib import Path

rows = [("minivllm serve", sys.argv[1]), ("transformers serve (cb)", sys.argv[2])]
print(f"{'server':<24}{'done':>10}{'TTFT p50/p99 ms':>20}{'TPOT p50/p99 ms':>18}{'ITL p99':>9}{'E2E p50':>9}"
      f"{'out tok/s':>10}{'goodput req/s':>15}")
for name, path in rows:
    if not Path(path).is_file():
        print(f"{name:<24} (no report)")
        continue
    s = json.loads(Path(path).read_text())["summary"]
    f = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
    print(f"{name:<24}{s['completed']:>5}/{s['requests']:<4}{f(s['ttft_ms']['p50']) + ' / ' + f(s['ttft_ms']['p99']):>20}"
          f"{f(s['tpot_ms']['p50']) + ' / ' + f(s['tpot_ms']['p99']):>18}{f(s['itl_ms']['p99']):>9}"
          f"{f(s['e2e_ms']['p50']):>9}{s['output_throughput_tok_s']:>10,.0f}{s.get('goodput_req_s', 0):>15.2f}")
PY
fi
exit $status
