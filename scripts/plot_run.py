#!/usr/bin/env python
"""Plot fairseq json logs of recadam (and plain adam) runs: λ(t), Σ(θ−θ*)², target loss, dev metric.

The command line of recadam_fairseq.tools.plot_run: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tools.plot_run import *  # noqa: E402,F401,F403  (for scripts that load this file)
from recadam_fairseq.tools.plot_run import main  # noqa: E402

if __name__ == "__main__":
    main()
