"""The forgetting comparison's data: recadam_fairseq.compare.prepare, for scripts that load this file."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # a checkout
from recadam_fairseq.compare.prepare import *  # noqa: E402,F401,F403
