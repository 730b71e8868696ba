#!/usr/bin/env bash
# Fine-tune a pretrained translation model (a fairseq transformer, BART) on a language pair with one method of
# the catalogue, BLEU on two validation subsets: the new domain's and the one the model was trained on (what it
# forgets).
#
#   scripts/seq2seq/finetune.sh METHOD [extra fairseq-train args...]
#
# METHOD: a method of the catalogue (recadam_fairseq/catalogue.py) that applies to translation, listed with its
#         variables at the end of this help. `python -m recadam_fairseq methods METHOD` shows its flags; its GLUE
#         criterion becomes the seq2seq twin (label_smoothed_cross_entropy_recadam, _r3f, _rdrop).
# Extra args go last to fairseq-train, so they override the recipe (argparse keeps the last one).
#
# Resuming: the same command again continues an interrupted run from its newest checkpoint (checkpoint_last.pt
# with the optimizer's state, θ* included); a finished run is not trained again. RESTART=1 starts a run over; a
# different command for the same run directory stops.
#
# Environment (defaults in brackets):
#   PRETRAINED    the pretrained checkpoint (required)
#   DATA          the binarized pair (required): fairseq-preprocess's output, with the model's dictionaries
#   SRC, TGT      [src, tgt] the languages
#   VALID_SUBSETS [valid,test] BLEU on each at every validation; the first picks checkpoint_best.pt
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/<DATA's name>/$METHOD[-k$K-t$T0...]/seed$SEED
#   ARCH          [the checkpoint's --arch and sizes]
#   LR [5e-4]  MAX_TOKENS [4096]  MAX_UPDATE [10000]  WARMUP [6% of MAX_UPDATE, at least 1]: polynomial decay
#   LABEL_SMOOTHING [0.1]  SEED [1]  NUM_GPUS [1]  FP16 [auto: 1 with a CUDA device, else 0 (fp32)]
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]: a checkpoint (and validation) every N updates
#   BEAM [4]      the beam of --eval-bleu's translations
#   DETOK [space] --eval-bleu-detok: moses for Moses-tokenized text (space: none, for text never tokenized)
#   REMOVE_BPE    --eval-bleu-remove-bpe when the data is BPE'd: subword_nmt, sentencepiece
#   the method's knobs, each from its variable: K [0.1] T0 [1000] GAMMA [5000] ANNEAL_FUN [sigmoid] (RecAdam),
#                 R3F_LAMBDA, RHO, KEEP_RATIO, MASK_ITER_E, LLRD, CHILD_RATIO, RDROP_ALPHA [1.0; the R-Drop
#                 authors' translation recipe: 5] (python -m recadam_fairseq methods METHOD)
#   LOG_INTERVAL  [100]  USER_DIR [<repo>/recadam_fairseq]  FAIRSEQ_TRAIN [fairseq-train] (may hold several words)
#   PYTHON        [the interpreter of FAIRSEQ_TRAIN]: reads the catalogue, the checkpoint and the machine
#   RESTART=1     start the run over (its checkpoints and log are deleted)
#   DRY_RUN=1     write $RUN/command.sh and print it; train nothing
#
# The run directory gets command.sh (the exact command), run.json (the settings), train.log (fairseq's
# --log-format json output, with stderr; appended to on resume) and, on success, `done`. The terminal: a line
# per log interval and validation (with BLEU's change since the pretrained weights, --eval-bleu-start: measured
# once before update 1, kept in bleu_start.json), and at the end the best BLEU on the first subset with the
# others' there and their change.
set -euo pipefail

die() { echo "finetune.sh: error: $*" >&2; exit 2; }
note() { echo "finetune.sh: $*" >&2; }
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCRIPT_DIR=$REPO_DIR/scripts/glue  # the task scripts' shared helpers: common.sh, prelaunch.py, summarize.py
METHODS_OF=--seq2seq  # usage lists the catalogue's METHODs of this script
source "$SCRIPT_DIR/common.sh"

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 1 ]; then usage >&2; die "expected METHOD"; fi
METHOD=$1
shift
EXTRA=("$@")

FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"
PYTHON=${PYTHON:-$(python_of "${TRAIN[0]}")}
DRY_RUN=${DRY_RUN:-0}

ask_python --method "$METHOD" --seq2seq  # METHOD in the catalogue's spelling, its flags, K, T0, ... their values
CRITERION=$METHOD_CRITERION
LR=${LR:-${METHOD_LR:-5e-4}}
MAX_TOKENS=${MAX_TOKENS:-4096}
TOTAL=${MAX_UPDATE:-10000}
SEED=${SEED:-1}
NUM_GPUS=${NUM_GPUS:-1}
SRC=${SRC:-src} TGT=${TGT:-tgt}
VALID_SUBSETS=${VALID_SUBSETS:-valid,test}
BEAM=${BEAM:-4}
DETOK=${DETOK:-space}
LABEL_SMOOTHING=${LABEL_SMOOTHING:-0.1}
SAVE_DIR=${SAVE_DIR:-runs}
USER_DIR=${USER_DIR:-$REPO_DIR/recadam_fairseq}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
for v in SEED MAX_TOKENS TOTAL NUM_GPUS BEAM; do
  is_uint "${!v}" || die "${v/TOTAL/MAX_UPDATE} must be a non-negative integer, got '${!v}'"
