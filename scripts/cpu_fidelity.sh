#!/usr/bin/env bash
# CPU fidelity runs on a quiet machine: the engine in process (bench live), pinned to one core with one
# torch thread, on a workload where chunked prefill matters (prompts 64-1,024 tokens, outputs 32-96);
# the loads are shares of the capacity measured first on the same core, so any CPU gets the same
# regime. docs/BENCHMARKS.md, "Simulator fidelity", has what was run and the tables.
#
#   scripts/cpu_fidelity.sh OUT STAGE...     STAGE: runs (capacity, the fit run, held-out runs on/off,
#                                            a repeat), more (another load on/off), profile
# Environment: CORE (default 3), N requests (30), MODEL (e.g. "--model random:smollm2-135m" where the
# default model's GGUF is not installed: the same shapes, so the same step times). On the GPU machine,
# install the carried wheels first and put them on PYTHONPATH, as scripts/gpu_run.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; shift
mkdir -p "$OUT"
pin() { taskset -c "${CORE:-3}" env OMP_NUM_THREADS=1 python3 -m runtime "$@"; }
# shellcheck disable=SC2206
WL=(--synthetic "${N:-30}" --input-len uniform:64:1024 --output-len uniform:32:96 --no-progress --device cpu ${MODEL:-})
ON=(--max-num-batched-tokens 128)
OFF=(--no-enable-chunked-prefill --max-num-batched-tokens 2048)  # a whole recomputed prompt + output fits
run() {  # NAME LOAD SEED FLAGS...
  local name=$1 load=$2 seed=$3; shift 3
  local rate; rate=$(python3 -c "import json; print(round($load * json.load(open('$OUT/capacity.json'))['summary']['request_throughput_req_s'], 4))")
  echo "== $name: load $load, $rate req/s ($(date -u +%H:%M:%S))"
  pin bench live "${WL[@]}" --rate "$rate" --workload-seed "$seed" "$@" --trace "$OUT/$name.jsonl" --json "$OUT/$name.json" | tail -n 3
}
for stage in "$@"; do
  case "$stage" in
    runs) [ -f "$OUT/capacity.json" ] || pin bench live "${WL[@]}" --rate 100000 --workload-seed 9 "${ON[@]}" --json "$OUT/capacity.json" | tail -n 2
          run on_r1 0.7 1 "${ON[@]}"            # the fit run
          run on_r2 0.5 2 "${ON[@]}"            # held out: another workload at another load
          run off_r2 0.5 2 "${OFF[@]}"          # held out: chunking off (the what-if's live run)
          run on_r2b 0.5 2 "${ON[@]}" ;;        # on_r2 again: the machine's own run-to-run difference
    more) run on_r3 0.9 3 "${ON[@]}"
          run off_r3 0.9 3 "${OFF[@]}" ;;
    profile) pin profile --device cpu ${MODEL:-} --max-model-len 2048 --max-prefill 2047 --time-limit "${PROFILE_S:-150}" \
               --no-progress --out "$OUT/prof.jsonl" | tail -n 3 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
