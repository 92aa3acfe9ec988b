#!/usr/bin/env bash
# GPU kernel run, one call on the device machine: correctness matrix, config sweep, decode microbench.
#   OUT=out/gpu_kernels scripts/gpu_kernels.sh [tests] [tune] [bench]     (default: all three)
# Each step has a time cap (TESTS_S, TUNE_S, BENCH_S seconds) so one slow step can't eat the call;
# PYTEST_K selects tests, TUNE_SECTIONS the sweeps (configs prefill splits).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_kernels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests tune bench)

{ date -u +%FT%TZ; python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; \
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$OUT/versions.txt"

for step in "${steps[@]}"; do
  start=$(date +%s)
  case $step in
    tests)
      timeout "${TESTS_S:-150}" python3 -m pytest tests/test_kernels_gpu.py -m gpu -q --noconftest \
        -p no:cacheprovider --tb=short --maxfail=25 ${PYTEST_K:+-k "$PYTEST_K"} >"$OUT/pytest.log" 2>&1
      echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -30 ;;
    tune)
      timeout "${TUNE_S:-90}" python3 -m runtime.bench.kernel_tune ${TUNE_SECTIONS:+--sections $TUNE_SECTIONS} --json "$OUT/tune.json" | tee "$OUT/tune.txt" ;;
    bench)
      timeout "${BENCH_S:-90}" python3 -m runtime.bench.decode_kernel_bench --json "$OUT/decode_bench.json" \
        | tee "$OUT/decode_bench.txt" ;;
  esac
  echo "[$step: $(( $(date +%s) - start )) s]"
done
