#!/usr/bin/env bash
# The GPU pass, on the GPU machine (no fairseq, no network there):
#   here:   bash scripts/gpu/wheels.sh                       (once: fairseq-fixed + its needs into .whl/)
#   there:  bash scripts/gpu/run.sh STAGE...                 (device call with carry: [".whl"])
# Stages (a device call is limited to 10 minutes: the stages of one call share RECADAM_GPU_BUDGET_S,
# default 570 s; a session has 15 minutes of device time, the machine's start included). Seen on an
# H100 (2026-11-26): tests 124 s, bench 48 s, bench-per-tensor 102 s (284 s cold on the H200 of pass 5; inductor compiles a 74-tensor
# program, ~30-50 s, twice), e2e-recadam 310 s, one roberta-base fairseq-train run 25-35 s (e2e: 19
# runs, ~10 min, a call of its own). So: "tests bench-per-tensor e2e-recadam" in one call, "e2e" in
# the next while the machine is warm.
#   check        versions, the GPU, fairseq and the plug-in import (every stage starts with it)
#   tests        every test marked gpu (RECADAM_GPU_TEST_WORKERS xdist workers; 0: serial)    -> gpu-tests.log
#   suite        the whole suite (the forgetting harness needs the 83 MB model: left out) -> suite.log
#   bench        the optimizer-step benchmark on CUDA, flat layout, base and large -> bench.log, benchmark.{md,json}
#   bench-per-tensor  the same, per-tensor layout, base shapes, with inductor's combo kernels (recadam-combo)
#                and the multi-tensor program as a CUDA graph (recadam-cudagraph)
#                                                                                -> bench-pt.log, benchmark-pt.{md,json}
#   e2e-recadam  fairseq-train --fp16 roberta-base: adam, recadam, bf16 anchor, 3 rounds -> e2e-recadam.{log,md,json}
#   e2e          every method against its base, 1 round                          -> e2e.{log,md,json}
#   e2e-per-tensor  fp32 fairseq-train: adam, recadam, recadam --recadam-fused cuda-graph, 2 rounds -> e2e-pt.{log,md,json}
#   fsdp         --ddp-backend fully_sharded at world size 1 (fairscale's FSDP needs CUDA): recadam's one-line
#                refusal, fairseq's adam under FSDP --fp16 ends as unsharded (tests/test_flat_shards.py) -> fsdp.log
#   forgetting   the forgetting harness, fairseq-train on CUDA (scripts/gpu/forgetting.sh; first carry
#                .fgpack0 and .fgpack1 of scripts/gpu/forgetting_pack.py, one call each) -> forgetting*.json
# Logs and results go to $OUT (the device tool's folder; here: gpu-out/). The exit status is the
# first failing stage's, after all stages ran.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${RECADAM_GPU_SITE:-/tmp/recadam-gpu-site}
export PYTHONUNBUFFERED=1

STAGES="check tests suite bench bench-per-tensor e2e-recadam e2e e2e-per-tensor fsdp forgetting"
for s in "$@"; do
    case " $STAGES " in *" $s "*) ;; *) echo "run.sh: unknown stage '$s' (one of: $STAGES)" >&2; exit 2 ;; esac
done

# fairseq from the carried wheels, unless this Python has it (RECADAM_GPU_WHEELS=1: install anyway)
if [ -n "${RECADAM_GPU_WHEELS:-}" ] || ! $PY -c "import fairseq" 2>/dev/null; then
    if ! ls .whl/fairseq_fixed-*.whl >/dev/null 2>&1; then
        echo "run.sh: no fairseq here and no .whl/fairseq_fixed-*.whl: run scripts/gpu/wheels.sh, carry .whl" >&2
        exit 2
    fi
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        || { echo "run.sh: installing .whl/ into $SITE failed" >&2; exit 2; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# the plug-in from this working tree, as the editable install of `make` does
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"

check() {
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY - <<'EOF'
import platform, torch, fairseq, recadam_fairseq
recadam_fairseq.register()
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.criterions import CRITERION_REGISTRY
assert "recadam" in OPTIMIZER_REGISTRY and "samsgd" in OPTIMIZER_REGISTRY, "the plug-in's optimizers are not registered"
assert "sentence_prediction_r3f" in CRITERION_REGISTRY and "glue_multitask" in CRITERION_REGISTRY
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
      f"fairseq {fairseq.__version__} from {fairseq.__file__} | recadam_fairseq from {recadam_fairseq.__file__} | "
      f"GPU: {torch.cuda.get_device_name(0) if cuda else 'none'}")
EOF
}

