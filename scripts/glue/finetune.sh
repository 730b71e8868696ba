#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with fairseq's recipe: Adam, RecAdam, R3F/R4F, SAM/FSAM, the baselines
# (LLRD, re-init, LoRA, Mixout, ChildTuning, R-Drop) or RecAdam combined with one of them.
#
#   scripts/glue/finetune.sh TASK METHOD [extra fairseq-train args...]
#
# TASK:   MNLI QNLI QQP RTE SST-2 MRPC CoLA STS-B (case-insensitive), or a task of yours: its name, with
#         $DATA_DIR/NAME-bin/labels.json (data-prep/prepare_task.py); its recipe: lr 2e-5, batch 16, 10 epochs of
#         its training set with a 6% warmup (the small GLUE tasks'), its classes and metric from labels.json
# METHOD: a method of the catalogue (recadam_fairseq/catalogue.py; the table in docs/glue.md), listed with its
#         variables at the end of this help. `python -m recadam_fairseq methods METHOD` shows its flags.
# Extra args go last to fairseq-train, so they override the recipe (argparse keeps the last one).
#
# Resuming: the same command again continues an interrupted run from its newest checkpoint (fairseq's
# --finetune-from-model: checkpoint_last.pt with the optimizer's state, θ* included); a checkpoint_last.pt
# that does not load is set aside and the newest complete checkpoint taken instead. A finished run is
# not trained again. RESTART=1 starts a run over; a different command for the same run directory stops.
#
# Environment (defaults in brackets):
#   ROBERTA_PATH  pretrained checkpoint (required)     DATA_DIR  [./glue-bin], data at $DATA_DIR/$TASK-bin
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/$TASK/$METHOD[-k$K-t$T0]/seed$SEED
#   ARCH          [the checkpoint's --arch and sizes]  MAX_POSITIONS [the checkpoint's]
#   LR, BATCH [the recipe's]  SEED [1]  NUM_GPUS [1]
#   FP16          [auto: 1 with a CUDA device, else 0 (fp32)]
#   MAX_UPDATE    total updates [the recipe's: 10 epochs]; warmup is scaled in proportion (at least 1), and the
#                 run stops there however many epochs that takes
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]: a checkpoint (and validation) every N updates
#   the method's knobs, each from its variable (listed at the end): K [0.1] T0 [1000] GAMMA [5000] (RecAdam),
#                 EWC_FISHER [task] (ewc, recadam-ewc: task, or a file of scripts/fisher.py), RHO, LLRD, ...
#   CRITERION     [sentence_prediction_recadam; the method's own where it has one (R3F, R-Drop, the coupled
#                 objective), which takes no other]; with sentence_prediction the task's metric flag
#                 (--report-mcc, --report-acc-and-f1, --report-pearson-and-spearman) is added
#   FORGETTING_PROBE  a probe directory (scripts/binarize_probe.py): the forgetting meter logs what the model
#                 loses from pretraining at each validation; FORGETTING_METER [mlm] | pairs (docs/forgetting-meter.md)
#   FORGETTING_BUDGET  with the meter: checkpoint_best.pt is the best validation among those that forgot at most
#                 this (the masked-LM loss's rise in bits, or the pair AUC's fall)
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train] (may hold several words)
#   PYTHON        [the interpreter of FAIRSEQ_TRAIN]: reads the recipe, the checkpoint and the machine
#   RESTART=1     start the run over (its checkpoints and log are deleted)
#   DRY_RUN=1     write $RUN/command.sh and print it; train nothing
#   PRINT_RUN_DIR=1  print the run directory and exit (used by grid.sh)
#   CHECK_RUN=1   stop as a run would on a run directory started with another command, else say so and exit 0;
#                 write nothing (used by grid.sh before it trains anything)
#
# The run directory gets command.sh (the exact command), run.json (the settings), train.log
# (fairseq's --log-format json output, with stderr, written by fairseq-train; appended to on resume) and, on
# success, `done`. The terminal: a line per log interval and validation, the best dev score at the end.
set -euo pipefail

