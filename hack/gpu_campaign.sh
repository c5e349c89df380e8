#!/usr/bin/env bash
# The one prepared run for a lent GPU (issue #30 part 7), <= 10 minutes in one device call.
#
# Here, first (no device time):
#   make gpu-wheels                     # cp312 wheels the device image lacks, into .whl/
#   make gpu-predict                    # docs/gpu-steps/predicted*.json, if the bundle changed
# Then one `run` of the device tool (carry [".whl"], timeout_s 590):
#   GPUPLAN_COMMIT=$(git rev-parse HEAD) bash hack/gpu_campaign.sh
# The machine has torch, transformers, torchvision, onnx, onnxruntime and nvidia-ml-py; the
# checkout travels without .git, so the commit comes in GPUPLAN_COMMIT. Everything lands in $OUT:
#   nvidia-smi.txt       the machine
#   host-probe.json      the host probe (bench.host_probe): per-op issue costs of this node's CPU
#   steps.jsonl          the 51 first whole-model cases (eager; host and device time per phase,
#                        kernels and memory per phase of one instrumented step)
#   steps-large.jsonl    GPT-2 large and a 1B Llama-shaped model at sequence 2048 (fused SDPA)
#   bench.parquet/.json  fp32/tf32/bf16 kernel rows (fast batched bench)
#   extras.tar           steps-compiled.jsonl: torch.compile steps of three models in bf16;
#                        bench-eager.parquet/.json: a sample of gemm/conv2d/elementwise rows
#                        timed with events around plain eager calls (as a model step issues
#                        them) beside the graph-replayed bench, to learn the offset (#30)
#   campaign.log         every stage's output, in order
# Every stage has its own budget and a hard `timeout`, so one stage can't eat the others'.
# The device tool brings back at most 8 files from $OUT: every stage's output goes to one
# campaign.log and the smaller outputs go into extras.tar, so the run writes 8 (nvidia-smi.txt,
# host-probe.json, steps.jsonl, steps-large.jsonl, bench.parquet, bench.json, extras.tar,
# campaign.log).
# Then, here: copy them to docs/gpu-steps/<date>-<gpu>/ and score (docs/gpu-steps/README.md).
set -uo pipefail
: "${OUT:?run this through the device tool: results go to \$OUT}"
STEPS_BUDGET_S=${STEPS_BUDGET_S:-170}
LARGE_BUDGET_S=${LARGE_BUDGET_S:-65}
BENCH_MINUTES=${BENCH_MINUTES:-2}
COMPILED_BUDGET_S=${COMPILED_BUDGET_S:-45}
EAGER_BENCH_MINUTES=${EAGER_BENCH_MINUTES:-1}
DEVICE=${CAMPAIGN_DEVICE:-cuda}  # cpu, with CAMPAIGN_CASES=smoke, rehearses the script here
CASES=${CAMPAIGN_CASES:-full}
LARGE=${CAMPAIGN_LARGE:-large}
COMMIT=${GPUPLAN_COMMIT:-}
export PYTHONPATH="$PWD/estimator" PYTHONUNBUFFERED=1
started=$(date +%s)
LOG="$OUT/campaign.log"
stage() { echo "[campaign] $(( $(date +%s) - started )) s: $*" | tee -a "$LOG"; }
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1
STEPS=(python3 -m gpuplan_estimator.evaluation.model_steps --device "$DEVICE" --commit "$COMMIT")

stage "host probe"
timeout -k 5 60 python3 -m gpuplan_estimator.bench.host_probe --device "$DEVICE" \
  --out "$OUT/host-probe.json" --commit "$COMMIT" >>"$LOG" 2>&1
probe=$?

stage "model steps ($CASES)"
timeout -k 10 $((STEPS_BUDGET_S + 60)) "${STEPS[@]}" --cases "$CASES" --warmup 2 --repeats 6 \
  --budget-s "$STEPS_BUDGET_S" --out "$OUT/steps.jsonl" >>"$LOG" 2>&1
steps=$?

stage "model steps ($LARGE)"
timeout -k 10 $((LARGE_BUDGET_S + 60)) "${STEPS[@]}" --cases "$LARGE" --warmup 2 --repeats 4 \
  --budget-s "$LARGE_BUDGET_S" --out "$OUT/steps-large.jsonl" >>"$LOG" 2>&1
large=$?

stage "kernel bench"
timeout -k 10 $((BENCH_MINUTES * 60 + 30)) python3 -m gpuplan_estimator.interfaces.cli bench \
  --device "$DEVICE" --backend torch --budget-minutes "$BENCH_MINUTES" \
  --precisions fp32,tf32,bf16 --batch-size "${BENCH_BATCH:-32}" --samples "${BENCH_SAMPLES:-20000}" \
  --db "sqlite:////tmp/bench.db" --export "$OUT/bench.parquet" ${COMMIT:+--commit "$COMMIT"} \
  --no-progress --no-host-probe ${BENCH_ARGS:-} >>"$LOG" 2>&1
bench=$?

stage "eager kernel bench"
EXTRAS="$OUT/extras"
mkdir -p "$EXTRAS"
timeout -k 10 $((EAGER_BENCH_MINUTES * 60 + 30)) python3 -m gpuplan_estimator.interfaces.cli \
  bench --device "$DEVICE" --backend torch --budget-minutes "$EAGER_BENCH_MINUTES" \
  --families gemm,conv2d,elementwise --precisions fp32,tf32,bf16 --timing events \
  --batch-size "${BENCH_BATCH:-32}" --samples "${EAGER_BENCH_SAMPLES:-3000}" --seed 1 \
  --db "sqlite:////tmp/bench-eager.db" --export "$EXTRAS/bench-eager.parquet" \
  ${COMMIT:+--commit "$COMMIT"} --no-progress --no-host-probe >>"$LOG" 2>&1
eager=$?

stage "compiled steps"
COMPILED_MODELS=${COMPILED_MODELS:-gpt2-small,bert-base,resnet50}
[ "$CASES" = smoke ] && COMPILED_MODELS=gpt2-tiny
timeout -k 10 $((COMPILED_BUDGET_S + 60)) "${STEPS[@]}" --cases "$CASES" --framework compiled \
  --models "$COMPILED_MODELS" --precisions bf16 --warmup 3 --repeats 5 \
  --budget-s "$COMPILED_BUDGET_S" --out "$EXTRAS/steps-compiled.jsonl" \
  >>"$LOG" 2>&1
compiled=$?
tar -C "$EXTRAS" -cf "$OUT/extras.tar" . && rm -rf "$EXTRAS"

stage "done"
echo "exit codes: probe $probe, steps $steps, large $large, bench $bench, eager bench $eager," \
  "compiled $compiled" \
  "(124: timed out; bench 5: its budget ended)" | tee -a "$LOG"
ls "$OUT" | wc -l | xargs echo "files in \$OUT (the tool returns at most 8):"
tail -n 20 "$LOG"
