#!/bin/bash
# A/B: after (/work/main) then before (/work/base7 = a954854), alternating, each pinned to core 1
for r in 1 2 3; do
  for model in qwen3-0.6b-h200 /tmp/s7/linear.json; do
    tag=$(basename $model .json)
    for code in main base7; do
      (cd /work/$code && PYTHONPATH=/work/$code taskset -c 1 python -m runtime bench sim --cost-model $model --no-progress \
        --out-dir /tmp/s7/ab_out_$code --json /tmp/s7/ab2_${code}_${tag}_r$r.json > /dev/null 2>&1)
      python3 -c "
import json; d=json.load(open('/tmp/s7/ab2_${code}_${tag}_r$r.json'))
print('r$r $tag $code', ' '.join(f\"{x['name']}: {x['speedup']:.1f}x wall {x['cpu_speedup']:.1f}x cpu {x['us_per_step']:.1f}us\" for x in d['results']))"
    done
    cmp /tmp/s7/ab_out_main/sim_chunked_on.jsonl /tmp/s7/ab_out_base7/sim_chunked_on.jsonl && cmp /tmp/s7/ab_out_main/sim_chunked_off.jsonl /tmp/s7/ab_out_base7/sim_chunked_off.jsonl && echo "r$r $tag logs identical"
  done
done
