#!/usr/bin/env bash
# GPU stages, run on a CUDA machine from the repo root: scripts/gpu_run.sh STAGE...
#   tests      pytest -m gpu (kernel matrix, model equality fp32/bf16, CUDA graphs, GPU sampling)
#   stepprof   bench profile (per-phase step breakdown) on both shapes (bf16)
#   quick      bench throughput (no peers) on both shapes, and SmolLM2 again without async scheduling
#   budget     bench throughput (no peers) on both shapes with a 16,384-token step budget (nano-vllm's and
#              vLLM's offline default; ours is 2,048)
#   qwen3      bench throughput vs HF (continuous batching + static batches of 64), Qwen3-0.6B shapes,
#              16,384-token step budget
#   smollm2    the same on SmolLM2-135M shapes
#   costmodel  minivllm profile: step-shape sweep + fitted H200 cost model
#   kernel     bench decode-kernel
#   probe      torch-profiler table of one 2048-token prefill step
#   launch     scripts/launch_probe.py: the host's launch of a prefill step while a decode step runs, by
#              prompt size (what holds a decode step back before a prefill; simulator/cost/launch.py)
#   launchload the same probe at 256 and 1,024 tokens, greedy and sampled (temperature 1), alone and with half the
#              cores spinning in other processes: what moves a served engine's launch past the profile's
#   (Qwen3-0.6B shapes are served with .gpu/tokenizer_152k: SmolLM2's tokenizer widened to the shape's 151,936
#   ids, so every sampled id decodes to text and streams a chunk; SmolLM2 shapes with .gpu/tokenizer)
#   serve      the OpenAI server on Qwen3-0.6B shapes (random weights):
#              bench serve of 800 Azure conv requests (arrivals 6x compressed), 3 s idle, a second burst;
#              then bench live (the same 800 in process); .gpu/ holds the tokenizer and the trace slice
#              (scripts/gpu_wheels.sh makes it) and goes to the GPU machine with the tree
#   matrix     minivllm bench matrix: capacity in process, then bench serve (--launch) and bench live at
#              LOADS (default 0.5,0.8,1.1 of capacity) x CHUNKED (default on,off); served logs gzipped into
#              $OUT (8 files for one CHUNKED mode); WORKLOAD=conv|code (.gpu/*_head1200.csv,
#              Azure 2023), SKIP_LIVE=1: no in-process run beside each served one; MATRIX_MODEL (default
#              random:qwen3-0.6b; or random:smollm2-135m); ENGINE_FLAGS: more server flags (e.g. --api-server-count 4);
#              MATRIX_S: stop the matrix after that many seconds and keep the logs of the runs it finished
#   prefix     shared-prefix workload (a 7,680-token document, 40 questions of 64 tokens, 2/s) against the
#              server with prefix caching off (every request cold) and on (the first cold, the rest warm)
#   servetests the served engine on CUDA under load: aborts mid-step, SIGTERM, bad requests (also in tests)
#   sampled    the GPU sampling tests (the sorting-free kernel and the torch sampler: statistics, same tokens,
#              the sampling fuzz through the server), the sampling micro-benchmark, then bench throughput greedy
#              beside sampled (temperature 0.8, top-p 0.95) on both shapes, 16,384-token step budget, with the
#              kernel and again with the torch sampler (--sampler torch)
#   fleet      serve --data-parallel-size N behind one front door (the replicas share the GPU's memory) under
#              bench serve of 800 Azure conv requests: FLEET_CONFIGS of REPLICAS:ROUTER:RATE_SCALE; the fleet
#              logs (fleet log + one per replica) come back in fleet_runs.tgz, for minivllm fidelity FLEET_LOG
#   hfserve    scripts/gpu_hf_serve.sh: HF transformers' own server (continuous batching) under bench serve
#   mcprofile  minivllm profile --for the Mooncake synthetic trace (.gpu/mooncake_40k.jsonl: its requests that
#              fit Qwen3-0.6B's 40,960 positions; scripts/gpu_wheels.sh makes it): step shapes to 40k-token
#              prompts, PROFILE_S seconds (default 150); the sweep and front-door logs gzipped into $OUT (fit them
#              on any machine)
#   mcserve    bench serve --launch of that trace's first LIMIT (default 120) requests at RATE_SCALE (default
#              0.7), MC_RUNS times (default 2: the live spread; numbered from MC_FIRST, default 1) for each chunked
#              mode of MC_CHUNKED (default on; on,off both), --max-model-len 40960; served logs into $OUT
#              (mooncake_serve_MODE_I); BENCH_FLAGS: more bench serve flags (e.g. --text-prompts .gpu/tokenizer_152k)
#   stream     the front end under heavy streaming (SmolLM2-135M shapes): STREAM_N (default 1500) requests of
#              128 prompt + 1,000 output tokens at STREAM_RATE (default 60) req/s, 8 client processes; then
#              40k-token prompts (a shared 39,936-token prefix, cached) at 60 req/s on Qwen3-0.6B shapes;
#              ENGINE_FLAGS: more server flags (e.g. --api-server-count 4)
#   spec       speculative decoding: the GPU tests (greedy equal to plain and HF with Triton + CUDA graphs,
#              sampled equal to plain), then bench spec on both shapes with a drafter of controlled
#              acceptance (0, 0.5, 0.8, 1), single stream and batch 8, greedy, 256 tokens
#   specsim    the simulator against live speculative decoding: minivllm profile (SmolLM2 shape, PASSES passes,
#              default 1, 150 s each at most), then bench spec
#              with the fitted model (--cost-model), the drafter of controlled acceptance, REPEATS (default 5)
#              interleaved repeats of SPEC_TOKENS output tokens (default 256; up to 896 stays inside the
#              profile's 1,024 contexts); the profile log, the model, the JSON and every run's log come back in $OUT
#   predict    the simulator's prediction from a profile alone, on this machine: minivllm profile of the engine
#              the matrix serves (PRED_MODEL, default random:qwen3-0.6b; --max-model-len PRED_LEN, default 8192;
#              the profile's own defaults otherwise, its front-door probe included; PRED_FOR: --for that workload,
#              e.g. .gpu/mooncake_40k.jsonl with PRED_LEN=40960), its logs and fitted model
#              into $OUT; then run the stage
#              matrix (SKIP_LIVE=1) on the same machine and minivllm fidelity-table the served logs with that model;
#              CO_LOCATED=K: the profile also runs K engines on the GPU together (--co-located K: what sharing the
#              device costs a step, for the fleet stage's replicas on one GPU; CO_LOCATED_S: their seconds together)
#   sessions   closed-loop conversations (minivllm workload sessions: SESSIONS_N, default 400, starting at
#              SESSIONS_RATE, default 8, a second; think time 2 s; prompts extend the last turn) served by bench
#              serve --launch, which sends a turn when the previous answer has arrived; SESSIONS_RUNS times (default
#              2: the spread); the workload, the served logs and the client JSON into $OUT
#   idle       the conv replay (RATE_SCALE, default 6) on Qwen3-0.6B shapes, alone and then beside IDLE_N (default 500)
#              idle and IDLE_N trickling connections (bench serve --idle-connections / --trickling-connections): what
#              they cost a normal request, and when the server closed them (serve's default timeouts)
#   dpkill     serve --data-parallel-size 2 on the one GPU under the conv replay (RATE_SCALE, default 8); KILL_AT s
#              (default 10) into the replay, kill -9 one replica's engine: the client's errors by replica, the
#              fleet log's outage line (minivllm analyze), and the logs' requests against the client's
#   machine    which machine this is (GPU UUID, host), for runs compared across machines
#   bundle     pack everything in $OUT into $OUT/bundle.tar.part_* of at most 9 MiB each (put it last: a
#              transfer that takes few, small files); cat bundle.tar.part_* | tar xf - unpacks it. It adds the
#              GPU's clocks, power and temperature each second of the stages run before (gpu_clocks.csv) and when
#              each stage began (gpu_stages.txt): did a live run slower than its profile run on a slower chip?
# The packages the machine lacks travel as wheels in .whl/: run scripts/gpu_wheels.sh here first and
# copy .whl to the GPU machine with the tree.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then  # installed once per machine and set of wheels (a later call finds them)
  wheels=$(md5sum .whl/*.whl | md5sum)
  if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --find-links .whl --no-deps --no-cache-dir --target /tmp/site \
      $(ls .whl | sed -E 's/-[0-9].*//' | sort -u) || exit 1
    echo "$wheels" > /tmp/site/.wheels
  fi
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
# bytecode written and kept: each served run starts ~6 kinds of Python process (server, engine, front ends,
# intake workers, client), and one that compiles torch's and transformers' sources takes seconds
unset PYTHONDONTWRITEBYTECODE
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
minivllm() { python3 -m runtime "$@"; }
CLOCKS=/tmp/gpu_clocks.csv STAGES=/tmp/gpu_stages.txt  # (UTC both; each call of this script appends)
FIELDS=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active
if command -v nvidia-smi >/dev/null 2>&1; then  # sampled while this script runs (the bundle stage packs them)
  nvidia-smi --query-gpu="$FIELDS" --format=csv >/dev/null 2>&1 || FIELDS=${FIELDS%,*}  # (an older driver)
  [ -e "$CLOCKS" ] || echo "$FIELDS" > "$CLOCKS"
  TZ=UTC nvidia-smi --query-gpu="$FIELDS" --format=csv,noheader,nounits -lms 1000 >> "$CLOCKS" 2>>"$CLOCKS.err" &
  clocks=$!
  trap 'kill $clocks 2>/dev/null' EXIT
fi
tokenizer_for() { case "$1" in *qwen3*) echo .gpu/tokenizer_152k ;; *) echo .gpu/tokenizer ;; esac; }
WL=(--num-prompts 256 --input-len 100 1024 --output-len 512 512 --device cuda --dtype bfloat16 --no-progress)
status=0
for stage in "$@"; do
  echo "=== $stage ($(date -u +%H:%M:%S))"
  echo "$(date -u '+%Y/%m/%d %H:%M:%S') $stage" >> "$STAGES"
  case "$stage" in
    tests) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_gpu.py tests/test_model_gpu.py \
             tests/test_sampling_gpu.py tests/test_sampling_staging.py tests/test_fused_norm_rope_gpu.py \
             tests/test_serving_under_load.py 2>&1 | tail -n 40 ;;
    servetests) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_serving_under_load.py 2>&1 | tail -n 40 ;;
    sampled) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_sampling_gpu.py tests/test_server_sampling_fuzz.py \
               2>&1 | tail -n 40
             python3 -m runtime.bench.sampling_bench --device cuda --batch 64 256 --vocab 49152 151936
             for shape in qwen3-0.6b smollm2-135m; do
               for sampler in triton torch; do
                 minivllm bench throughput --model-shape $shape "${WL[@]}" --peer none --max-num-batched-tokens 16384 \
                   --temperature 0.8 --top-p 0.95 --sampler $sampler --json "$OUT/tp_${shape%%-*}_sampled_$sampler.json"
               done
             done ;;
    stepprof) minivllm bench profile --model-shape qwen3-0.6b "${WL[@]}" --json "$OUT/profile_qwen3.json"
              minivllm bench profile --model-shape smollm2-135m "${WL[@]}" --json "$OUT/profile_smollm2.json" ;;
    quick) minivllm bench throughput --model-shape qwen3-0.6b "${WL[@]}" --peer none --json "$OUT/tp_qwen3_quick.json"
           minivllm bench throughput --model-shape smollm2-135m "${WL[@]}" --peer none --json "$OUT/tp_smollm2_quick.json"
           minivllm bench throughput --model-shape smollm2-135m "${WL[@]}" --peer none --no-async-scheduling \
             --json "$OUT/tp_smollm2_sync.json" ;;
    budget) for shape in qwen3-0.6b smollm2-135m; do
              minivllm bench throughput --model-shape $shape "${WL[@]}" --peer none --max-num-batched-tokens 16384 \
                --json "$OUT/tp_${shape%%-*}_16k.json"; done ;;
    qwen3) minivllm bench throughput --model-shape qwen3-0.6b "${WL[@]}" --hf-peers cb,static --static-batch 64 \
             --max-num-batched-tokens 16384 --json "$OUT/tp_qwen3.json" ;;
    smollm2) minivllm bench throughput --model-shape smollm2-135m "${WL[@]}" --hf-peers cb,static --static-batch 64 \
               --max-num-batched-tokens 16384 --json "$OUT/tp_smollm2.json" ;;
    costmodel) minivllm profile --model random:qwen3-0.6b --device cuda --dtype bfloat16 --max-model-len 8192 --out "$OUT/profile_h200.jsonl" \
                 --fit "$OUT/qwen3-0.6b-h200.json" ;;
    kernel) minivllm bench decode-kernel --json "$OUT/decode_kernel.json" ;;
    probe) python3 -m runtime.bench.prefill_probe ;;
    launch) python3 scripts/launch_probe.py --json "$OUT/launch_probe.json" --trace "${TRACE_TOKENS:-8000}" ;;
    launchload) for busy in ${BUSY:-0 $(( ($(nproc) + 1) / 2 ))}; do
                  for t in 0 1; do
                    echo "temperature $t, $busy processes spinning"
                    python3 scripts/launch_probe.py --sizes 256,1024 --repeats 5 --decodes 16 --temperature $t \
                      --busy "$busy" --json "$OUT/launch_t${t}_busy${busy}.json"
                  done
                done ;;
    serve) # ENGINE_FLAGS: both the server and bench live (e.g. chunked off); SERVE_FLAGS: the server only
           SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16
                --max-model-len 8192 ${ENGINE_FLAGS:-})
           BS=(.gpu/conv_head1200.csv --rate-scale "${RATE_SCALE:-6}" --slo ttft_ms=1000,tpot_ms=50 --no-progress)
           python3 -m runtime serve "${SRV[@]}" ${SERVE_FLAGS:-} --port 8011 --trace "$OUT/serve_live.jsonl" > "$OUT/server.log" 2>&1 &
           pid=$!
           python3 -c "import time, httpx
