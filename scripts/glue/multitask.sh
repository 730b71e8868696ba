#!/usr/bin/env bash
# Train one RoBERTa on several GLUE tasks at once (CA-MTL's setting) with fairseq-train.
#
#   scripts/glue/multitask.sh [extra fairseq-train args...]
#
# The paper's settings (Pilault et al., ICLR 2021, and the authors' run.py): MT-Uncertainty
# sampling, lr 2e-5, 5 epochs, batch 32, 10% linear warm-up, the lower half of the encoder layers
# frozen (0-5 of base, 0-11 of large). The rest is fairseq's RoBERTa GLUE recipe (Adam betas
# (0.9, 0.98), eps 1e-6, weight decay 0.1, dropout 0.1, polynomial decay, fp16 on a GPU). Extra args
# go last and override. Re-running the same command resumes an interrupted run (as finetune.sh).
#
# Environment (defaults in brackets):
#   ROBERTA_PATH  pretrained checkpoint (required)     DATA_DIR [./glue-bin] (data-prep/prepare_glue.py output)
#   TASKS         [CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE] (the paper's eight; any case)
#   SAMPLING      [uncertainty]  sequential | uniform | proportional | uncertainty
#   ARCH          [the checkpoint's --arch and sizes]; ca_mtl_roberta_base / _large for the task-conditioned model
#   MAX_POSITIONS [the checkpoint's]
#   FREEZE        [lower: the lower half of the layers]; none, or layers such as 0-5 (recadam_fairseq/core/layers.py)
#   METHOD        [adam]: a method of the multi-task setting (recadam: RecAdam on the shared weights, K [0.1]
#                 T0 [1000] ...), listed with their variables at the end of this help
#   LR [2e-5]  BATCH [32]  EPOCHS [5]  SEED [1]  FP16 [auto: 1 with a CUDA device]  NUM_GPUS [1]
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/MTL/<ARCH>-<SAMPLING>-<METHOD>[-k$K-t$T0...]/seed$SEED (the method
#                 named with its knobs as finetune.sh names it; summarize.py reads it)
#   FORGETTING_PROBE  [none] the forgetting meter's probe, FORGETTING_METER [mlm] | pairs (docs/forgetting-meter.md),
#                 FORGETTING_BUDGET: checkpoint_best.pt the best glue_avg among the validations that forgot at most it
#   USER_DIR      [<repo>/recadam_fairseq]   FAIRSEQ_TRAIN [fairseq-train]   PYTHON [fairseq-train's]
#   RESTART=1     start the run over        DRY_RUN=1     print the command (written to $RUN/command.sh)
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../launch.py" multitask "$0" "$@"  # recadam_fairseq/launch
