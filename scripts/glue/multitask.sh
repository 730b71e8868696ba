#!/usr/bin/env bash
# Train one RoBERTa on several GLUE tasks at once (CA-MTL's setting) with fairseq-train.
#
#   scripts/glue/multitask.sh [extra fairseq-train args...]
#
# The paper's settings (Pilault et al., ICLR 2021, and the authors' run.py): MT-Uncertainty
# sampling, lr 2e-5, 5 epochs, batch 32, 10% linear warm-up, encoder layers 0-5 (base) or 0-11
# (large) frozen. The rest is fairseq's RoBERTa GLUE recipe (Adam betas (0.9, 0.98), eps 1e-6,
# weight decay 0.1, dropout 0.1, polynomial decay, fp16). Extra args go last and override.
#
# Environment (defaults in brackets):
#   ROBERTA_PATH  pretrained checkpoint (required)     DATA_DIR [./glue-bin] (data-prep/prepare_glue.py output)
#   TASKS         [CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE] (the paper's eight; WNLI left out)
#   SAMPLING      [uncertainty]  sequential | uniform | proportional | uncertainty
#   ARCH          [roberta_base]; ca_mtl_roberta_base / _large for the task-conditioned model
#   FREEZE        [0-5 for *_base, 0-11 for *_large]; "none" freezes nothing
#   METHOD        [adam] or recadam (K [0.1] T0 [1000] GAMMA [5000]: RecAdam on the shared weights)
#   LR [2e-5]  BATCH [32]  EPOCHS [5]  SEED [1]  FP16 [1]  NUM_GPUS [1]
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/MTL/<ARCH>-<SAMPLING>-<METHOD>/seed$SEED (summarize.py reads it)
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train]   PYTHON [python3]
#   DRY_RUN=1     print the command (written to $RUN/command.sh); train nothing
set -euo pipefail

die() { echo "multitask.sh: error: $*" >&2; exit 2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)

TASKS=${TASKS:-CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE}
SAMPLING=${SAMPLING:-uncertainty}
ARCH=${ARCH:-roberta_base}
METHOD=${METHOD:-adam}
LR=${LR:-2e-5}
BATCH=${BATCH:-32}
EPOCHS=${EPOCHS:-5}
SEED=${SEED:-1}
FP16=${FP16:-1}
NUM_GPUS=${NUM_GPUS:-1}
K=${K:-0.1}
T0=${T0:-1000}
GAMMA=${GAMMA:-5000}
DATA_DIR=${DATA_DIR:-./glue-bin}
SAVE_DIR=${SAVE_DIR:-runs}
USER_DIR=${USER_DIR:-$REPO_DIR/recadam_fairseq}
FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
case "$ARCH" in
  *large*) FREEZE=${FREEZE:-0-11} ;;
  *) FREEZE=${FREEZE:-0-5} ;;
esac
case "$SAMPLING" in sequential|uniform|proportional|uncertainty) ;;
  *) die "unknown SAMPLING '$SAMPLING'; choose one of sequential uniform proportional uncertainty" ;; esac
case "$METHOD" in adam|recadam) ;; *) die "unknown METHOD '$METHOD'; choose adam or recadam" ;; esac
[[ $BATCH =~ ^[1-9][0-9]*$ ]] || die "BATCH must be a positive integer, got '$BATCH'"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || die "EPOCHS must be a positive integer, got '$EPOCHS'"
[[ $NUM_GPUS =~ ^[1-9][0-9]*$ ]] || die "NUM_GPUS must be a positive integer, got '$NUM_GPUS'"

# Updates per epoch: every sampling mode takes sum_t ceil(n_t / BATCH) batches per epoch, shared by the GPUs.
if [ "$DRY_RUN" = 1 ] && [ ! -d "$DATA_DIR" ]; then
  PER_EPOCH=1000; echo "multitask.sh: warning: no $DATA_DIR; assuming $PER_EPOCH updates per epoch" >&2
