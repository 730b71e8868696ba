#!/usr/bin/env bash
# Train one RoBERTa on several GLUE tasks at once (CA-MTL's setting) with fairseq-train.
#
#   scripts/glue/multitask.sh [extra fairseq-train args...]
#
# The paper's settings (Pilault et al., ICLR 2021, and the authors' run.py): MT-Uncertainty
# sampling, lr 2e-5, 5 epochs, batch 32, 10% linear warm-up, the lower half of the encoder layers
# frozen (0-5 of base, 0-11 of large). The rest is fairseq's RoBERTa GLUE recipe (Adam betas
# (0.9, 0.98), eps 1e-6, weight decay 0.1, dropout 0.1, polynomial decay, fp16 on a GPU). Extra args
# go last and override. Re-running the same command resumes an interrupted run (as finetune.sh).
#
# Environment (defaults in brackets):
#   ROBERTA_PATH  pretrained checkpoint (required)     DATA_DIR [./glue-bin] (data-prep/prepare_glue.py output)
#   TASKS         [CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE] (the paper's eight; any case)
#   SAMPLING      [uncertainty]  sequential | uniform | proportional | uncertainty
#   ARCH          [the checkpoint's --arch and sizes]; ca_mtl_roberta_base / _large for the task-conditioned model
#   MAX_POSITIONS [the checkpoint's]
#   FREEZE        [lower: the lower half of the layers]; none, or layers such as 0-5 (recadam_fairseq/core/layers.py)
#   METHOD        [adam]: a method of the multi-task setting (recadam: RecAdam on the shared weights, K [0.1]
#                 T0 [1000] ...), listed with their variables at the end of this help
#   LR [2e-5]  BATCH [32]  EPOCHS [5]  SEED [1]  FP16 [auto: 1 with a CUDA device]  NUM_GPUS [1]
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/MTL/<ARCH>-<SAMPLING>-<METHOD>/seed$SEED (summarize.py reads it)
#   FORGETTING_PROBE  [none] the forgetting meter's probe, FORGETTING_METER [mlm] | pairs (docs/forgetting-meter.md),
#                 FORGETTING_BUDGET: checkpoint_best.pt the best glue_avg among the validations that forgot at most it
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train]   PYTHON [fairseq-train's]
#   RESTART=1     start the run over        DRY_RUN=1     print the command (written to $RUN/command.sh)
set -euo pipefail

die() { echo "multitask.sh: error: $*" >&2; exit 2; }
note() { echo "multitask.sh: $*" >&2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
METHODS_OF=--multitask  # usage lists the catalogue's METHODs of this script
source "$SCRIPT_DIR/common.sh"
case "${1:-}" in -h|--help) usage; exit 0 ;; esac

TASKS=${TASKS:-CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE}
SAMPLING=${SAMPLING:-uncertainty}
METHOD=${METHOD:-adam}
LR=${LR:-2e-5}
BATCH=${BATCH:-32}
EPOCHS=${EPOCHS:-5}
SEED=${SEED:-1}
FP16=${FP16:-auto}
NUM_GPUS=${NUM_GPUS:-1}
FREEZE=${FREEZE:-lower}
DATA_DIR=${DATA_DIR:-./glue-bin}
SAVE_DIR=${SAVE_DIR:-runs}
USER_DIR=${USER_DIR:-$REPO_DIR/recadam_fairseq}
FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"
PYTHON=${PYTHON:-$(python_of "${TRAIN[0]}")}
DRY_RUN=${DRY_RUN:-0}
case "$SAMPLING" in sequential|uniform|proportional|uncertainty) ;;
  *) die "unknown SAMPLING '$SAMPLING'; choose one of sequential uniform proportional uncertainty" ;; esac
[[ $FP16 == 0 || $FP16 == 1 || $FP16 == auto ]] || die "FP16 must be 0, 1 or auto, got '$FP16'"
[[ $BATCH =~ ^[1-9][0-9]*$ ]] || die "BATCH must be a positive integer, got '$BATCH'"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || die "EPOCHS must be a positive integer, got '$EPOCHS'"
[[ $NUM_GPUS =~ ^[1-9][0-9]*$ ]] || die "NUM_GPUS must be a positive integer, got '$NUM_GPUS'"
if [ -z "${ROBERTA_PATH:-}" ] || [ ! -f "${ROBERTA_PATH:-}" ]; then
  msg="ROBERTA_PATH='${ROBERTA_PATH:-}': give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.base/model.pt"
  if [ "$DRY_RUN" = 1 ]; then echo "multitask.sh: warning: $msg" >&2; else die "$msg"; fi