status=0
# A device call is killed at 600 s: stages share this budget (seconds from the start), a stage that
# would outlast it is stopped (its log and partial results stay in $OUT), later ones are skipped.
BUDGET=${RECADAM_GPU_BUDGET_S:-570}
stage() {  # stage NAME LOG COMMAND...: run, log to $OUT/LOG and the console, keep the first failure
    local name=$1 log=$2; shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 30 ]; then
        echo "== $name: skipped, ${left} s of the ${BUDGET} s budget left (run it in its own call)" | tee "$OUT/$log"
        [ "$status" -ne 0 ] || status=124
        return
    fi
    { echo "$CHECK"; echo "== $name (at most $left s): $*"; } | tee "$OUT/$log"
    local t=$SECONDS
    timeout --signal=INT --kill-after=10 "$left" "$@" 2>&1 | tee -a "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -ne 124 ] || echo "== $name: stopped at the budget; what finished is in $OUT" | tee -a "$OUT/$log"
    echo "== $name: exit $rc, $((SECONDS - t)) s" | tee -a "$OUT/$log"
    [ "$status" -ne 0 ] || status=$rc
}

CHECK=$(check 2>&1) || { echo "$CHECK" >&2; echo "run.sh: the check failed" >&2; exit 2; }
echo "$CHECK"
[ $# -gt 0 ] || set -- check
WORKERS=${RECADAM_GPU_WORKERS:-8}
for s in "$@"; do
    case $s in
    check) ;;
    # pass 4: 4 workers took 244 s against pass 3's 124 s serial (one more test): serial by default
    tests) stage tests gpu-tests.log $PY -m pytest -m gpu -v -rA -p no:cacheprovider \
               -n "${RECADAM_GPU_TEST_WORKERS:-0}" --dist loadfile ;;
    suite) stage suite suite.log $PY -m pytest -n "$WORKERS" --dist loadfile -q -p no:cacheprovider \
               --ignore tests/test_forgetting.py ;;
    bench) stage bench bench.log $PY scripts/benchmark.py --device cuda --sizes base large --layouts flat \
               --out-md "$OUT/benchmark.md" --out-json "$OUT/benchmark.json" ;;
    # TORCH_LOGS=recompiles: pass 5 timed recadam-ewc at the eager step's speed; a recompiling program says so here
    bench-per-tensor) stage bench-per-tensor bench-pt.log env TORCH_LOGS=recompiles $PY scripts/benchmark.py --device cuda --sizes base \
               --layouts per-tensor --impls recadam recadam-cudagraph recadam-cudagraph-all recadam-combo recadam-foreach \
               recadam-bf16-anchor recadam-ewc fairseq-adam torch-adamw-foreach torch-adamw-fused \
               --out-md "$OUT/benchmark-pt.md" --out-json "$OUT/benchmark-pt.json" ;;
    e2e-recadam) stage e2e-recadam e2e-recadam.log $PY scripts/gpu/e2e_overhead.py \
               --methods adam recadam recadam-bf16-anchor --rounds 3 \
               --out-md "$OUT/e2e-recadam.md" --out-json "$OUT/e2e-recadam.json" ;;
    # fp32 fairseq-train (the per-tensor layout): recadam with and without --recadam-fused cuda-graph, 2 rounds;
    # the log says how often the graph was captured (captures stop at 16 when the gradients keep moving)
    e2e-per-tensor) stage e2e-per-tensor e2e-pt.log $PY scripts/gpu/e2e_overhead.py --precision fp32 --rounds 2 \
               --methods recadam-cudagraph --warmup-runs 0 --out-md "$OUT/e2e-pt.md" --out-json "$OUT/e2e-pt.json" ;;
    # RECADAM_E2E_METHODS="a b ...": a subset (each method's base is added), to split e2e over device calls
    # RECADAM_E2E_WARMUP=0: no untimed first run (the machine already warm from earlier stages)
    # RECADAM_E2E_UPDATES=60: shorter runs (3 log intervals of 20), to fit more methods in a call
    e2e) stage e2e e2e.log $PY scripts/gpu/e2e_overhead.py --rounds 1 ${RECADAM_E2E_METHODS:+--methods $RECADAM_E2E_METHODS} \
               --warmup-runs "${RECADAM_E2E_WARMUP:-1}" --updates "${RECADAM_E2E_UPDATES:-120}" \
               --out-md "$OUT/e2e.md" --out-json "$OUT/e2e.json" ;;
    fsdp) stage fsdp fsdp.log $PY -m pytest -m gpu -v -rA -p no:cacheprovider tests/test_flat_shards.py ;;
    forgetting) stage forgetting forgetting.log env PYTHON="$PY" OUT="$OUT" bash scripts/gpu/forgetting.sh ;;
    esac
done
exit $status
