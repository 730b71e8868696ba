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

if [ ! -f "$OUT/tiny/pretrained.pt" ]; then
  echo "== making a tiny pretrained RoBERTa and tiny data in $OUT/tiny"
  mkdir -p "$OUT"
  python scripts/make_tiny_roberta.py "$OUT/tiny" > "$OUT/make_tiny.log" 2>&1 || { tail -20 "$OUT/make_tiny.log"; exit 1; }
fi

if [ ! -f "$OUT/probe/dict.txt" ]; then  # the forgetting meter's held-out text, in the model's dictionary
  python scripts/binarize_probe.py --text "$OUT/tiny/raw/lm.valid" --dict "$OUT/tiny/lm-bin/dict.txt" \
    --out "$OUT/probe" > "$OUT/probe.log" 2>&1 || { tail -20 "$OUT/probe.log"; exit 1; }
fi

# the catalogue's recadam and adam on the tiny model (recadam_fairseq/launch/demo.py: the command, the forgetting meter;
# the plug-in's criterion logs adam's distance from the pretrained weights too, for the plot)
python scripts/launch.py demo "$0" "$OUT" recadam adam
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