for _ in range(900):
    try:
        if httpx.get('http://127.0.0.1:8011/ready', timeout=2).status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.5)"
           minivllm bench serve "${BS[@]}" --limit 800 --url http://127.0.0.1:8011/v1 --json "$OUT/serve_burst1.json"
           sleep 3
           minivllm bench serve "${BS[@]}" --limit 200 --workload-seed 1 --url http://127.0.0.1:8011/v1 \
             --json "$OUT/serve_burst2.json"
           python3 -c "import httpx; print('\n'.join(l for l in httpx.get('http://127.0.0.1:8011/metrics').text.splitlines()
                         if l.startswith(('minivllm_jit', 'minivllm_engine_'))))"
           kill -TERM $pid; wait $pid; echo "server exit status $?"; tail -n 5 "$OUT/server.log"
           minivllm analyze "$OUT/serve_live.jsonl" 2>&1 | head -n 30
           python3 -m runtime.bench.step_times "$OUT/serve_live.jsonl"
           [ -n "${SKIP_LIVE:-}" ] && continue
           minivllm bench live .gpu/conv_head1200.csv --limit 800 --rate-scale "${RATE_SCALE:-6}" "${SRV[@]}" --no-progress \
             --trace "$OUT/live_inproc.jsonl" --json "$OUT/live_inproc.json"
           python3 -m runtime.bench.step_times "$OUT/live_inproc.jsonl" ;;
    matrix) WORKLOAD="${WORKLOAD:-conv}"
            rm -rf /tmp/matrix  # (a call cut short on this machine may have left its runs)
            timeout -k 30 "${MATRIX_S:-0}" python3 -m runtime bench matrix ".gpu/${WORKLOAD}_head1200.csv" --limit "${LIMIT:-800}" --loads "${LOADS:-0.5,0.8,1.1}" \
              --chunked "${CHUNKED:-on,off}" ${CAPACITY:+--capacity $CAPACITY} --client-processes "${CLIENT_PROCS:-4}" \
              ${SKIP_LIVE:+--no-live} --out /tmp/matrix --launch \
              --model "${MATRIX_MODEL:-random:qwen3-0.6b}" --tokenizer "$(tokenizer_for "${MATRIX_MODEL:-qwen3}")" --device cuda --dtype bfloat16 \
              --max-model-len 8192 ${ENGINE_FLAGS:-} &
            group=$!  # timeout leads a process group of its own: its server ends too (within a minute, or killed)
            wait $group
            for _ in $(seq 60); do kill -0 -- -$group 2>/dev/null || break; sleep 1; done
            kill -9 -- -$group 2>/dev/null
            tag=${WORKLOAD}_$(echo "${CHUNKED:-on,off}" | tr , _)  # no commas in file names
            [ -e /tmp/matrix/summary.json ] && cp /tmp/matrix/summary.json "$OUT/matrix_$tag.json"
            for f in /tmp/matrix/serve_*.json; do  # a run with its summary written finished; its log is whole
              [ -e "$f" ] || continue
              gzip -c "${f}l" > "$OUT/${WORKLOAD}_$(basename "$f")l.gz"
            done
            tar czf "$OUT/matrix_${tag}_runs.tgz" -C /tmp/matrix $(cd /tmp/matrix && ls *.json *.log)
            rm -rf /tmp/matrix; ls -la "$OUT" ;;
    prefix) SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 8192)
            for pc in off on; do
              minivllm bench serve --synthetic 40 --rate 2 --input-len fixed:7744 --output-len fixed:32 \
                --shared-prefix 7680 --no-progress --json "$OUT/prefix_$pc.json" --server-trace /tmp/prefix_$pc.jsonl \
                --server-log /tmp/prefix_$pc.log --launch "${SRV[@]}" --prefix-caching $pc
            done
            python3 -c "import json, numpy as np
