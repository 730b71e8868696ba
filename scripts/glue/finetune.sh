#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with fairseq's recipe: Adam, RecAdam, R3F/R4F, SAM/FSAM, the baselines
# (LLRD, re-init, LoRA, Mixout, ChildTuning, R-Drop) or RecAdam combined with one of them.
#
#   scripts/glue/finetune.sh TASK METHOD [extra fairseq-train args...]
#
# TASK:   MNLI QNLI QQP RTE SST-2 MRPC CoLA STS-B (case-insensitive), or a task of yours: its name, with
#         $DATA_DIR/NAME-bin/labels.json (data-prep/prepare_task.py); its recipe: lr 2e-5, batch 16, 10 epochs of
#         its training set with a 6% warmup (the small GLUE tasks'), its classes and metric from labels.json
# METHOD: a method of the catalogue (recadam_fairseq/catalogue.py; the table in docs/glue.md), listed with its
#         variables at the end of this help. `python -m recadam_fairseq methods METHOD` shows its flags.
# Extra args go last to fairseq-train, so they override the recipe (argparse keeps the last one).
#
# Resuming: the same command again continues an interrupted run from its newest checkpoint (fairseq's
# --finetune-from-model: checkpoint_last.pt with the optimizer's state, θ* included); a checkpoint_last.pt
# that does not load is set aside and the newest complete checkpoint taken instead. A finished run is
# not trained again. RESTART=1 starts a run over; a different command for the same run directory stops.
#
# Environment (defaults in brackets):
#   ROBERTA_PATH  pretrained checkpoint (required)     DATA_DIR  [./glue-bin], data at $DATA_DIR/$TASK-bin
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/$TASK/$METHOD[-k$K-t$T0]/seed$SEED
#   ARCH          [the checkpoint's --arch and sizes]  MAX_POSITIONS [the checkpoint's]
#   LR, BATCH [the recipe's]  SEED [1]  NUM_GPUS [1]
#   FP16          [auto: 1 with a CUDA device, else 0 (fp32)]
#   MAX_UPDATE    total updates [the recipe's: 10 epochs]; warmup is scaled in proportion (at least 1), and the
#                 run stops there however many epochs that takes
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]: a checkpoint (and validation) every N updates
#   the method's knobs, each from its variable (listed at the end): K [0.1] T0 [1000] GAMMA [5000] (RecAdam),
#                 EWC_FISHER [task] (ewc, recadam-ewc: task, or a file of scripts/fisher.py), RHO, LLRD, ...
#   CRITERION     [sentence_prediction_recadam; the method's own where it has one (R3F, R-Drop, the coupled
#                 objective), which takes no other]; with sentence_prediction the task's metric flag
#                 (--report-mcc, --report-acc-and-f1, --report-pearson-and-spearman) is added
#   FORGETTING_PROBE  a probe directory (scripts/binarize_probe.py): the forgetting meter logs what the model
#                 loses from pretraining at each validation; FORGETTING_METER [mlm] | pairs (docs/forgetting-meter.md)
#   FORGETTING_BUDGET  with the meter: checkpoint_best.pt is the best validation among those that forgot at most
#                 this (the masked-LM loss's rise in bits, or the pair AUC's fall)
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train] (may hold several words)
#   PYTHON        [the interpreter of FAIRSEQ_TRAIN]: reads the recipe, the checkpoint and the machine
#   RESTART=1     start the run over (its checkpoints and log are deleted)
#   DRY_RUN=1     write $RUN/command.sh and print it; train nothing
#
# The run directory gets command.sh (the exact command), run.json (the settings), train.log
# (fairseq's --log-format json output, with stderr, written by fairseq-train; appended to on resume) and, on
# success, `done`. The terminal: a line per log interval and validation, the best dev score at the end.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../launch.py" finetune "$0" "$@"  # recadam_fairseq/launch
