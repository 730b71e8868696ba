#!/usr/bin/env bash
# The RecAdam authors' hyperparameter search on one GLUE task, resumable.
#
#   scripts/glue/grid.sh TASK [extra fairseq-train args...]
#
# Runs scripts/glue/finetune.sh TASK METHOD for every seed in SEEDS and method in METHODS; the
# methods with RecAdam's knobs (recadam-*, ewc) once per (k, t0) in KS x T0S, the others once per seed.
# A run whose `done` marker exists is skipped ("skip"); an unfinished one continues from its newest
# checkpoint ("resume"; RESTART=1 starts every run of the grid over). A run directory started or finished
# with another command (other variables or args) stops the grid before it trains anything, one line each
# (finetune.sh's). A failed run does not stop the grid: the failures are listed at the end (exit 1).
#
# Environment: KS ["0.05 0.1 0.2 0.5 1"]  T0S ["100 250 500 1000"]  SEEDS ["1"]
#              METHODS ["recadam"]; any of finetune.sh's METHODs (python -m recadam_fairseq methods)
#              everything finetune.sh reads (ROBERTA_PATH, DATA_DIR, SAVE_DIR, MAX_UPDATE, ...)
set -euo pipefail
# finetune.sh's modes, set per call below: from the caller's environment, every run would exit 0 untrained
unset CHECK_RUN PRINT_RUN_DIR

die() { echo "grid.sh: error: $*" >&2; exit 2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$SCRIPT_DIR/common.sh"  # usage, python_of
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 1 ] || { usage >&2; die "expected TASK"; }
TASK=$1
shift

FINETUNE="$SCRIPT_DIR/finetune.sh"
KS=${KS:-"0.05 0.1 0.2 0.5 1"}
T0S=${T0S:-"100 250 500 1000"}
SEEDS=${SEEDS:-1}
METHODS=${METHODS:-recadam}
read -r -a TRAIN <<< "${FAIRSEQ_TRAIN:-fairseq-train}"
PYTHON=${PYTHON:-$(python_of "${TRAIN[0]}")}
declare -A KT  # the methods with RecAdam's knobs: a (k, t0) grid each
for m in $METHODS; do  # the catalogue's (recadam_fairseq/catalogue.py), as finetune.sh takes them
  out=$("$PYTHON" "$SCRIPT_DIR/prelaunch.py" plan --method "$m" 2>&1) || die "METHODS: ${out#error: }"
  grep -qx "METHOD_RECADAM=1" <<< "$out" && KT[$m]=1
done
[ -n "${KS// }" ] && [ -n "${T0S// }" ] && [ -n "${SEEDS// }" ] || die "KS, T0S and SEEDS must not be empty"

EXTRA=("$@")
jobs=()  # "SEED METHOD [K T0]", in the order they run
for seed in $SEEDS; do
  for method in $METHODS; do
    if [ -z "${KT[$method]:-}" ]; then  # no RecAdam knobs: no (k, t0) grid
      jobs+=("$seed $method")
    else
      for k in $KS; do
        for t0 in $T0S; do
          jobs+=("$seed $method $k $t0")
        done
      done
    fi
  done
done

job_env() {  # job_env SEED METHOD [K T0]: ENV and JOB_METHOD for finetune.sh
  ENV=(SEED="$1") JOB_METHOD=$2
  [ $# -lt 4 ] || ENV+=(K="$3" T0="$4")
}

# Before training anything: every run directory, and none started (or finished) with another command than
# the one the grid gives it (finetune.sh's own check and one-line error: a `done` run of another command is
# not this grid's).
runs=() conflicts=0
for job in "${jobs[@]}"; do
  job_env $job
  run=$(env "${ENV[@]}" PRINT_RUN_DIR=1 bash "$FINETUNE" "$TASK" "$JOB_METHOD")  # exits 2 on a bad TASK
  runs+=("$run")
  [ -f "$run/command.sh" ] && [ "${RESTART:-0}" != 1 ] || continue
  if ! err=$(env "${ENV[@]}" CHECK_RUN=1 bash "$FINETUNE" "$TASK" "$JOB_METHOD" ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 >/dev/null); then
    msg=$(grep '^finetune.sh: error: ' <<< "$err" | tail -1 || true)
    msg=${msg#finetune.sh: error: }
    echo "grid.sh: error: ${msg:-$(tail -1 <<< "$err")}" >&2
    conflicts=$((conflicts + 1))
  fi
done
[ "$conflicts" = 0 ] || { echo "grid.sh: $TASK: nothing trained" >&2; exit 2; }

failed=()
n_run=0 n_skip=0
for i in "${!jobs[@]}"; do
  job_env ${jobs[i]}
  run=${runs[i]}
  if [ -f "$run/done" ] && [ "${RESTART:-0}" != 1 ]; then
    echo "skip $run (done)"
    n_skip=$((n_skip + 1))
    continue
  fi
  [ ! -e "$run/train.log" ] || [ "${RESTART:-0}" = 1 ] || echo "resume $run (unfinished)"
  n_run=$((n_run + 1))
  if ! env "${ENV[@]}" bash "$FINETUNE" "$TASK" "$JOB_METHOD" ${EXTRA[@]+"${EXTRA[@]}"}; then
    echo "grid.sh: run failed: $run" >&2
    failed+=("$run")
  fi
done

echo "grid.sh: $TASK: ran $n_run, skipped $n_skip, failed ${#failed[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  printf '  failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
