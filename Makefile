# gpuplan — developer entry points. `make help` lists them.
SHELL := /bin/bash
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install demo dist dist-check docs test unit integration loop-e2e lint verify crds openapi chart fuzz corpus chaos bench bench-extender bench-plans sched-compare test-gangs abuse abuse-full eval models plans-report memory-check parallel-check testbed testbed-build testbed-compat testbed-up testbed-down testbed-status chart kind-e2e clean gpu-wheels gpu-predict bench-rehearsal

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) (Python 3.11)"; exit 2; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(STAMP) ## create .venv and install gpuplan with its dev tools

demo: $(STAMP) ## estimate a shipped example model on every catalog GPU (no cluster)
	$(BIN)/gpuplan demo

dist: $(STAMP) ## wheel and sdist into dist/, checked to carry the shipped catalog and bundle
	$(PYTHON) hack/build_dist.py --out dist

dist-check: $(STAMP) ## make dist, then install the wheel from PyPI into an empty venv and run its `gpuplan demo`
	d=$$(mktemp -d) && $(PY) -m venv $$d/venv && \
	  $(PYTHON) hack/build_dist.py --out dist --install-check $$d/venv/bin/python && rm -rf $$d

test: $(STAMP) ## unit + integration tests (integration needs `make testbed-build`)
	$(BIN)/pytest -q tests

unit: $(STAMP) ## unit tests only
	$(BIN)/pytest -q tests/unit

integration: $(STAMP) ## integration tests on the local control plane
	$(BIN)/pytest -q -m integration tests

loop-e2e: $(STAMP) ## retraining loop on the testbed + PostgreSQL (node → bench → train → promoted → served) -> docs/loop-timeline.json
	GPUPLAN_LOOP_TIMELINE=docs/loop-timeline.json $(BIN)/pytest -q -s -p no:logging tests/integration/test_retraining_loop.py

lint: $(STAMP) ## ruff, mypy and the import contracts (.importlinter)
	$(BIN)/ruff check estimator operator tests hack testbed
	$(BIN)/mypy
	$(BIN)/lint-imports

corpus: $(STAMP) ## full-size real-model corpus: torchvision + HF models x exporters -> table (~15 min)
	PYTHONPATH=tests:hack $(PYTHON) -m campaigns.corpus --size full --workdir corpus-exports

fuzz: $(STAMP) ## 10^5 mutated ONNX graphs through load + estimate: no crash, < 20 s, < 4 GiB each
	PYTHONPATH=tests:hack $(PYTHON) -m campaigns.fuzz_graphs --inputs 100000 --crash-dir fuzz-crashers

chaos: $(STAMP) ## kill-safety campaign on a private testbed: 100 TrainingJobs, operator/estimator SIGKILLs, an apiserver restart; summary table
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.chaos --jobs 100

# What `gpuplan bench` needs beyond the lent GPU image (torch, transformers, onnx, onnxruntime,
# pandas, pyarrow, nvidia-ml-py are there), at this venv's versions, as CPython 3.12 wheels.
GPU_WHEELS := lightgbm sqlalchemy alembic mako greenlet pydantic pydantic_core annotated-types typing-inspection zstandard shtab
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_17 2_5,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64

gpu-wheels: $(STAMP) ## cp312 wheels hack/gpu_campaign.sh installs on a lent GPU machine, into .whl/
	$(BIN)/pip freeze | grep -iE '^($(subst $() ,|,$(GPU_WHEELS)))==' > .whl.txt
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(GPU_PLATFORMS) -d .whl -r .whl.txt && rm .whl.txt && ls .whl

# The batched kernel bench of issue #30 part 7: every float family in fp32/tf32/bf16, 16 items per
# batch, K calls per CUDA-graph launch, each family stopping once its held-out error does.
BATCHED_BENCH_ARGS := --backend torch --samples 6000 --precisions fp32,tf32,bf16 --batch-size 16 \
  --timing graph --stop-min-rows 400

