"""Where the comparison's files are (the checkout, each task's work directories) and its JSON in and out."""

import os

from recadam_fairseq.engine.write import read_json, write_json  # noqa: F401 (the comparison's JSON, as everyone's)
from recadam_fairseq.launch.recipe import REPO as ROOT  # the checkout
USER_DIR = os.path.join(ROOT, "recadam_fairseq")
SCRIPTS = os.path.join(ROOT, "scripts", "forgetting")  # the command lines the recorded commands name


def rel(path):
    """A path as the commands print it: relative to the repository root (their cwd) when inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def task_dirs(work, task):
    """(data directory, runs directory) of ``task`` in ``work``: the movie task's are WORK/data and WORK/runs."""
    suffix = "" if task == "movie" else f"-{task}"
    return os.path.join(work, "data" + suffix), os.path.join(work, "runs" + suffix)