for pc in ('off', 'on'):
    t = [r['ttft'] * 1e3 for r in json.load(open('$OUT/prefix_%s.json' % pc))['requests']]
    print(f'prefix caching {pc}: first request TTFT {t[0]:.1f} ms, the other 39: p50 {np.median(t[1:]):.1f} ms, '
          f'p90 {np.percentile(t[1:], 90):.1f} ms')" ;;
    fleet) SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 8192)
           mkdir -p /tmp/fleet
           for cfg in ${FLEET_CONFIGS:-1:round-robin:8 2:round-robin:8 2:least-loaded:8 1:round-robin:14 2:round-robin:14 2:least-loaded:14}; do
             IFS=: read -r n router rs <<< "$cfg"
             name=dp${n}_${router}_x${rs}
             minivllm bench serve "${FLEET_TRACE:-.gpu/conv_head1200.csv}" --limit 800 --rate-scale "$rs" \
               --slo ttft_ms=1000,tpot_ms=50 --client-processes 4 --no-progress --json "/tmp/fleet/$name.json" \
               --server-trace "/tmp/fleet/$name.jsonl" --server-log "/tmp/fleet/$name.log" \
               --launch "${SRV[@]}" --data-parallel-size "$n" --router "$router" ${ENGINE_FLAGS:-} | tail -n 12
           done
           tar czf "$OUT/fleet_runs.tgz" -C /tmp/fleet .; ls -la /tmp/fleet ;;
    hfserve) OUT="$OUT" bash scripts/gpu_hf_serve.sh ;;
    mcprofile) minivllm profile --model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 \
                 --max-model-len 40960 --for .gpu/mooncake_40k.jsonl --time-limit "${PROFILE_S:-150}" --no-progress \
                 --out /tmp/profile_mooncake.jsonl
               gzip -c /tmp/profile_mooncake.jsonl > "$OUT/profile_mooncake.jsonl.gz"
               gzip -c /tmp/profile_mooncake.front_door.jsonl > "$OUT/profile_mooncake.front_door.jsonl.gz" ;;
    mcserve) MC_CHUNKED=${MC_CHUNKED:-on}
             SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 40960
                  ${ENGINE_FLAGS:-})
             for mode in ${MC_CHUNKED//,/ }; do  # e.g. MC_CHUNKED=on,off
               case "$mode" in on) flags=() ;; off) flags=(--no-enable-chunked-prefill) ;;
                 *) echo "MC_CHUNKED: on, off or on,off; got $mode"; exit 1 ;; esac
               for i in $(seq "${MC_FIRST:-1}" "$((${MC_FIRST:-1} + ${MC_RUNS:-2} - 1))"); do
                 tag=mooncake_serve_${mode}_$i
                 minivllm bench serve .gpu/mooncake_40k.jsonl --limit "${LIMIT:-120}" --rate-scale "${RATE_SCALE:-0.7}" \
                   --slo ttft_ms=2000,tpot_ms=50 --client-processes 4 --no-progress ${BENCH_FLAGS:-} --json "$OUT/$tag.json" \
                   --server-trace "/tmp/$tag.jsonl" --server-log "$OUT/${tag/serve/server}.log" \
                   --launch "${SRV[@]}" "${flags[@]}" | tail -n 14
                 gzip -c "/tmp/$tag.jsonl" > "$OUT/$tag.jsonl.gz"
               done
             done ;;
    stream) minivllm bench serve --synthetic "${STREAM_N:-1500}" --rate "${STREAM_RATE:-60}" --input-len fixed:128 \
              --output-len fixed:1000 --client-processes 8 --no-progress --json "$OUT/stream_smollm2.json" \
              --server-trace /tmp/stream.jsonl --server-log "$OUT/stream_server.log" --launch --model random:smollm2-135m \
              --tokenizer .gpu/tokenizer --device cuda --dtype bfloat16 --max-num-seqs 512 ${ENGINE_FLAGS:-}
            minivllm bench serve --synthetic "${LONG_N:-600}" --rate 60 --input-len fixed:40000 --output-len fixed:16 \
              --shared-prefix 39936 --client-processes 8 --no-progress --json "$OUT/stream_long_prompts.json" \
              --server-trace /tmp/long.jsonl --server-log "$OUT/long_server.log" --launch --model random:qwen3-0.6b \
              --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 40960 ${ENGINE_FLAGS:-} ;;
    spec) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_speculative_gpu.py 2>&1 | tail -n 20
          for shape in qwen3-0.6b smollm2-135m; do
            minivllm bench spec --model-shape $shape --tokenizer "$(tokenizer_for $shape)" --device cuda --dtype bfloat16 \
              --workload open --batch 1 8 --max-tokens 256 --acceptance 0,0.5,0.8,1 --json "$OUT/spec_${shape%%-*}.json"
          done ;;
    specsim) # the simulator against live speculative decoding: a profile of this machine, then bench spec's runs
             # re-simulated with the model fitted on it (SmolLM2 shape, the drafter of controlled acceptance)
             minivllm profile --model random:smollm2-135m --device cuda --dtype bfloat16 --max-batch 16 \
               --max-context 1024 --max-prefill 0 --passes "${PASSES:-1}" --time-limit $((150 * ${PASSES:-1})) \
               --out "$OUT/profile_smollm2.jsonl" --fit "$OUT/model_smollm2.json" --no-progress 2>&1 | tail -n 25
             minivllm bench spec --model-shape smollm2-135m --tokenizer .gpu/tokenizer --device cuda --dtype bfloat16 \
               --workload open --batch 1 8 --max-tokens "${SPEC_TOKENS:-256}" --acceptance 0,0.5,0.8,1 \
               --repeats "${REPEATS:-5}" --cost-model "$OUT/model_smollm2.json" --log-dir "$OUT/spec_logs" --json "$OUT/spec_sim_smollm2.json"
             tar czf "$OUT/spec_logs.tgz" -C "$OUT" spec_logs && rm -r "$OUT/spec_logs"
             gzip -f "$OUT/profile_smollm2.jsonl" ;;
    predict) minivllm profile --model "${PRED_MODEL:-random:qwen3-0.6b}" --tokenizer "$(tokenizer_for "${PRED_MODEL:-qwen3}")" \
               --device cuda --dtype bfloat16 --max-model-len "${PRED_LEN:-8192}" --passes "${PASSES:-1}" \
               ${PROFILE_S:+--time-limit $PROFILE_S} ${PRED_FOR:+--for $PRED_FOR} ${CO_LOCATED:+--co-located $CO_LOCATED} \
               ${CO_LOCATED_S:+--co-located-time $CO_LOCATED_S} --out /tmp/profile.jsonl \
               --fit "$OUT/model_profile.json" --no-progress 2>&1 | tail -n 30
             gzip -c /tmp/profile.jsonl > "$OUT/profile.jsonl.gz"
             for f in /tmp/profile.co_located*.jsonl; do [ -e "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
             gzip -c /tmp/profile.front_door.jsonl > "$OUT/profile.front_door.jsonl.gz" ;;
    sessions) minivllm workload sessions -n "${SESSIONS_N:-400}" --rate "${SESSIONS_RATE:-8}" --think-time 2 --seed 1 \
                --out "$OUT/sessions_workload.jsonl"
              for i in $(seq "${SESSIONS_RUNS:-2}"); do
                minivllm bench serve "$OUT/sessions_workload.jsonl" --client-processes 4 --no-progress \
                  --json "$OUT/sessions_serve_$i.json" --server-trace /tmp/sessions_$i.jsonl \
                  --server-log "$OUT/sessions_server_$i.log" --launch --model random:qwen3-0.6b \
                  --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 8192 ${ENGINE_FLAGS:-} | tail -n 14
                gzip -c /tmp/sessions_$i.jsonl > "$OUT/sessions_serve_$i.jsonl.gz"
              done ;;
    bundle) for f in "$CLOCKS" "$CLOCKS.err" "$STAGES"; do [ -s "$f" ] && cp "$f" "$OUT/"; done
            (cd "$OUT" || exit 1
             if ls bundle.tar.part_* >/dev/null 2>&1; then echo "bundle: $OUT already holds a bundle"; exit 1; fi
             mapfile -t files < <(ls -A)
             [ ${#files[@]} -gt 0 ] || exit 0
             tar cf - -- "${files[@]}" | split -b 9m - bundle.tar.part_ && rm -rf -- "${files[@]}" && ls -la) ;;
    idle) SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 8192)
          for held in 0 "${IDLE_N:-500}"; do
            minivllm bench serve .gpu/conv_head1200.csv --limit 800 --rate-scale "${RATE_SCALE:-6}" --client-processes 4 \
              --idle-connections "$held" --trickling-connections "$held" --no-progress --json "$OUT/idle_$held.json" \
              --server-trace /tmp/idle_$held.jsonl --server-log "$OUT/idle_server_$held.log" --launch "${SRV[@]}" | tail -n 14
          done ;;
    dpkill) SRV=(--model random:qwen3-0.6b --tokenizer .gpu/tokenizer_152k --device cuda --dtype bfloat16 --max-model-len 8192)
            rm -rf /tmp/dpkill; mkdir -p /tmp/dpkill
            minivllm bench serve .gpu/conv_head1200.csv --limit 800 --rate-scale "${RATE_SCALE:-8}" --client-processes 4 \
              --no-progress --json "$OUT/dpkill.json" --server-trace /tmp/dpkill/fleet.jsonl \
              --server-log "$OUT/dpkill_server.log" --launch "${SRV[@]}" --data-parallel-size 2 > "$OUT/dpkill_bench.txt" 2>&1 &
            bench=$!
            until grep -q '^replaying' "$OUT/dpkill_bench.txt" || ! kill -0 $bench 2>/dev/null; do sleep 0.2; done
            sleep "${KILL_AT:-10}"
            victim=$(pgrep -x minivllm-engine | head -n 1)
            echo "kill -9 engine process $victim at $(date -u +%H:%M:%S.%N)"; kill -9 "$victim"
            wait $bench; echo "bench serve exit status $?"; tail -n 16 "$OUT/dpkill_bench.txt"
            minivllm analyze /tmp/dpkill/fleet.jsonl 2>&1 | grep -E '^outage|replica'
            python3 -c "import collections, json
rows = json.load(open('$OUT/dpkill.json'))['requests']
errs = collections.Counter((r['error'], (r.get('detail') or '')[:80]) for r in rows if r['error'])
print(f'{len(rows)} requests, {sum(errs.values())} failed:', dict(errs))"
            tar czf "$OUT/dpkill_logs.tgz" -C /tmp/dpkill . ;;
    machine) nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader; hostname; nproc ;;
    modeltests) python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_model_gpu.py tests/test_fused_norm_rope_gpu.py 2>&1 | tail -n 30 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac || status=1
done
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name())"
exit $status
