#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with fairseq's recipe: Adam, RecAdam, R3F/R4F, SAM/FSAM, the baselines
# (LLRD, re-init, LoRA, Mixout, ChildTuning, R-Drop) or RecAdam combined with one of them.
#
#   scripts/glue/finetune.sh TASK METHOD [extra fairseq-train args...]
#
# TASK:   MNLI QNLI QQP RTE SST-2 MRPC CoLA STS-B (case-insensitive)
# METHOD: adam             --optimizer adam
#         recadam          --optimizer recadam + the RecAdam flags
#         recadam-coupled  --optimizer adam + --recadam-objective coupled (the penalty in the loss)
#                          + the RecAdam flags
#         sam              --optimizer samsgd --sam-type sam (Adam + SAM) + the SAM flags
#         fsam             --optimizer samsgd --sam-type fisher-sam (FSAM) + the SAM flags
#         recadam-fsam     --optimizer recadam --sam-type fisher-sam + the RecAdam and SAM flags
#         r3f              --optimizer adam, --criterion sentence_prediction_r3f --noise-type uniform
#                          --r3f-lambda 0.7 (R3F paper / fairseq examples/rxf; RTE: its recipe)
#         r4f              r3f + --spectral-norm-classification-head
#         recadam-r3f      --optimizer recadam + the RecAdam flags, with r3f's criterion and flags
#         llrd             layer-wise lr decay: --optimizer recadam --recadam-anneal-w 0 (plain Adam)
#                          --layer-lr-decay $LLRD
#         recadam-llrd     recadam + --layer-lr-decay $LLRD
#         reinit           --optimizer adam, the top $REINIT encoder layers re-initialised
#                          (--arch roberta_ft_* --reinit-layers $REINIT)
#         recadam-reinit   recadam + the reinit flags (the re-initialised layers are not pulled)
#         lora             --optimizer adam, LoRA on attention q and v (--arch roberta_ft_* --lora-rank
#                          $LORA_RANK --lora-alpha $LORA_ALPHA), the encoder frozen; LR [5e-4]
#         mixout           --optimizer adam, Mixout toward the pretrained weights on the encoder's linear
#                          layers (--arch roberta_ft_* --mixout $MIXOUT)
#         recadam-mixout   recadam + --mixout $MIXOUT (Mixout's targets are RecAdam's θ*, one copy)
#         childtune-d      ChildTuning-D: --optimizer recadam --recadam-anneal-w 0 (plain Adam)
#                          --child-tuning D --child-tuning-ratio $CHILD_RATIO
#         recadam-childtune-d  recadam + --child-tuning D --child-tuning-ratio $CHILD_RATIO
#         rdrop            --optimizer adam, --criterion sentence_prediction_rdrop --rdrop-alpha $RDROP_ALPHA
#         recadam-rdrop    recadam with rdrop's criterion and flags
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
#   K [0.1] T0 [1000] GAMMA [5000] ANNEAL_FUN [sigmoid]   RecAdam: --recadam-anneal-k, -t0,
#                 --recadam-pretrain-cof, --recadam-anneal-fun (the authors' example commands)
#   RHO [0.05] KEEP_RATIO [0.1] MASK_ITER_E [100]   SAM methods: --rho, --keep-ratio, --mask-iter-e
#   LLRD [0.9]    llrd methods: --layer-lr-decay       REINIT [2]   reinit methods: --reinit-layers
#   LORA_RANK [8] LORA_ALPHA [8]   lora: --lora-rank, --lora-alpha
#   MIXOUT [0.9]  mixout methods: --mixout       CHILD_RATIO [0.3]  childtune methods: --child-tuning-ratio
#   RDROP_ALPHA [1.0]  rdrop methods: --rdrop-alpha
#   CRITERION     [sentence_prediction_recadam; sentence_prediction_r3f for the R3F methods and
#                 sentence_prediction_rdrop for the R-Drop ones, which take no other]; with sentence_prediction the task's metric flag
#                 (--report-mcc, --report-acc-and-f1, --report-pearson-and-spearman) is added
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train] (may hold several words)
#   PYTHON        [the interpreter of FAIRSEQ_TRAIN]: reads the recipe, the checkpoint and the machine
#   RESTART=1     start the run over (its checkpoints and log are deleted)
#   DRY_RUN=1     write $RUN/command.sh and print it; train nothing
#   PRINT_RUN_DIR=1  print the run directory and exit (used by grid.sh)
#
# The run directory gets command.sh (the exact command), run.json (the settings), train.log
# (fairseq's --log-format json output, with stderr; appended to on resume) and, on success, `done`.
set -euo pipefail

