#!/bin/bash
# A/B: after ($A, default /work/main) then before (/work/base8 = 8e52e90), alternating, each pinned to core 1
A=${A:-main}; B=${B:-base8}; TAG=${TAG:-ab}
for r in 1 2 3; do
  for model in qwen3-0.6b-h200 /tmp/s8/linear.json; do
    tag=$(basename $model .json)
    for code in $A $B; do
      (cd /work/$code && PYTHONPATH=/work/$code taskset -c 1 python -m runtime bench sim --cost-model $model --no-progress \
        --out-dir /tmp/s8/ab_out_$code --json /tmp/s8/${TAG}_${code}_${tag}_r$r.json > /dev/null 2>&1)
      python3 -c "
import json; d=json.load(open('/tmp/s8/${TAG}_${code}_${tag}_r$r.json'))
print('r$r $tag $code', ' '.join(f\"{x['name']}: {x['speedup']:.1f}x wall {x['cpu_speedup']:.1f}x cpu {x['us_per_step']:.1f}us\" for x in d['results']))"
    done
    cmp /tmp/s8/ab_out_$A/sim_chunked_on.jsonl /tmp/s8/ab_out_$B/sim_chunked_on.jsonl && cmp /tmp/s8/ab_out_$A/sim_chunked_off.jsonl /tmp/s8/ab_out_$B/sim_chunked_off.jsonl && echo "r$r $tag logs identical"
  done
done
