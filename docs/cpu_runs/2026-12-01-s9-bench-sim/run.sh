#!/bin/bash
# bench sim of today's code, 3 rounds, each run pinned to core 0 (core 1 ran mutmut meanwhile),
# the shipped tree model and the linear model of dab54d5 (git show dab54d5:simulator/cost_models/qwen3-0.6b-h200.json)
D=docs/cpu_runs/2026-12-01-s9-bench-sim
for r in 1 2 3; do
  for model in qwen3-0.6b-h200 /tmp/s8/linear.json; do
    tag=$(basename $model .json)
    taskset -c 0 python -m runtime bench sim --cost-model $model --no-progress --out-dir /tmp/s9_bs --json $D/${tag}_r$r.json > /dev/null 2>&1
    python3 -c "
import json; d=json.load(open('$D/${tag}_r$r.json'))
print('r$r $tag', ' '.join(f\"{x['name']}: {x['speedup']:.1f}x wall {x['cpu_speedup']:.1f}x cpu {x['us_per_step']:.1f}us\" for x in d['results']))"
  done
done
