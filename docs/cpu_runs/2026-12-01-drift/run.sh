set -e
F=${F:-/tmp/cpu6}; mkdir -p $F
L="taskset -c 1 env OMP_NUM_THREADS=1 python -m runtime bench live --synthetic 30 --input-len uniform:64:1024 --output-len uniform:32:96 --no-progress"
$L --rate 0.45 --workload-seed 2 --max-num-batched-tokens 128 --trace $F/on_r2.jsonl > $F/on_r2.txt 2>&1
$L --rate 0.45 --workload-seed 2 --no-enable-chunked-prefill --max-num-batched-tokens 2048 --trace $F/off_r2.jsonl > $F/off_r2.txt 2>&1
$L --rate 0.6 --workload-seed 1 --max-num-batched-tokens 128 --trace $F/on_r1.jsonl > $F/on_r1.txt 2>&1
taskset -c 1 env OMP_NUM_THREADS=1 python -m runtime profile --device cpu --max-model-len 2048 --max-prefill 2047 --time-limit 240 --out $F/prof.jsonl > $F/prof.txt 2>&1
