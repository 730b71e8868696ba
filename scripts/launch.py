#!/usr/bin/env python3
"""The task scripts' one line: ``launch.py KIND SCRIPT ARGS...`` (recadam_fairseq/launch/command.py has the code).

Any Python 3 may start it: it first becomes PYTHON, or else FAIRSEQ_TRAIN's Python
(recadam_fairseq/launch/interpreter.py), so that the checkpoint is read by the torch that trains."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.launch.interpreter import become_trainers_python  # noqa: E402  (standard library only)

if __name__ == "__main__":
    become_trainers_python(__file__, sys.argv[1:])
    from recadam_fairseq.launch.command import main

    sys.exit(main())