fi

# Task names in GLUE's spelling, updates per epoch (every sampling mode takes sum_t ceil(n_t / BATCH)
# batches, shared by the GPUs), the checkpoint's architecture, FREEZE checked against the model's layers.
ASK=(--method "$METHOD" --multitask --tasks "$TASKS")
if [ "$DRY_RUN" = 1 ] && [ ! -d "$DATA_DIR" ]; then
  PER_EPOCH=1000; note "warning: no $DATA_DIR; assuming $PER_EPOCH updates per epoch"
else
  ASK+=(--steps "$DATA_DIR" "$BATCH" "$NUM_GPUS")
fi
[ ! -f "${ROBERTA_PATH:-}" ] || ASK+=(--checkpoint "$ROBERTA_PATH")
[ -z "${ARCH:-}" ] || ASK+=(--arch "$ARCH")
[ "$FREEZE" = none ] || [ ! -f "${ROBERTA_PATH:-}" ] || ASK+=(--freeze "$FREEZE")
[ "$FP16" = 0 ] || { [ "$DRY_RUN" = 1 ] && [ "$FP16" = 1 ]; } || ASK+=(--cuda)
ask_python "${ASK[@]}"
choose_fp16
arch_flags roberta_base

TOTAL=$((PER_EPOCH * EPOCHS))
WARMUP=$(( TOTAL / 10 > 0 ? TOTAL / 10 : 1 ))
schedule_warnings "$TOTAL"
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(default_save_interval "$TOTAL")}
[[ $SAVE_INTERVAL_UPDATES =~ ^[1-9][0-9]*$ ]] ||
  die "SAVE_INTERVAL_UPDATES must be a positive integer, got '$SAVE_INTERVAL_UPDATES'"

NAME="${ARCH:-${ARCH_FLAGS[1]}}-$SAMPLING-$METHOD"
RUN="$SAVE_DIR/MTL/$NAME/seed$SEED"

CMD=("${TRAIN[@]}" "$DATA_DIR" --user-dir "$USER_DIR"
  --finetune-from-model "${ROBERTA_PATH:-}"
  --task glue_multitask --mt-tasks "$TASKS" --mt-sampling "$SAMPLING" --criterion glue_multitask
  --init-token 0 --separator-token 2 --max-positions "$MAX_POSITIONS"
  "${ARCH_FLAGS[@]}" --dropout 0.1 --attention-dropout 0.1
  --batch-size "$BATCH" --required-batch-size-multiple 1 --max-epoch "$EPOCHS"
  "${METHOD_FLAGS[@]}" --adam-betas "(0.9, 0.98)" --adam-eps 1e-06 --weight-decay 0.1 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP"
  --max-update "$TOTAL")
[ "$FREEZE" = none ] || CMD+=(--freeze-encoder-layers "$FREEZE")
[ "$FP16" = 0 ] || CMD+=(--fp16 --fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128)
[ "$NUM_GPUS" = 1 ] || CMD+=(--distributed-world-size "$NUM_GPUS")
[[ ",$TASKS," != *",MNLI,"* ]] || CMD+=(--valid-subset valid,valid1)  # MNLI-mm as valid1
forgetting_flags glue_avg  # BEST_METRIC: glue_avg, or with FORGETTING_BUDGET its value within the budget
CMD+=(--find-unused-parameters --best-checkpoint-metric "$BEST_METRIC" --maximize-best-checkpoint-metric
  --seed "$SEED" --save-dir "$RUN" --no-epoch-checkpoints
  --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
  --log-format json --log-interval 100 "$@")

write_command "$RUN" "multi-task $TASKS ($SAMPLING, $NAME) seed $SEED" \
  "LR=$LR BATCH=$BATCH EPOCHS=$EPOCHS TOTAL=$TOTAL WARMUP=$WARMUP FP16=$FP16 FREEZE=$FREEZE" "${#TRAIN[@]}" "${CMD[@]}"
if [ "$DRY_RUN" = 1 ]; then cat "$RUN/command.sh"; exit 0; fi
echo "== multi-task $TASKS ($SAMPLING, $NAME, $METHOD) seed $SEED -> $RUN"
train_and_mark_done "$RUN"
echo "== (python scripts/glue/summarize.py $SAVE_DIR)"
