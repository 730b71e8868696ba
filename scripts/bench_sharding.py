"""Per-rank bytes of RecAdam's optimizer state (θ*, Adam's moments) under --zero-sharding os, for

The command line of recadam_fairseq.bench.bench_sharding: the code (and --help's text) is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.bench.bench_sharding import main  # noqa: E402

if __name__ == "__main__":
    main()