die() { echo "finetune.sh: error: $*" >&2; exit 2; }
note() { echo "finetune.sh: $*" >&2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
source "$SCRIPT_DIR/common.sh"

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then usage >&2; die "expected TASK METHOD"; fi
TASK_ARG=$1 METHOD=$2
shift 2
EXTRA=("$@")
for a in ${EXTRA[@]+"${EXTRA[@]}"}; do  # fairseq-train's own help: no run directory, no done marker
  case "$a" in -h|--help) read -r -a TRAIN <<< "${FAIRSEQ_TRAIN:-fairseq-train}"; exec "${TRAIN[@]}" --help ;; esac
done

known_method "$METHOD" || die "unknown METHOD '$METHOD'; choose one of $GLUE_METHODS"
IS_R3F=0 IS_RDROP=0 IS_RECADAM=0 IS_FT=0  # the R3F / R-Drop criterion, the RecAdam flags (k, t0, γ), roberta_ft
case "$METHOD" in r3f|r4f|recadam-r3f) IS_R3F=1 ;; esac
case "$METHOD" in rdrop|recadam-rdrop) IS_RDROP=1 ;; esac
case "$METHOD" in recadam*) IS_RECADAM=1 ;; esac
case "$METHOD" in reinit|recadam-reinit|lora|mixout|recadam-mixout) IS_FT=1 ;; esac

FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"
PYTHON=${PYTHON:-$(python_of "${TRAIN[0]}")}
DRY_RUN=${DRY_RUN:-0}

# The recipe (and the task's spelling) from recadam_fairseq/core/glue_tasks.py.
ask_python --task "$TASK_ARG"

# R3F's RTE command (fairseq examples/rxf): lr 1e-5, batch 8, 3120 updates, 187 warmup
if [ "$IS_R3F" = 1 ] && [ "$TASK" = RTE ]; then
  RECIPE_LR=1e-5 RECIPE_BATCH=8 RECIPE_TOTAL=3120 RECIPE_WARMUP=187
fi
[ "$METHOD" != lora ] || RECIPE_LR=5e-4  # LoRA's lr for RoBERTa-base on GLUE (Hu et al. 2021)
LR=${LR:-$RECIPE_LR}
BATCH=${BATCH:-$RECIPE_BATCH}
TOTAL=$RECIPE_TOTAL
WARMUP=$RECIPE_WARMUP
SEED=${SEED:-1}
NUM_GPUS=${NUM_GPUS:-1}
K=${K:-0.1}
T0=${T0:-1000}
GAMMA=${GAMMA:-5000}
ANNEAL_FUN=${ANNEAL_FUN:-sigmoid}
RHO=${RHO:-0.05}
KEEP_RATIO=${KEEP_RATIO:-0.1}
MASK_ITER_E=${MASK_ITER_E:-100}
LLRD=${LLRD:-0.9}
REINIT=${REINIT:-2}
LORA_RANK=${LORA_RANK:-8}
LORA_ALPHA=${LORA_ALPHA:-8}
MIXOUT=${MIXOUT:-0.9}
CHILD_RATIO=${CHILD_RATIO:-0.3}
RDROP_ALPHA=${RDROP_ALPHA:-1.0}
for own in "r3f:$IS_R3F" "rdrop:$IS_RDROP"; do
  [ "${own#*:}" = 1 ] || continue
  own=sentence_prediction_${own%%:*}
  [ -z "${CRITERION:-}" ] || [ "$CRITERION" = "$own" ] || die "METHOD $METHOD uses CRITERION=$own, got CRITERION=$CRITERION"
  CRITERION=$own
done
CRITERION=${CRITERION:-sentence_prediction_recadam}
DATA_DIR=${DATA_DIR:-./glue-bin}
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

if [ "$IS_RECADAM" = 1 ] && awk -v t0="$T0" -v n="$TOTAL" 'BEGIN { exit !(t0 + 0 >= n + 0) }'; then
  note "note: T0=$T0 is not before the run's end ($TOTAL updates): λ(t) stays below 1/2, so RecAdam barely moves the encoder; give T0 < MAX_UPDATE"
fi

