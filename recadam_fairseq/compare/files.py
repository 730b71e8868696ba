"""Where the comparison's files are (the checkout, each task's work directories) and its JSON in and out."""

import json
import os

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


def read_json(path):
    """The JSON at ``path``, None when there is no such file."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    """``obj`` as indented JSON and a newline, replacing ``path`` at once (a reader never sees half a file)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2) + "\n")
    os.replace(path + ".tmp", path)
