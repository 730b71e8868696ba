#!/usr/bin/env bash
# Launch a fairseq-train fine-tuning (e.g. with --optimizer recadam) on several workers.
#
#   scripts/launch_multinode.sh MODE FAIRSEQ_TRAIN_ARGS...
#
# MODE
#   single-node  one node, NUM_GPUS GPUs: fairseq spawns one process per GPU
#   torchrun     one node of a multi-node job: run this on every node with its NODE_RANK
#   slurm        inside an sbatch allocation: srun starts NUM_GPUS tasks per node, fairseq reads SLURM_*
#   cpu-local    NUM_PROCS local CPU processes over gloo (testing; fairseq's spawn and torchrun
#                need CUDA devices with a CPU-only torch)
#
# Variables (defaults in brackets): NUM_GPUS [1] per node, NNODES [1], NODE_RANK [0],
# MASTER_ADDR [127.0.0.1], MASTER_PORT [29500], NUM_PROCS [2] (cpu-local),
# DDP_BACKEND [pytorch_ddp on GPUs, legacy_ddp on CPU], FAIRSEQ_TRAIN [fairseq-train],
# DRY_RUN [0]: print the command(s) instead of running them.
# RecAdam needs nothing special: every rank builds the same anchor from the same checkpoint.
set -euo pipefail
MODE=${1:?usage: $0 single-node|torchrun|slurm|cpu-local FAIRSEQ_TRAIN_ARGS...}
shift
NUM_GPUS=${NUM_GPUS:-1}; NNODES=${NNODES:-1}; NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}; MASTER_PORT=${MASTER_PORT:-29500}
NUM_PROCS=${NUM_PROCS:-2}; FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
read -r -a TRAIN <<< "$FAIRSEQ_TRAIN"

run() {
  if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

case "$MODE" in
  single-node)
    run "${TRAIN[@]}" "$@" --distributed-world-size "$NUM_GPUS" --ddp-backend "${DDP_BACKEND:-pytorch_ddp}"
    ;;
  torchrun)
    # torchrun needs a script path: resolve the fairseq-train entry point
    entry=$(command -v "${TRAIN[0]}" || echo "${TRAIN[0]}")
    run torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NUM_GPUS" \
      --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$entry" "${TRAIN[@]:1}" "$@" \
      --distributed-world-size $((NNODES * NUM_GPUS)) --ddp-backend "${DDP_BACKEND:-pytorch_ddp}"
    ;;
  slurm)
    run srun --nodes "${SLURM_NNODES:-$NNODES}" --ntasks-per-node "$NUM_GPUS" --gpus-per-task 1 \
      "${TRAIN[@]}" "$@" --distributed-port "$MASTER_PORT" --ddp-backend "${DDP_BACKEND:-pytorch_ddp}"
    ;;
  cpu-local)
    pids=()
    for ((rank = 0; rank < NUM_PROCS; rank++)); do
      run "${TRAIN[@]}" "$@" --cpu --distributed-backend gloo --distributed-world-size "$NUM_PROCS" \
        --distributed-rank "$rank" --distributed-init-method "tcp://$MASTER_ADDR:$MASTER_PORT" \
        --distributed-no-spawn --device-id 0 --ddp-backend "${DDP_BACKEND:-legacy_ddp}" &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    exit $status
    ;;
  *)
    echo "unknown MODE '$MODE': single-node, torchrun, slurm or cpu-local" >&2
    exit 2
    ;;
esac
