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
[ -f "$OUT/tiny/pretrained.pt" ] || python scripts/make_tiny_roberta.py "$OUT/tiny" > "$OUT/make_tiny.log" 2>&1
[ -f "$OUT/probe/dict.txt" ] || python scripts/binarize_probe.py --text "$OUT/tiny/raw/lm.valid" \
    --dict "$OUT/tiny/lm-bin/dict.txt" --out "$OUT/probe" > "$OUT/probe.log" 2>&1
# F of the pretraining objective (masked LM) on the pretraining text, then the four runs two at a time
# (recadam_fairseq/launch/demo.py: the catalogue's methods; their logs in $OUT/ewc/METHOD/train.log)
python scripts/launch.py demo "$0" "$OUT" --ewc --jobs 2 adam recadam ewc recadam-ewc
python scripts/plot_run.py "$OUT"/ewc/{adam,recadam,ewc,recadam-ewc}/train.log \
    --labels adam recadam "ewc (coupled, MLM Fisher)" "recadam-ewc (MLM Fisher)" --metric accuracy \
    --out "$OUT/ewc/runs.png" --table
