#!/usr/bin/env bash
# The RecAdam authors' hyperparameter search on one GLUE task (or a task of yours), resumable.
#
#   scripts/glue/grid.sh TASK [extra fairseq-train args...]
#
# Runs scripts/glue/finetune.sh TASK METHOD for every seed in SEEDS and method in METHODS; the
# methods with RecAdam's knobs (recadam-*, ewc) once per (k, t0) in KS x T0S, the others once per seed.
# A run whose `done` marker exists is skipped ("skip"); an unfinished one continues from its newest
# checkpoint ("resume"; RESTART=1 starts every run of the grid over). A run directory started or finished
# with another command (other variables or args) stops the grid before it trains anything, one line each
# (finetune.sh's). A failed run does not stop the grid: the failures are listed at the end (exit 1).
# JOBS=N runs N at a time (each line then carries its run's name; on a machine with GPUs one GPU each, from
# CUDA_VISIBLE_DEVICES or nvidia-smi), with a line after each run: how many ended, run and are left.
# CLUSTER=slurm sends each run as a SLURM job through submitit (PARTITION, TIME_MIN [240], NUM_GPUS [1],
# CPUS_PER_RUN [8] a run; requeued on a timeout or a preemption, the run resumes) and waits for them.
#
# Environment: KS ["0.05 0.1 0.2 0.5 1"]  T0S ["100 250 500 1000"]  SEEDS ["1"]  JOBS ["1"]  CLUSTER [none]
#              METHODS ["recadam"]; any of finetune.sh's METHODs (python -m recadam_fairseq methods)
#              everything finetune.sh reads (ROBERTA_PATH, DATA_DIR, SAVE_DIR, MAX_UPDATE, ...)
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../launch.py" grid "$0" "$@"  # recadam_fairseq/launch
