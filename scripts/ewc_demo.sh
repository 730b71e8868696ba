#!/usr/bin/env bash
# EWC's demonstration on the tiny model (docs/ewc.md): Adam, RecAdam, EWC and RecAdam-EWC with the
# masked-LM Fisher of the pretraining text, each fine-tuned as `make demo` does, with the forgetting
# meter on held-out text; plot_run.py draws the four runs and prints docs/ewc.md's table (each run's best
# dev accuracy by summarize.py's rule, the later of equal ones). Uses `make demo`'s tiny model and probe
# (made here when missing). Run from the repository's root with the venv's python and fairseq-train
# on PATH: PATH=.venv/bin:$PATH bash scripts/ewc_demo.sh   (about a minute on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-demo-out}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # two runs at a time on a model this small: one thread each
mkdir -p "$OUT/ewc"
read -r -a ARCH <<< "$(python scripts/make_tiny_roberta.py --arch-flags)"
[ -f "$OUT/tiny/pretrained.pt" ] || python scripts/make_tiny_roberta.py "$OUT/tiny" > "$OUT/make_tiny.log" 2>&1
[ -f "$OUT/probe/dict.txt" ] || python scripts/binarize_probe.py --text "$OUT/tiny/raw/lm.valid" \
    --dict "$OUT/tiny/lm-bin/dict.txt" --out "$OUT/probe" > "$OUT/probe.log" 2>&1
# F of the pretraining objective (masked LM) on the pretraining text, once for both EWC runs
python scripts/fisher.py --out "$OUT/ewc/mlm-fisher.pt" --examples 0 -- "$OUT/tiny/lm-bin" --task masked_lm \
    --criterion masked_lm "${ARCH[@]}" --tokens-per-sample 64 --batch-size 16 \
    --restore-file "$OUT/tiny/pretrained.pt" --user-dir recadam_fairseq --cpu 2> "$OUT/ewc/fisher.log"
RECADAM=(--recadam-anneal-fun sigmoid --recadam-anneal-k 0.1 --recadam-anneal-t0 50 --recadam-pretrain-cof 5000)
finetune() {  # NAME, then the method's flags
  local name=$1; shift
  mkdir -p "$OUT/ewc/$name"
  fairseq-train "$OUT/tiny/cls-bin" --user-dir recadam_fairseq --restore-file "$OUT/tiny/pretrained.pt" \
    --reset-optimizer --reset-dataloader --reset-meters --task sentence_prediction \
    --criterion sentence_prediction_recadam --num-classes 2 --init-token 0 --separator-token 2 "${ARCH[@]}" \
    --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --weight-decay 0.01 "$@" --lr 1e-4 --lr-scheduler fixed \
    --max-update 300 --batch-size 16 --cpu --num-workers 0 --seed 1 --best-checkpoint-metric accuracy \
    --maximize-best-checkpoint-metric --no-save --save-dir "$OUT/ewc/$name" --forgetting-probe "$OUT/probe" \
    --log-format json --log-interval 10 > "$OUT/ewc/$name/train.log" 2>&1 \
    || { tail -20 "$OUT/ewc/$name/train.log"; exit 1; }
}
finetune adam --optimizer recadam --recadam-anneal-fun constant &  # fairseq's adam, bit for bit
finetune recadam --optimizer recadam "${RECADAM[@]}" &
wait
finetune ewc --optimizer adam --recadam-objective coupled "${RECADAM[@]}" --ewc-fisher "$OUT/ewc/mlm-fisher.pt" &
finetune recadam-ewc --optimizer recadam "${RECADAM[@]}" --ewc-fisher "$OUT/ewc/mlm-fisher.pt" &
wait
python scripts/plot_run.py "$OUT"/ewc/{adam,recadam,ewc,recadam-ewc}/train.log \
    --labels adam recadam "ewc (coupled, MLM Fisher)" "recadam-ewc (MLM Fisher)" --metric accuracy \
    --out "$OUT/ewc/runs.png" --table