else
  PER_EPOCH=$("$PYTHON" - "$DATA_DIR" "$TASKS" "$BATCH" "$NUM_GPUS" <<'EOF'
import math, os, struct, sys
data, tasks, batch, gpus = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
steps = 0
for t in tasks:
    idx = os.path.join(data, f"{t}-bin", "input0", "train.idx")
    if not os.path.exists(idx):
        sys.exit(f"multitask.sh: error: no {idx} (make it with data-prep/prepare_glue.py --tasks {t})")
    with open(idx, "rb") as f:  # fairseq's mmap index: magic (9 bytes), version (8), dtype (1), count (8)
        head = f.read(26)
    if head[:9] != b"MMIDIDX\x00\x00":
        sys.exit(f"multitask.sh: error: {idx} is not a fairseq mmap index")
    steps += math.ceil(struct.unpack("<Q", head[18:26])[0] / batch)
print(max(1, math.ceil(steps / gpus)))
EOF
) || exit 2
fi
TOTAL=$((PER_EPOCH * EPOCHS))
WARMUP=$(( TOTAL / 10 > 0 ? TOTAL / 10 : 1 ))

NAME="$ARCH-$SAMPLING-$METHOD"
RUN="$SAVE_DIR/MTL/$NAME/seed$SEED"
if [ -z "${ROBERTA_PATH:-}" ] || [ ! -f "${ROBERTA_PATH:-}" ]; then
  msg="ROBERTA_PATH='${ROBERTA_PATH:-}': give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.base/model.pt"
  if [ "$DRY_RUN" = 1 ]; then echo "multitask.sh: warning: $msg" >&2; else die "$msg"; fi
fi

read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"
CMD=("${TRAIN[@]}" "$DATA_DIR" --user-dir "$USER_DIR"
  --restore-file "${ROBERTA_PATH:-}" --reset-optimizer --reset-dataloader --reset-meters
  --task glue_multitask --mt-tasks "$TASKS" --mt-sampling "$SAMPLING" --criterion glue_multitask
  --init-token 0 --separator-token 2 --max-positions 512
  --arch "$ARCH" --dropout 0.1 --attention-dropout 0.1
  --batch-size "$BATCH" --required-batch-size-multiple 1 --max-epoch "$EPOCHS"
  --optimizer "$METHOD" --adam-betas "(0.9, 0.98)" --adam-eps 1e-06 --weight-decay 0.1 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --total-num-update "$TOTAL" --warmup-updates "$WARMUP"
  --max-update "$TOTAL")
[ "$FREEZE" = none ] || CMD+=(--freeze-encoder-layers "$FREEZE")
[ "$METHOD" != recadam ] || CMD+=(--recadam-anneal-k "$K" --recadam-anneal-t0 "$T0" --recadam-pretrain-cof "$GAMMA")
[ "$FP16" = 0 ] || CMD+=(--fp16 --fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128)
[ "$NUM_GPUS" = 1 ] || CMD+=(--distributed-world-size "$NUM_GPUS")
[[ ",$TASKS," != *",MNLI,"* ]] || CMD+=(--valid-subset valid,valid1)  # MNLI-mm as valid1
CMD+=(--find-unused-parameters --best-checkpoint-metric glue_avg --maximize-best-checkpoint-metric
  --seed "$SEED" --save-dir "$RUN" --no-epoch-checkpoints --log-format json --log-interval 100
  "$@")

mkdir -p "$RUN"
printf '%q ' "${CMD[@]}" > "$RUN/command.sh"
echo >> "$RUN/command.sh"
if [ "$DRY_RUN" = 1 ]; then cat "$RUN/command.sh"; exit 0; fi
rm -f "$RUN/done" "$RUN/train.log"
echo "== multi-task $TASKS ($SAMPLING, $ARCH, $METHOD) seed $SEED -> $RUN"
set +e
"${CMD[@]}" 2>&1 | tee "$RUN/train.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || { echo "multitask.sh: error: fairseq-train failed (exit $rc); see $RUN/train.log" >&2; exit "$rc"; }
date '+%Y-%m-%d %H:%M:%S' > "$RUN/done"
echo "== done: $RUN (python scripts/glue/summarize.py $SAVE_DIR)"
