#!/usr/bin/env bash
# End-to-end RecAdam fine-tuning on tiny generated data, on CPU (run by `make demo`).
#   1. a tiny RoBERTa is "pretrained" with masked LM on generated text (scripts/make_tiny_roberta.py)
#   2. it is fine-tuned on a generated sentence classification task with --optimizer recadam,
#      and, for comparison, with fairseq's adam (the plug-in's criterion logs its distance from θ* too)
#   3. scripts/plot_run.py draws λ(t), the distance to the pretrained weights, the losses and accuracy, and the
#      forgetting meter's masked-LM loss and accuracy on held-out text against the pretrained model's
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-demo-out}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # a model this small trains fastest on one thread (2x on 2 cores)
USER_DIR=$(pwd)/recadam_fairseq
read -r -a TINY_ARCH <<< "$(python scripts/make_tiny_roberta.py --arch-flags)"  # what the tiny model was built with

if [ ! -f "$OUT/tiny/pretrained.pt" ]; then
  echo "== making a tiny pretrained RoBERTa and tiny data in $OUT/tiny"
  mkdir -p "$OUT"
  python scripts/make_tiny_roberta.py "$OUT/tiny" > "$OUT/make_tiny.log" 2>&1 || { tail -20 "$OUT/make_tiny.log"; exit 1; }
fi

if [ ! -f "$OUT/probe/dict.txt" ]; then  # the forgetting meter's held-out text, in the model's dictionary
  python scripts/binarize_probe.py --text "$OUT/tiny/raw/lm.valid" --dict "$OUT/tiny/lm-bin/dict.txt" \
    --out "$OUT/probe" > "$OUT/probe.log" 2>&1 || { tail -20 "$OUT/probe.log"; exit 1; }
fi

finetune() {  # NAME, then optimizer flags
  local name=$1; shift
  echo "== fine-tuning: $name (log: $OUT/$name/train.log)"
  rm -rf "${OUT:?}/$name" && mkdir -p "$OUT/$name"
  fairseq-train "$OUT/tiny/cls-bin" \
    --user-dir "$USER_DIR" \
    --restore-file "$OUT/tiny/pretrained.pt" --reset-optimizer --reset-dataloader --reset-meters \
    --task sentence_prediction --criterion sentence_prediction_recadam --num-classes 2 \
    --init-token 0 --separator-token 2 "${TINY_ARCH[@]}" \
    --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --weight-decay 0.01 "$@" \
    --lr 1e-4 --lr-scheduler fixed --max-update 300 \
    --batch-size 16 --cpu --num-workers 0 --seed 1 \
    --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric --no-epoch-checkpoints \
    --forgetting-probe "$OUT/probe" \
    --save-dir "$OUT/$name" --log-format json --log-interval 10 --tensorboard-logdir "$OUT/$name/tb" \
    > "$OUT/$name/train.log" 2>&1 \
    || { tail -30 "$OUT/$name/train.log"; exit 1; }
  grep -E "recadam: pretrained|recadam_dist: |done training" "$OUT/$name/train.log" | cut -d'|' -f4-
  echo "   $(python scripts/glue/summarize.py --run "$OUT/$name")"
}

finetune recadam --optimizer recadam \
  --recadam-anneal-fun sigmoid --recadam-anneal-k 0.1 --recadam-anneal-t0 50 --recadam-pretrain-cof 5000
# fairseq's adam: the plug-in's criterion logs its distance from the pretrained weights for the plot
finetune adam --optimizer adam

python scripts/plot_run.py "$OUT/recadam/train.log" "$OUT/adam/train.log" --labels recadam adam \
  --out "$OUT/runs.png" > /dev/null

echo
echo "== done"
echo "checkpoints: $OUT/recadam/checkpoint_best.pt, $OUT/recadam/checkpoint_last.pt (and $OUT/adam/)"
echo "logs:        $OUT/recadam/train.log, $OUT/adam/train.log (fairseq json)"
if compgen -G "$OUT/recadam/tb/train_inner/events.out.tfevents.*" > /dev/null; then
  echo "tensorboard: $OUT/recadam/tb, $OUT/adam/tb; view both with"
  echo "             tensorboard --logdir $OUT --port 6006   (then open http://localhost:6006)"
else
  echo "tensorboard: none written (pip install tensorboard, or recadam-fairseq[tensorboard])"
fi
echo "plot:        $OUT/runs.png"
