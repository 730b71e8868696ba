#!/usr/bin/env bash
# Fine-tune a pretrained translation model (a fairseq transformer, BART) on a language pair with one method of
# the catalogue, BLEU on two validation subsets: the new domain's and the one the model was trained on (what it
# forgets).
#
#   scripts/seq2seq/finetune.sh METHOD [extra fairseq-train args...]
#
# METHOD: a method of the catalogue (recadam_fairseq/catalogue.py) that applies to translation, listed with its
#         variables at the end of this help. `python -m recadam_fairseq methods METHOD` shows its flags; its GLUE
#         criterion becomes the seq2seq twin (label_smoothed_cross_entropy_recadam, _r3f, _rdrop).
# Extra args go last to fairseq-train, so they override the recipe (argparse keeps the last one).
#
# Resuming: the same command again continues an interrupted run from its newest checkpoint (checkpoint_last.pt
# with the optimizer's state, θ* included); a finished run is not trained again. RESTART=1 starts a run over; a
# different command for the same run directory stops.
#
# Environment (defaults in brackets):
#   PRETRAINED    the pretrained checkpoint (required)
#   DATA          the binarized pair (required): fairseq-preprocess's output, with the model's dictionaries
#   SRC, TGT      [src, tgt] the languages
#   VALID_SUBSETS [valid,test] BLEU on each at every validation; the first picks checkpoint_best.pt
#   SAVE_DIR      [runs]; the run is $SAVE_DIR/<DATA's name>/$METHOD[-k$K-t$T0...]/seed$SEED
#   ARCH          [the checkpoint's --arch and sizes]
#   LR [5e-4]  MAX_TOKENS [4096]  MAX_UPDATE [10000]  WARMUP [6% of MAX_UPDATE, at least 1]: polynomial decay
#   LABEL_SMOOTHING [0.1]  SEED [1]  NUM_GPUS [1]  FP16 [auto: 1 with a CUDA device, else 0 (fp32)]
#   SAVE_INTERVAL_UPDATES  [a tenth of the run, at most 2000]: a checkpoint (and validation) every N updates
#   BEAM [4]      the beam of --eval-bleu's translations
#   DETOK [space] --eval-bleu-detok: moses for Moses-tokenized text (space: none, for text never tokenized)
#   REMOVE_BPE    --eval-bleu-remove-bpe when the data is BPE'd: subword_nmt, sentencepiece
#   the method's knobs, each from its variable: K [0.1] T0 [1000] GAMMA [5000] ANNEAL_FUN [sigmoid] (RecAdam),
#                 R3F_LAMBDA, RHO, KEEP_RATIO, MASK_ITER_E, LLRD, CHILD_RATIO, RDROP_ALPHA [1.0; the R-Drop
#                 authors' translation recipe: 5] (python -m recadam_fairseq methods METHOD)
#   LOG_INTERVAL  [100]  USER_DIR [<repo>/recadam_fairseq]  FAIRSEQ_TRAIN [fairseq-train] (may hold several words)
#   PYTHON        [the interpreter of FAIRSEQ_TRAIN]: reads the catalogue, the checkpoint and the machine
#   RESTART=1     start the run over (its checkpoints and log are deleted)
#   DRY_RUN=1     write $RUN/command.sh and print it; train nothing
#
# The run directory gets command.sh (the exact command), run.json (the settings), train.log (fairseq's
# --log-format json output, with stderr; appended to on resume) and, on success, `done`. The terminal: a line
# per log interval and validation (with BLEU's change since the pretrained weights, --eval-bleu-start: measured
# once before update 1, kept in bleu_start.json), and at the end the best BLEU on the first subset with the
# others' there and their change.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../launch.py" seq2seq "$0" "$@"  # recadam_fairseq/launch
