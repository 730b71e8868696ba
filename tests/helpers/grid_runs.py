"""A grid's run directories written in-process, with known numbers (no training): what
``METHODS="adam recadam llrd" SEEDS="1 2" FORGETTING_PROBE=... grid.sh SST-2`` leaves for summarize.py, as
fairseq's json log lines (train.log) and ``done`` markers. The verdicts against Adam follow by hand
(tests/test_grid_verdicts.py derives them; docs/forgetting-your-task.md shows them)."""

import json
import os

# setting -> {seed: [(update, accuracy, forgetting: the mlm loss's rise since θ*, bits)]}, validations at 4, 8, 12;
# each run's best accuracy is its last validation
GRID = {
    "adam": {1: [(4, 70.0, 0.03), (8, 76.0, 0.07), (12, 80.0, 0.10)],
             2: [(4, 72.0, 0.05), (8, 78.0, 0.09), (12, 82.0, 0.12)]},
    # keeps Adam's accuracy (the same mean), forgets less beyond the noise: on the frontier
    "recadam-k0.1-t10": {1: [(4, 70.0, 0.01), (8, 75.0, 0.03), (12, 80.5, 0.04)],
                         2: [(4, 71.0, 0.02), (8, 76.0, 0.04), (12, 81.5, 0.05)]},
    # keeps Adam's accuracy (above it), forgets as much within the noise: on the frontier (the most accurate)
    "recadam-k0.1-t100": {1: [(4, 72.0, 0.04), (8, 78.0, 0.08), (12, 82.5, 0.10)],
                          2: [(4, 73.0, 0.05), (8, 79.0, 0.09), (12, 83.5, 0.11)]},
    # neither: 3.5 points below Adam, forgets less only within the noise; dominated by recadam-k0.1-t10
    "llrd-d0.9": {1: [(4, 65.0, 0.03), (8, 72.0, 0.06), (12, 77.0, 0.09)],
                  2: [(4, 66.0, 0.04), (8, 73.0, 0.07), (12, 78.0, 0.10)]},
}


def write_grid(root, task="SST-2", grid=None, probe=True):
    """The runs ``root/<task>/<setting>/seed<N>/`` (train.log, done); ``probe=False``: the same runs without the
    forgetting meter's columns. Returns ``root``."""
    for setting, seeds in (grid or GRID).items():
        for seed, validations in seeds.items():
            run = os.path.join(root, task, setting, f"seed{seed}")
            os.makedirs(run, exist_ok=True)
            with open(os.path.join(run, "train.log"), "w") as f:
                for update, acc, fgt in validations:
                    rec = {"epoch": 1, "valid_loss": "0.6", "valid_accuracy": f"{acc}",
                           "valid_num_updates": str(update)}
                    if probe:
                        rec.update(valid_fgt_mlm_loss=f"{7.0 + fgt:.5f}", valid_fgt_mlm_loss_delta=f"{fgt:.5f}")
                    f.write(f"2026-01-01 00:00:00 | INFO | valid | {json.dumps(rec)}\n")
            open(os.path.join(run, "done"), "w").close()
    return root
