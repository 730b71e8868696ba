"""Regenerate one marked block of a Markdown page.

recadam_fairseq.tools.readme_block, for scripts that load this file: the code is there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from recadam_fairseq.tools.readme_block import *  # noqa: E402,F401,F403
