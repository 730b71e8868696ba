#!/usr/bin/env bash
# End-to-end RecAdam fine-tuning on tiny generated data, on CPU (run by `make demo`).
#   1. a tiny RoBERTa is "pretrained" with masked LM on generated text (scripts/make_tiny_roberta.py)
#   2. it is fine-tuned on a generated sentence classification task with --optimizer recadam
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-demo-out}
USER_DIR=$(pwd)/recadam_fairseq
TINY_ARCH=(--arch roberta --encoder-layers 2 --encoder-embed-dim 64 --encoder-ffn-embed-dim 128
           --encoder-attention-heads 2 --max-positions 64)

if [ ! -f "$OUT/tiny/pretrained.pt" ]; then
  echo "== making a tiny pretrained RoBERTa and tiny data in $OUT/tiny"
  python scripts/make_tiny_roberta.py "$OUT/tiny"
fi

echo "== fine-tuning with --optimizer recadam (log: $OUT/finetune/train.log)"
rm -rf "$OUT/finetune" && mkdir -p "$OUT/finetune"
fairseq-train "$OUT/tiny/cls-bin" \
  --user-dir "$USER_DIR" \
  --restore-file "$OUT/tiny/pretrained.pt" --reset-optimizer --reset-dataloader --reset-meters \
  --task sentence_prediction --criterion sentence_prediction --num-classes 2 \
  --init-token 0 --separator-token 2 "${TINY_ARCH[@]}" \
  --optimizer recadam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --weight-decay 0.01 \
  --recadam-anneal-fun sigmoid --recadam-anneal-k 0.1 --recadam-anneal-t0 50 --recadam-pretrain-cof 5000 \
  --lr 1e-4 --lr-scheduler fixed --max-update 300 \
  --batch-size 16 --cpu --num-workers 0 --seed 1 \
  --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric --no-epoch-checkpoints \
  --save-dir "$OUT/finetune" --log-format simple --log-interval 50 2>&1 | tee "$OUT/finetune/train.log" \
  | grep -E "recadam:|train_inner|valid on|done training"

echo
echo "== done"
echo "checkpoints: $OUT/finetune/checkpoint_best.pt, $OUT/finetune/checkpoint_last.pt"
echo "training log: $OUT/finetune/train.log"