done
[ "$TOTAL" -gt 0 ] || die "MAX_UPDATE must be positive"
WARMUP=${WARMUP:-$(( TOTAL * 6 / 100 ))}
is_uint "$WARMUP" || die "WARMUP must be a non-negative integer, got '$WARMUP'"
[ "$WARMUP" -ge 1 ] || WARMUP=1
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(default_save_interval "$TOTAL")}
is_uint "$SAVE_INTERVAL_UPDATES" && [ "$SAVE_INTERVAL_UPDATES" -gt 0 ] ||
  die "SAVE_INTERVAL_UPDATES must be a positive integer, got '$SAVE_INTERVAL_UPDATES'"

problems=()
if [ -z "${PRETRAINED:-}" ]; then
  problems+=("PRETRAINED is not set: give the pretrained checkpoint, e.g. PRETRAINED=wmt19.en-de/model1.pt")
elif [ ! -f "$PRETRAINED" ]; then
  problems+=("PRETRAINED=$PRETRAINED: no such file")
fi
if [ -z "${DATA:-}" ]; then
  problems+=("DATA is not set: give the binarized pair (fairseq-preprocess --destdir)")
else  # fairseq names a split's files by the pair in either order
  for split in train ${VALID_SUBSETS//,/ }; do
    [ -f "$DATA/$split.$SRC-$TGT.$SRC.idx" ] || [ -f "$DATA/$split.$TGT-$SRC.$SRC.idx" ] ||
      problems+=("DATA=$DATA has no $split split for $SRC-$TGT (no $DATA/$split.$SRC-$TGT.$SRC.idx; SRC, TGT, VALID_SUBSETS name them)")
  done
fi
if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do
    if [ "$DRY_RUN" = 1 ]; then echo "finetune.sh: warning: $p" >&2; else echo "finetune.sh: error: $p" >&2; fi
  done
  [ "$DRY_RUN" = 1 ] || exit 2
fi
RUN="$SAVE_DIR/$(basename "${DATA:-data}")/$METHOD_NAME/seed$SEED"

# The checkpoint's architecture unless ARCH says; whether there is a GPU unless FP16 says.
FP16=${FP16:-auto}
[[ $FP16 == 0 || $FP16 == 1 || $FP16 == auto ]] || die "FP16 must be 0, 1 or auto, got '$FP16'"
ASK=(--seq2seq)
[ -z "${PRETRAINED:-}" ] || [ ! -f "$PRETRAINED" ] || [ -n "${ARCH:-}" ] || ASK+=(--checkpoint "$PRETRAINED")
[ "$FP16" = 0 ] || { [ "$DRY_RUN" = 1 ] && [ "$FP16" = 1 ]; } || ASK+=(--cuda)
ask_python "${ASK[@]}"
choose_fp16
schedule_warnings "$TOTAL"
arch_flags transformer

BLEU_ARGS="{\"beam\": $BEAM}"
CMD=("${TRAIN[@]}" "${DATA:-}"
  --user-dir "$USER_DIR"
  --finetune-from-model "${PRETRAINED:-}"
  --task translation --source-lang "$SRC" --target-lang "$TGT" --max-tokens "$MAX_TOKENS"
  "${ARCH_FLAGS[@]}"
  --criterion "$CRITERION" --label-smoothing "$LABEL_SMOOTHING"
  "${METHOD_FLAGS[@]}" --adam-betas "(0.9, 0.98)" --adam-eps 1e-08 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP"
  --max-update "$TOTAL"
  --eval-bleu --eval-bleu-args "$BLEU_ARGS" --eval-bleu-detok "$DETOK" --eval-bleu-start)
[ -z "${REMOVE_BPE:-}" ] || CMD+=(--eval-bleu-remove-bpe "$REMOVE_BPE")
[ "$FP16" = 0 ] || CMD+=(--fp16)
[ "$NUM_GPUS" = 1 ] || CMD+=(--distributed-world-size "$NUM_GPUS")
CMD+=(--valid-subset "$VALID_SUBSETS" --best-checkpoint-metric bleu --maximize-best-checkpoint-metric
  --seed "$SEED" --save-dir "$RUN" --no-epoch-checkpoints
  --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates 1
  --log-format json --log-interval "${LOG_INTERVAL:-100}"
  ${EXTRA[@]+"${EXTRA[@]}"})  # (this form: an empty array is "unbound" to set -u before bash 4.4)

SETTINGS="LR=$LR MAX_TOKENS=$MAX_TOKENS TOTAL=$TOTAL WARMUP=$WARMUP FP16=$FP16 NUM_GPUS=$NUM_GPUS${METHOD_SETTINGS:+ $METHOD_SETTINGS}"
METRIC=bleu SUMMARY_METRIC=bleu  # the follower's and the end lines' metric
write_command "$RUN" "$(basename "${DATA:-data}") $METHOD seed $SEED" "$SETTINGS" "${#TRAIN[@]}" "${CMD[@]}"

if [ "$DRY_RUN" = 1 ]; then
  cat "$RUN/command.sh"
  exit 0
fi

json_str() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
{
  printf '{"data": %s, "method": %s, "seed": %s' "$(json_str "$DATA")" "$(json_str "$METHOD")" "$SEED"
  printf ', "metric": "bleu", "valid_subsets": %s, "lr": %s' "$(json_str "$VALID_SUBSETS")" "$(json_str "$LR")"
  printf ', "total_updates": %s, "warmup_updates": %s' "$TOTAL" "$WARMUP"
  printf '%s' "$METHOD_JSON"
  printf '}\n'
} > "$RUN/run.json"

echo "== $(basename "$DATA") $METHOD seed $SEED -> $RUN"
train_and_mark_done "$RUN"