NAME=$METHOD
if [ "$IS_RECADAM" = 1 ]; then
  NAME="$METHOD-k$K-t$T0"
  [ "$GAMMA" = 5000 ] || NAME="$NAME-g$GAMMA"
  [ "$ANNEAL_FUN" = sigmoid ] || NAME="$NAME-$ANNEAL_FUN"
fi
case "$METHOD" in
  sam|fsam|recadam-fsam) NAME="$NAME-rho$RHO" ;;
  llrd|recadam-llrd) NAME="$NAME-d$LLRD" ;;
  reinit|recadam-reinit) NAME="$NAME-n$REINIT" ;;
  lora) NAME="$NAME-r$LORA_RANK-a$LORA_ALPHA" ;;
  mixout|recadam-mixout) NAME="$NAME-p$MIXOUT" ;;
  childtune-d|recadam-childtune-d) NAME="$NAME-p$CHILD_RATIO" ;;
  rdrop|recadam-rdrop) NAME="$NAME-a$RDROP_ALPHA" ;;
esac
RUN="$SAVE_DIR/$TASK/$NAME/seed$SEED"
if [ "${PRINT_RUN_DIR:-0}" = 1 ]; then echo "$RUN"; exit 0; fi

DATA="$DATA_DIR/$TASK-bin"
problems=()
if [ -z "${ROBERTA_PATH:-}" ]; then
  problems+=("ROBERTA_PATH is not set: give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.large/model.pt")
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
if [ "$IS_FT" = 1 ]; then  # the arch as the roberta_ft model's (re-init, LoRA)
  ASK+=(--ft)
  [ -z "${ARCH:-}" ] || [[ " ${ASK[*]} " == *" --arch "* ]] || ASK+=(--arch "$ARCH")
fi
[ "$FP16" = 0 ] || { [ "$DRY_RUN" = 1 ] && [ "$FP16" = 1 ]; } || ASK+=(--cuda)
[ ${#ASK[@]} = 0 ] || ask_python "${ASK[@]}"
choose_fp16
arch_flags "$([ "$IS_FT" = 1 ] && echo roberta_ft_large || echo roberta_large)"

CMD=("${TRAIN[@]}" "$DATA"
  --user-dir "$USER_DIR"
  --finetune-from-model "${ROBERTA_PATH:-}"
  --task sentence_prediction --num-classes "$NUM_CLASSES" --init-token 0 --separator-token 2
  --max-positions "$MAX_POSITIONS" --required-batch-size-multiple 1 --batch-size "$BATCH" --max-tokens 4400
  "${ARCH_FLAGS[@]}" --dropout 0.1 --attention-dropout 0.1
  --criterion "$CRITERION")
[ "$TASK" != STS-B ] || CMD+=(--regression-target)
if [ "$CRITERION" = sentence_prediction ]; then  # fairseq's criterion computes these only when asked
  case "$METRIC" in
    mcc) CMD+=(--report-mcc) ;;
    f1) CMD+=(--report-acc-and-f1) ;;
    pearson) CMD+=(--report-pearson-and-spearman) ;;
  esac
fi
case "$METHOD" in
  adam) CMD+=(--optimizer adam) ;;
  recadam) CMD+=(--optimizer recadam) ;;
  recadam-coupled) CMD+=(--optimizer adam --recadam-objective coupled) ;;
  r3f) CMD+=(--optimizer adam) ;;
  r4f) CMD+=(--optimizer adam --spectral-norm-classification-head) ;;
  recadam-r3f) CMD+=(--optimizer recadam) ;;
  sam) CMD+=(--optimizer samsgd --sam-type sam --rho "$RHO") ;;
  fsam) CMD+=(--optimizer samsgd --sam-type fisher-sam --rho "$RHO" --keep-ratio "$KEEP_RATIO"
              --mask-iter-e "$MASK_ITER_E") ;;
  recadam-fsam) CMD+=(--optimizer recadam --sam-type fisher-sam --rho "$RHO" --keep-ratio "$KEEP_RATIO"
                      --mask-iter-e "$MASK_ITER_E") ;;
  llrd) CMD+=(--optimizer recadam --recadam-anneal-w 0 --layer-lr-decay "$LLRD") ;;
  recadam-llrd) CMD+=(--optimizer recadam --layer-lr-decay "$LLRD") ;;
  reinit) CMD+=(--optimizer adam --reinit-layers "$REINIT") ;;
  recadam-reinit) CMD+=(--optimizer recadam --reinit-layers "$REINIT") ;;
  lora) CMD+=(--optimizer adam --lora-rank "$LORA_RANK" --lora-alpha "$LORA_ALPHA") ;;
  mixout) CMD+=(--optimizer adam --mixout "$MIXOUT") ;;
  recadam-mixout) CMD+=(--optimizer recadam --mixout "$MIXOUT") ;;
  childtune-d) CMD+=(--optimizer recadam --recadam-anneal-w 0 --child-tuning D --child-tuning-ratio "$CHILD_RATIO") ;;
  recadam-childtune-d) CMD+=(--optimizer recadam --child-tuning D --child-tuning-ratio "$CHILD_RATIO") ;;
  rdrop) CMD+=(--optimizer adam) ;;
  recadam-rdrop) CMD+=(--optimizer recadam) ;;