die() { echo "finetune.sh: error: $*" >&2; exit 2; }
note() { echo "finetune.sh: $*" >&2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
METHODS_OF=""  # usage lists the catalogue's METHODs of this script
source "$SCRIPT_DIR/common.sh"

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then usage >&2; die "expected TASK METHOD"; fi
TASK_ARG=$1 METHOD=$2
shift 2
EXTRA=("$@")
for a in ${EXTRA[@]+"${EXTRA[@]}"}; do  # fairseq-train's own help: no run directory, no done marker
  case "$a" in -h|--help) read -r -a TRAIN <<< "${FAIRSEQ_TRAIN:-fairseq-train}"; exec "${TRAIN[@]}" --help ;; esac
done

FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"
PYTHON=${PYTHON:-$(python_of "${TRAIN[0]}")}
DRY_RUN=${DRY_RUN:-0}

# The method (recadam_fairseq/catalogue.py; its knobs from their variables), the recipe and the task's spelling
# (recadam_fairseq/core/glue_tasks.py).
DATA_DIR=${DATA_DIR:-./glue-bin}
ask_python --method "$METHOD" --task "$TASK_ARG" --data "$DATA_DIR"  # sets METHOD to the catalogue's spelling, K, T0,
# ... to their values, TASK and its recipe (RECIPE_*, NUM_CLASSES, METRIC, TASK_FLAGS)
IS_R3F=0
[ "$METHOD_CRITERION" != sentence_prediction_r3f ] || IS_R3F=1

# R3F's RTE command (fairseq examples/rxf): lr 1e-5, batch 8, 3120 updates, 187 warmup
if [ "$IS_R3F" = 1 ] && [ "$TASK" = RTE ]; then
  RECIPE_LR=1e-5 RECIPE_BATCH=8 RECIPE_TOTAL=3120 RECIPE_WARMUP=187
fi
[ -z "$METHOD_LR" ] || RECIPE_LR=$METHOD_LR  # its own (LoRA's for RoBERTa-base on GLUE, Hu et al. 2021)
LR=${LR:-$RECIPE_LR}
BATCH=${BATCH:-$RECIPE_BATCH}
TOTAL=$RECIPE_TOTAL
WARMUP=$RECIPE_WARMUP
SEED=${SEED:-1}
NUM_GPUS=${NUM_GPUS:-1}
if [ -n "$METHOD_CRITERION" ]; then
  [ -z "${CRITERION:-}" ] || [ "$CRITERION" = "$METHOD_CRITERION" ] ||
    die "METHOD $METHOD uses CRITERION=$METHOD_CRITERION, got CRITERION=$CRITERION"
  CRITERION=$METHOD_CRITERION
fi
CRITERION=${CRITERION:-sentence_prediction_recadam}
SAVE_DIR=${SAVE_DIR:-runs}
USER_DIR=${USER_DIR:-$REPO_DIR/recadam_fairseq}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_uint "$SEED" || die "SEED must be a non-negative integer, got '$SEED'"
is_uint "$BATCH" && [ "$BATCH" -gt 0 ] || die "BATCH must be a positive integer, got '$BATCH'"
is_uint "$NUM_GPUS" && [ "$NUM_GPUS" -gt 0 ] || die "NUM_GPUS must be a positive integer, got '$NUM_GPUS'"
if [ -n "${MAX_UPDATE:-}" ]; then
  is_uint "$MAX_UPDATE" && [ "$MAX_UPDATE" -gt 0 ] || die "MAX_UPDATE must be a positive integer, got '$MAX_UPDATE'"
  WARMUP=$(( (WARMUP * MAX_UPDATE + TOTAL / 2) / TOTAL ))  # rounded, in proportion
  [ "$WARMUP" -ge 1 ] || WARMUP=1
  TOTAL=$MAX_UPDATE
