#!/usr/bin/env bash
# Issue #18 part 4 in one device call: whole-model steps of real models, then kernel rows.
#
# Here, first (no device time):
#   make gpu-wheels                     # cp312 wheels the device image lacks, into .whl/
#   make gpu-predict                    # docs/gpu-steps/predicted.json, if the bundle changed
# Then one `run` of the device tool (carry [".whl"], timeout_s 600):
#   GPUPLAN_COMMIT=$(git rev-parse HEAD) bash hack/gpu_campaign.sh
# The machine has torch, transformers, torchvision, onnx, onnxruntime and nvidia-ml-py; the
# checkout travels without .git, so the commit comes in GPUPLAN_COMMIT. Everything lands in
# $OUT: nvidia-smi.txt, steps.jsonl (+ .log), bench.parquet with its JSON sidecar (+ .log).
# Then, here: copy them to docs/gpu-steps/<date>-<gpu>/ and
#   python -m gpuplan_estimator.evaluation.model_step_scoring score \
#       --predicted docs/gpu-steps/predicted.json --measured docs/gpu-steps/<run>/steps.jsonl
# The model steps run first: they are the labels; the bench gets the minutes left.
set -uo pipefail
: "${OUT:?run this through the device tool: results go to \$OUT}"
STEPS_BUDGET_S=${STEPS_BUDGET_S:-300}
BENCH_MINUTES=${BENCH_MINUTES:-3}
BENCH_SAMPLES=${BENCH_SAMPLES:-3000}
DEVICE=${CAMPAIGN_DEVICE:-cuda}  # cpu, with CAMPAIGN_CASES=smoke, rehearses the script here
CASES=${CAMPAIGN_CASES:-full}
export PYTHONPATH="$PWD/estimator" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1
python3 -m gpuplan_estimator.evaluation.model_steps --device "$DEVICE" --cases "$CASES" \
  --out "$OUT/steps.jsonl" --budget-s "$STEPS_BUDGET_S" --commit "${GPUPLAN_COMMIT:-}" 2>&1 | tee "$OUT/steps.log"
steps=${PIPESTATUS[0]}
python3 -m gpuplan_estimator.interfaces.cli bench --device "$DEVICE" --backend torch \
  --samples "$BENCH_SAMPLES" --budget-minutes "$BENCH_MINUTES" --db "sqlite:////tmp/bench.db" \
  --export "$OUT/bench.parquet" 2>&1 | tail -200 >"$OUT/bench.log"
bench=${PIPESTATUS[0]}
echo "model steps exit $steps, bench exit $bench (3: resumable, budget spent)"
