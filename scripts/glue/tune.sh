#!/usr/bin/env bash
# Each method at its best on one task: a forgetting-aware search over every method's knobs and its lr, with the same
# budget for each method, then the picks confirmed over seeds and judged against Adam (docs/search.md).
#
#   scripts/glue/tune.sh TASK [extra fairseq-train args...]
#
# For each of METHODS, TRIALS trials of MAX_UPDATE updates: each a finetune.sh run (the same recipe, run directory
# SAVE_DIR/TASK/METHOD[-knobs]-lrLR/seedN, checkpoints and resume) whose lr and knobs Optuna's multi-objective sampler
# draws; its two objectives, the dev metric (up) and forgetting (down, the probe's: FORGETTING_PROBE is required), read
# at the validation the summary picks. From each method's front: the trial that forgets least within the accuracy floor
# of Adam's best trial, and its best-metric trial, trained over SEEDS; then the verdicts against Adam's best pick.
# The study lives in SAVE_DIR/TASK/search/ (journal.log: optuna-dashboard opens it; trials.csv rewritten as each trial
# ends; summary.md, search-TASK.png, forgetting-TASK.png at the end). The same command goes on after a kill: complete
# trials kept, an interrupted trial's run resumed, a higher TRIALS adds trials, nothing trains twice.
#
# Environment: METHODS ["adam recadam"]  TRIALS [10] a method  SEEDS ["1 2 3"]: the trials train with the first, the
#              picks with all  JOBS [1] trials at a time  SEARCH_SEED [0]: the sampler's  CLUSTER [none] slurm | local
#              (and PARTITION, TIME_MIN, NUM_GPUS, CPUS_PER_RUN, as grid.sh)
#              the ranges: LR_RANGE ["1e-5 1e-3"], every method's; each knob's <VAR>_RANGE, e.g. K_RANGE ["0.01 1"],
#              T0_RANGE ["0.05 0.8"] (fractions of MAX_UPDATE), GAMMA_RANGE, LLRD_RANGE, ... (python -m recadam_fairseq
#              methods NAME lists a method's); a knob's variable set (K=0.1, LR=1e-4) fixes it instead
#              everything finetune.sh reads (ROBERTA_PATH, DATA_DIR, SAVE_DIR, MAX_UPDATE, FORGETTING_PROBE, ...)
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../launch.py" tune "$0" "$@"  # recadam_fairseq/launch
