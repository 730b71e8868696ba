#!/usr/bin/env python
"""fairseq-train, then the run's peak CUDA memory as JSON:  python train_peak.py PEAK.json FAIRSEQ-TRAIN-ARGS...

fairseq logs no peak memory; torch's allocator counts it for the whole process (model, optimizer
state, RecAdam's anchor, activations). On a CPU-only run the JSON holds nulls.
"""

import json
import sys

import torch
from fairseq_cli.train import cli_main


def main() -> None:
    out = sys.argv.pop(1)
    cli_main()  # parses sys.argv[1:]
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = {"max_allocated": torch.cuda.max_memory_allocated() if cuda else None,
            "max_reserved": torch.cuda.max_memory_reserved() if cuda else None}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(peak, f)


if __name__ == "__main__":
    main()