esac
[ "$IS_R3F" = 0 ] || CMD+=(--noise-type uniform --r3f-lambda 0.7)
[ "$IS_RDROP" = 0 ] || CMD+=(--rdrop-alpha "$RDROP_ALPHA")
CMD+=(--adam-betas "(0.9, 0.98)" --adam-eps 1e-06 --weight-decay 0.1 --clip-norm 0.0)
if [ "$IS_RECADAM" = 1 ]; then
  CMD+=(--recadam-anneal-fun "$ANNEAL_FUN" --recadam-anneal-k "$K" --recadam-anneal-t0 "$T0"
        --recadam-pretrain-cof "$GAMMA")
fi
CMD+=(--lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP"
  --max-update "$TOTAL")
# the recipe's 10 epochs are its update count; a MAX_UPDATE of the user's is the run's length, whatever the epochs
[ -n "${MAX_UPDATE:-}" ] || CMD+=(--max-epoch 10)
[ "$FP16" = 0 ] || CMD+=(--fp16 --fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128)
CMD+=(--find-unused-parameters)
[ "$NUM_GPUS" = 1 ] || CMD+=(--distributed-world-size "$NUM_GPUS")
# MNLI: valid = matched, valid1 = mismatched (data-prep/prepare_glue.py); the first one picks the best checkpoint
[ "$TASK" != MNLI ] || CMD+=(--valid-subset valid,valid1)
CMD+=(--best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric
  --seed "$SEED" --save-dir "$RUN" --no-epoch-checkpoints
  --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
  --log-format json --log-interval 100
  ${EXTRA[@]+"${EXTRA[@]}"})  # (this form: an empty array is "unbound" to set -u before bash 4.4)

SETTINGS="LR=$LR BATCH=$BATCH TOTAL=$TOTAL WARMUP=$WARMUP FP16=$FP16 NUM_GPUS=$NUM_GPUS$(
  [ "$IS_RECADAM" = 0 ] || echo " K=$K T0=$T0 GAMMA=$GAMMA ANNEAL_FUN=$ANNEAL_FUN")"
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
  [ "$IS_R3F" = 0 ] || printf ', "noise_type": "uniform", "r3f_lambda": "0.7"'
  case "$METHOD" in
    llrd|recadam-llrd) printf ', "layer_lr_decay": %s' "$(json_str "$LLRD")" ;;
    reinit|recadam-reinit) printf ', "reinit_layers": %s' "$(json_str "$REINIT")" ;;
    lora) printf ', "lora_rank": %s, "lora_alpha": %s' "$(json_str "$LORA_RANK")" "$(json_str "$LORA_ALPHA")" ;;
    mixout|recadam-mixout) printf ', "mixout": %s' "$(json_str "$MIXOUT")" ;;
    childtune-d|recadam-childtune-d) printf ', "child_tuning": "D", "child_tuning_ratio": %s' "$(json_str "$CHILD_RATIO")" ;;
    rdrop|recadam-rdrop) printf ', "rdrop_alpha": %s' "$(json_str "$RDROP_ALPHA")" ;;
  esac
  if [ "$IS_RECADAM" = 1 ]; then
    printf ', "k": %s, "t0": %s, "gamma": %s, "anneal_fun": %s' "$(json_str "$K")" "$(json_str "$T0")" \
      "$(json_str "$GAMMA")" "$(json_str "$ANNEAL_FUN")"
  fi
  printf '}\n'
} > "$RUN/run.json"

echo "== $TASK $METHOD seed $SEED -> $RUN"
train_and_mark_done "$RUN"