fi
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(default_save_interval "$TOTAL")}
is_uint "$SAVE_INTERVAL_UPDATES" && [ "$SAVE_INTERVAL_UPDATES" -gt 0 ] ||
  die "SAVE_INTERVAL_UPDATES must be a positive integer, got '$SAVE_INTERVAL_UPDATES'"

NAME=$METHOD_NAME
RUN="$SAVE_DIR/$TASK/$NAME/seed$SEED"
if [ "${PRINT_RUN_DIR:-0}" = 1 ]; then echo "$RUN"; exit 0; fi

DATA="$DATA_DIR/$TASK-bin"
problems=()
if [ -z "${ROBERTA_PATH:-}" ]; then
  problems+=("ROBERTA_PATH is not set: give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.large/model.pt")
elif [ -d "$ROBERTA_PATH" ]; then
  problems+=("ROBERTA_PATH=$ROBERTA_PATH is a directory: give the checkpoint file in it$(
    f=$(compgen -G "$ROBERTA_PATH/*.pt" | head -1 || true); [ -z "$f" ] || echo ", e.g. ROBERTA_PATH=$f")")
elif [ ! -f "$ROBERTA_PATH" ]; then
  problems+=("ROBERTA_PATH=$ROBERTA_PATH: no such file")
fi
if [ ! -d "$DATA/input0" ]; then
  problems+=("no data at $DATA (DATA_DIR=$DATA_DIR): expected $DATA/input0, label (see docs/glue.md)")
fi
if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do
    if [ "$DRY_RUN" = 1 ]; then echo "finetune.sh: warning: $p" >&2; else echo "finetune.sh: error: $p" >&2; fi
  done
  [ "$DRY_RUN" = 1 ] || exit 2
fi

# The checkpoint's architecture unless ARCH and MAX_POSITIONS say; whether there is a GPU unless FP16 says.
FP16=${FP16:-auto}
[[ $FP16 == 0 || $FP16 == 1 || $FP16 == auto ]] || die "FP16 must be 0, 1 or auto, got '$FP16'"
ASK=()
if [ -f "${ROBERTA_PATH:-}" ] && { [ -z "${ARCH:-}" ] || [ -z "${MAX_POSITIONS:-}" ]; }; then
  ASK+=(--checkpoint "$ROBERTA_PATH")
  [ -z "${ARCH:-}" ] || ASK+=(--arch "$ARCH")  # checked against the checkpoint's sizes
fi
if [ "$METHOD_FT" = 1 ]; then  # the arch as the roberta_ft model's (re-init, LoRA)
  ASK+=(--ft)
  [ -z "${ARCH:-}" ] || [[ " ${ASK[*]} " == *" --arch "* ]] || ASK+=(--arch "$ARCH")
fi
[ "$FP16" = 0 ] || { [ "$DRY_RUN" = 1 ] && [ "$FP16" = 1 ]; } || ASK+=(--cuda)
[ ! -f "$DATA/input0/train.idx" ] || ASK+=(--tasks "$TASK" --steps "$DATA_DIR" "$BATCH" "$NUM_GPUS")  # PER_EPOCH
[ ${#ASK[@]} = 0 ] || ask_python "${ASK[@]}"
choose_fp16
# Runs that cannot learn, said before training whatever set the numbers: the recipe's 10 epochs ending
# before its update count on a small data set, then a warmup as long as the run, RecAdam's T0 past its end.
END=$TOTAL
if [ -z "${MAX_UPDATE:-}" ] && [ -n "${PER_EPOCH:-}" ] && [ $((PER_EPOCH * 10)) -lt "$TOTAL" ]; then
  END=$((PER_EPOCH * 10))
  note "warning: the recipe's 10 epochs are about $END updates on this data, not its $TOTAL: the lr schedule (warmup $WARMUP, decay to 0 at $TOTAL) is cut short; MAX_UPDATE=$END scales it to the data"
fi
schedule_warnings "$END"
arch_flags "$([ "$METHOD_FT" = 1 ] && echo roberta_ft_large || echo roberta_large)"

CMD=("${TRAIN[@]}" "$DATA"
  --user-dir "$USER_DIR"
  --finetune-from-model "${ROBERTA_PATH:-}"
  --task sentence_prediction --num-classes "$NUM_CLASSES" --init-token 0 --separator-token 2
  --max-positions "$MAX_POSITIONS" --required-batch-size-multiple 1 --batch-size "$BATCH" --max-tokens 4400
  "${ARCH_FLAGS[@]}" --dropout 0.1 --attention-dropout 0.1
  --criterion "$CRITERION")
CMD+=(${TASK_FLAGS[@]+"${TASK_FLAGS[@]}"})  # STS-B's (a regression's) --regression-target; MNLI's two valid sets
if [ "$CRITERION" = sentence_prediction ]; then  # fairseq's criterion computes these only when asked
  case "$METRIC" in
    mcc) CMD+=(--report-mcc) ;;
    f1) CMD+=(--report-acc-and-f1) ;;
    pearson) CMD+=(--report-pearson-and-spearman) ;;
  esac
