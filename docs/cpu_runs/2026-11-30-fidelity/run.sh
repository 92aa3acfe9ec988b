set -e
F=/tmp/cpuf2
L="taskset -c 1 env OMP_NUM_THREADS=1 python -m runtime bench live --synthetic 30 --input-len uniform:64:1024 --output-len uniform:32:96 --no-progress"
$L --rate 0.45 --workload-seed 2 --no-enable-chunked-prefill --max-num-batched-tokens 2048 --trace $F/off_r2.jsonl > $F/off_r2.txt 2>&1
$L --rate 0.45 --workload-seed 3 --max-num-batched-tokens 128 --trace $F/on_r3.jsonl > $F/on_r3.txt 2>&1
$L --rate 0.45 --workload-seed 3 --no-enable-chunked-prefill --max-num-batched-tokens 2048 --trace $F/off_r3.jsonl > $F/off_r3.txt 2>&1
echo done
