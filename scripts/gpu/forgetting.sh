#!/usr/bin/env bash
# run.sh's forgetting stage, on the GPU machine: the forgetting harness with fairseq-train on CUDA
# (measuring on the CPU, as here). Needs the two packs of scripts/gpu/forgetting_pack.py carried in
# earlier calls. Every task's recorded runs (docs/forgetting*.json, in the tree) are reused, so only
# the missing ones train; each finished run is written to $OUT at once, so a call cut at its time
# limit keeps what finished. Back here: copy $OUT/forgetting*.json over docs/ and run
# `make forgetting-report` (a run recorded on CUDA counts as done on the CPU: same command, --cpu aside).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
[ -f forgetting-out/pretrained/model.pt ] || $PY scripts/gpu/forgetting_pack.py unpack || exit 2
TASKS=${RECADAM_GPU_FORGETTING_TASKS:-tweets nli multi movie}
status=0
for t in $TASKS; do
    prefix=forgetting$([ "$t" = movie ] || echo "-$t")
    [ -f "$OUT/$prefix.json" ] || [ ! -f "docs/$prefix.json" ] || cp "docs/$prefix.json" "$OUT/"
    $PY scripts/forgetting/run.py --task "$t" --device cuda --jobs "${RECADAM_GPU_JOBS:-6}" \
        --results "$OUT/$prefix" || status=1
done
# the second pass: a third seed where two disagree by more than the gap to Adam (as make forgetting;
# multi: to multi-task Adam)
for t in $TASKS; do
    prefix=forgetting$([ "$t" = movie ] || echo "-$t")
    $PY scripts/forgetting/run.py --task "$t" --device cuda --jobs "${RECADAM_GPU_JOBS:-6}" --results "$OUT/$prefix" \
        $($PY scripts/forgetting/summary.py --results "$OUT/forgetting" --third-seed-args "$t") || status=1
done
exit $status