fi
CMD+=("${METHOD_FLAGS[@]}" --adam-betas "(0.9, 0.98)" --adam-eps 1e-06 --weight-decay 0.1 --clip-norm 0.0)
CMD+=(--lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP"
  --max-update "$TOTAL")
# the recipe's 10 epochs are its update count; a MAX_UPDATE of the user's is the run's length, whatever the epochs
[ -n "${MAX_UPDATE:-}" ] || CMD+=(--max-epoch 10)
[ "$FP16" = 0 ] || CMD+=(--fp16 --fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128)
CMD+=(--find-unused-parameters)
if [ -n "${FORGETTING_PROBE:-}" ] && [ "$CRITERION" = sentence_prediction ] &&
   [[ " ${METHOD_FLAGS[*]} " != *" --optimizer recadam "* && " ${METHOD_FLAGS[*]} " != *" --optimizer samsgd "* ]]; then
  die "FORGETTING_PROBE needs the plug-in's criterion or optimizer, which carry the meter: CRITERION=sentence_prediction with METHOD $METHOD has neither (leave CRITERION unset)"
fi
forgetting_flags "$METRIC"  # BEST_METRIC: METRIC, or with FORGETTING_BUDGET its value within the budget
[ "$NUM_GPUS" = 1 ] || CMD+=(--distributed-world-size "$NUM_GPUS")
CMD+=(--best-checkpoint-metric "$BEST_METRIC" --maximize-best-checkpoint-metric
  --seed "$SEED" --save-dir "$RUN" --no-epoch-checkpoints
  --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
  --log-format json --log-interval 100
  ${EXTRA[@]+"${EXTRA[@]}"})  # (this form: an empty array is "unbound" to set -u before bash 4.4)

SETTINGS="LR=$LR BATCH=$BATCH TOTAL=$TOTAL WARMUP=$WARMUP FP16=$FP16 NUM_GPUS=$NUM_GPUS${METHOD_SETTINGS:+ $METHOD_SETTINGS}"
write_command "$RUN" "$TASK $METHOD seed $SEED" "$SETTINGS" "${#TRAIN[@]}" "${CMD[@]}"

if [ "$DRY_RUN" = 1 ]; then
  cat "$RUN/command.sh"
  exit 0
fi

json_str() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
{
  printf '{"task": %s, "method": %s, "seed": %s' "$(json_str "$TASK")" "$(json_str "$METHOD")" "$SEED"
  printf ', "metric": %s, "lr": %s, "batch": %s' "$(json_str "$METRIC")" "$(json_str "$LR")" "$BATCH"
  printf ', "total_updates": %s, "warmup_updates": %s' "$TOTAL" "$WARMUP"
  printf '%s' "$METHOD_JSON"
  [ -z "${FORGETTING_BUDGET:-}" ] || printf ', "forgetting_budget": %s' "$(json_str "$FORGETTING_BUDGET")"
  printf '}\n'
} > "$RUN/run.json"

echo "== $TASK $METHOD seed $SEED -> $RUN"
train_and_mark_done "$RUN"