bench-rehearsal: $(STAMP) ## the batched kernel bench on this CPU for 30 s: batching, stop rule, rows/min per family, export
	d=$$(mktemp -d); $(PYTHON) -m gpuplan_estimator.interfaces.cli bench --device cpu \
	  $(BATCHED_BENCH_ARGS) --budget-minutes 30s --db sqlite:///$$d/bench.db \
	  --export $$d/bench.parquet; code=$$?; echo "exit $$code (5: budget spent); files in $$d"; \
	  test $$code -eq 0 -o $$code -eq 5

gpu-predict: $(STAMP) ## the estimator's prices of the GPU campaign's cases on H100/H200, before measuring
	$(BIN)/gpuplan eval model-step-scoring predict --device h100-sxm-80gb \
	  --device h100-pcie-80gb --device h200-sxm-141gb --out docs/gpu-steps/predicted.json

# The benchmarked-GPU path (#30 part 6): a GPU run's `gpuplan bench --export` rows imported as a
# benchmark Job stores them, a bundle retrained with them, the whole-model cases scored with it.
# Scratch only: the shipped bundle and the run directory are not written.
IMPORT_DIR ?= /tmp/gpuplan-gpu-import
.PHONY: gpu-import
gpu-import: $(STAMP) ## RUN=<gpu-runs dir>: import its bench.parquet -> retrain -> score steps.jsonl, all in IMPORT_DIR
	@test -f "$(RUN)/bench.parquet" && test -f "$(RUN)/bench.json" && test -f "$(RUN)/steps.jsonl" \
	  || { echo "RUN=<dir> must hold bench.parquet, bench.json and steps.jsonl"; exit 2; }
	mkdir -p $(IMPORT_DIR) && rm -rf $(IMPORT_DIR)/perf.db $(IMPORT_DIR)/bundle
	$(BIN)/gpuplan import $(RUN)/bench.parquet --db sqlite:///$(IMPORT_DIR)/perf.db
	$(BIN)/gpuplan train --shipped --db sqlite:///$(IMPORT_DIR)/perf.db --out $(IMPORT_DIR)/bundle
	$(BIN)/gpuplan eval model-step-scoring predict --bundle $(IMPORT_DIR)/bundle \
	  --device $$($(PYTHON) -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' \
	  $(RUN)/bench.json) --out $(IMPORT_DIR)/predicted.json
	$(BIN)/gpuplan eval model-step-scoring score --predicted \
	  $(IMPORT_DIR)/predicted.json --measured $(RUN)/steps.jsonl --markdown $(IMPORT_DIR)/scored-after.md

bench: $(STAMP) ## speed benchmarks (reported, not asserted)
	$(BIN)/gpuplan eval speed

bench-plans: $(STAMP) ## apply->planned p50/p95 of 50 concurrent TrainingJobs on a private testbed (real estimator + operator)
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.plan_latency --jobs 50 $(BENCH_PLANS_ARGS)

abuse: $(STAMP) ## hostile-client reproducers against a real `gpuplan serve` (64 MB of empty pools, 150k-node graphs beside small ones), then the three-tenant campaign (#33)
	PYTHONPATH=tests:hack $(PYTHON) -m campaigns.hostile_clients
	PYTHONPATH=tests:hack $(PYTHON) -m campaigns.tenants

ABUSE_FULL_ARGS ?= --hostile-jobs 1000 --honest-jobs 10

abuse-full: $(STAMP) ## issue #33's three-tenant campaign on a private testbed (real operator + estimator; SQLite, then PostgreSQL); ABUSE_FULL_ARGS to resize
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.tenants_testbed $(ABUSE_FULL_ARGS)
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.tenants_testbed $(ABUSE_FULL_ARGS) --postgres

sched-compare: $(STAMP) ## extender vs MostAllocated/default kube-scheduler profiles on a private testbed, seeded workload -> docs/scheduler-comparison.md (~4 min)
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.scheduler_comparison --pods 60 --repeats 3
	PYTHONPATH=tests:testbed:hack $(PYTHON) -m campaigns.scheduler_comparison --pods 60 --repeats 3 --cpu-only-share 0.2

test-gangs: $(STAMP) ## build (if needed) scheduler-plugins Coscheduling and run the gang admission test through its PodGroup
	bash hack/testbed-build.sh --gangs
	GPUPLAN_REQUIRE_GANGS=1 $(BIN)/pytest -q tests/integration/test_gang_coscheduling.py

bench-extender: $(STAMP) ## extender load benchmark: 5,000 nodes, filter/prioritize p50/p95/p99, server CPU per request
	PYTHONPATH=tests:hack $(PYTHON) -m campaigns.extender_loadbench $(BENCH_EXTENDER_ARGS)

plans-report: $(STAMP) ## plans for GPT-2 medium, GPT-3 2.7B, LLaMA-7B over A100/H100/L4 pools -> docs/plans.md (~30 s)
	$(BIN)/gpuplan eval plans-report

memory-check: $(STAMP) ## predicted vs measured per-component training memory (PyTorch on CPU, ~10 s) -> paste into docs/memory.md
	$(BIN)/gpuplan eval memory-check

parallel-check: $(STAMP) ## DP/TP/PP step model vs published 4-GPU steps (NeuSight, for comparison) -> docs/parallelism.md table (~30 s)
	$(BIN)/gpuplan eval parallel-check

eval: $(STAMP) ## accuracy evaluation -> docs/accuracy.md
	$(BIN)/gpuplan eval

MODELS_DIR ?= /tmp/gpuplan-models
GPU_BENCH_ROWS ?= docs/gpu-steps/2026-11-27-h200b/bench.parquet
models: $(STAMP) ## rebuild the shipped default model bundle from ../shared/data and our GPU runs' kernel rows (GPU_BENCH_ROWS), as a benchmark Job would (~8 min); then run `make host-model` and `make step-spread`
	mkdir -p $(MODELS_DIR) && rm -f $(MODELS_DIR)/perf.db
	$(BIN)/gpuplan import $(GPU_BENCH_ROWS) --db sqlite:///$(MODELS_DIR)/perf.db
	$(BIN)/gpuplan train --shipped --db sqlite:///$(MODELS_DIR)/perf.db

HOST_RUN ?= docs/gpu-steps/2026-11-27-h200b
HOST_EVENT_RUN ?= docs/gpu-steps/2026-11-27-h200
.PHONY: host-model
host-model: $(STAMP) ## tensor-core GEMM utilisations from a GPU run's profiled phases, then host timeline coefficients (both with their leave-one-model-out spread) into the shipped bundle's manifest, from its host times and an earlier run's host-bound event times (~90 s)
	$(PYTHON) hack/bundle_host_model.py --steps $(HOST_RUN)/steps.jsonl \
	  --event-steps $(HOST_EVENT_RUN)/steps.jsonl --probe $(HOST_RUN)/host-probe.json

STEP_RUNS ?= $(HOST_EVENT_RUN)/steps.jsonl $(HOST_RUN)/steps.jsonl
STEP_DEVICE ?= h200-sxm-141gb
.PHONY: step-spread
step-spread: $(STAMP) ## after `make host-model`: each model's leave-one-out host and GEMM fits, its steps priced by them without the step spread, then the spread's conformal fit on STEP_RUNS into the shipped bundle's manifest (~10 min)
	$(BIN)/gpuplan eval host-check --steps $(HOST_RUN)/steps.jsonl \
	  --event-steps $(HOST_EVENT_RUN)/steps.jsonl --probe $(HOST_RUN)/host-probe.json \
	  --folds $(HOST_RUN)/host-folds.json > $(HOST_RUN)/host-check.txt
	$(BIN)/gpuplan eval stream-check --steps $(HOST_RUN)/steps.jsonl \
	  --folds $(HOST_RUN)/aligned-folds.json > $(HOST_RUN)/stream-check.md
	$(BIN)/gpuplan eval model-step-scoring predict --device $(STEP_DEVICE) --no-step-spread \
	  --host-folds $(HOST_RUN)/host-folds.json --aligned-folds $(HOST_RUN)/aligned-folds.json \
	  --out $(HOST_RUN)/predicted-raw.json
	$(PYTHON) hack/bundle_step_spread.py --predicted $(HOST_RUN)/predicted-raw.json \
	  $(foreach run,$(STEP_RUNS),--steps $(run)) --folds $(HOST_RUN)/step-folds.json

.PHONY: interval-sigma
interval-sigma: $(STAMP) ## shared interval log-sigma into the shipped bundle's manifest, no retraining (~15 s)
	$(PYTHON) hack/bundle_interval_sigma.py

crds: ## copy crds/*.yaml into the chart (the chart's crds/ is generated)
	rm -f charts/gpuplan/crds/*.yaml && cp crds/*.yaml charts/gpuplan/crds/

openapi: $(STAMP) ## regenerate docs/openapi.json from the estimator service's models
	$(PYTHON) -m gpuplan_estimator.interfaces.http.openapi --output docs/openapi.json

docs: $(STAMP) ## run README.md's marked examples and write their output into it (~40 s)
	$(PYTHON) hack/docs_examples.py

verify: crds openapi ## fail when generated artefacts (chart CRDs, OpenAPI, README examples) differ from their sources
	git diff --exit-code -- charts/gpuplan/crds docs/openapi.json
	$(PYTHON) hack/docs_examples.py --check

chart: ## lint and render the Helm chart
	$$(bash hack/testbed-build.sh --print-bin)/helm lint charts/gpuplan
	$$(bash hack/testbed-build.sh --print-bin)/helm template gpuplan charts/gpuplan --kube-version $$(bash hack/testbed-build.sh --print-k8s-version) >/dev/null

testbed-build: ## build Kubernetes/etcd/kwok/helm from Go modules into ~/.cache/gpuplan/testbed
	bash hack/testbed-build.sh

# The older Kubernetes minor the chart still supports: its own binaries and testbed state, the
# Helm install test on it. `make test` runs on hack/testbed-build.sh's default (newest) version.
COMPAT_K8S_VERSION ?= v1.34.4
COMPAT_ENV = GPUPLAN_K8S_VERSION=$(COMPAT_K8S_VERSION) GPUPLAN_TESTBED_STATE=$(CURDIR)/.testbed-$(COMPAT_K8S_VERSION)
testbed-compat: $(STAMP) ## build (if needed) Kubernetes $(COMPAT_K8S_VERSION) and run the Helm install test on it
	GPUPLAN_K8S_VERSION=$(COMPAT_K8S_VERSION) bash hack/testbed-build.sh
	$(COMPAT_ENV) $(BIN)/pytest -q tests/integration/test_helm_install.py

testbed: testbed-build testbed-up ## build (if needed) and start the local control plane

testbed-up: $(STAMP) ## start the local control plane
	$(PYTHON) testbed/gpuplan_testbed.py up

testbed-down: $(STAMP) ## stop the local control plane
	$(PYTHON) testbed/gpuplan_testbed.py down

testbed-status: $(STAMP) ## show the local control plane's components
	$(PYTHON) testbed/gpuplan_testbed.py status

.PHONY: image-check
image-check: $(STAMP) ## build each Dockerfile's root filesystem with mmdebstrap (no Docker; root) and run the image in it; cache ~/.cache/gpuplan/images
	$(PYTHON) hack/image_check.py $(IMAGE_CHECK_ARGS)

kind-e2e: $(STAMP) ## same integration tests on a kind cluster (needs Docker, kind, kubectl, helm)
	bash hack/kind-e2e.sh

clean: ## remove the venv and caches in the repo
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
