"""Each task's prepared data: what it depends on (a recorded run counts only on the same), prepared once
per setting in WORK/data[-TASK], and where a run finds its target and the probe."""

import os
import sys

from recadam_fairseq.compare import sdist_data
from recadam_fairseq.compare.files import read_json, task_dirs, write_json
from recadam_fairseq.compare.plan import MULTI
from recadam_fairseq.engine import methods
from recadam_fairseq.prepare.hf_source import packaged_model_dir
from recadam_fairseq.tiny.text_data import glue_dir, glue_layout


def data_settings(opts, task=None):
    """What the prepared data of ``task`` (default --task) depends on; a recorded run counts only with
    the same (its ``data``). The sizes are the task's unless given."""
    task = task or opts.task
    if task == MULTI:
        return {t: data_settings(opts, t) for t in opts.tasks}
    t = sdist_data.TARGETS[task]
    out = dict(train_size=opts.train_size or t.train_size, test_size=opts.test_size or t.test_size,
               snli_pairs=opts.snli_pairs, neutral_band=opts.neutral_band, max_tokens=opts.max_tokens,
               data_seed=opts.data_seed)
    return out if task == "movie" else dict(out, task=task)  # the movie runs' key as recorded


def ensure_data(opts, task, pre_dir):
    """(data directory, data.json) of ``task``, prepared unless there with the same settings."""
    data = task_dirs(opts.work, task)[0]
    settings = data_settings(opts, task)
    info_path = os.path.join(data, "data.json")
    info = read_json(info_path)
    if info and info.get("settings") == settings:
        return data, info
    print(f"== preparing data in {data}", flush=True)
    try:
        info = sdist_data.prepare_target(
            task, opts.sdist_dir or os.path.join(opts.work, "sdists"),
            opts.model_dir or packaged_model_dir(), os.path.join(pre_dir, "dict.txt"), data,
            **{k: v for k, v in settings.items() if k != "task"})
    except sdist_data.DataError as e:
        sys.exit(f"run.py: error: {e}")
    info["settings"] = settings
    write_json(info_path, info)
    return data, info


def task_layout(opts, data, dirs, create=True):
    """The target's data directory, its class count, the probe, and the glue_multitask layout (freeze,
    ca-mtl): the movie task in SST-2's slot (as its runs were recorded), the others under their own names;
    for the multi-task setting every task's (``targets``), under its own name. ``dirs``: {task: data dir}.
    ``create=False``: the paths only, nothing written."""
    if opts.task == MULTI:
        targets = {t: os.path.join(d, "sentiment-bin" if t == "movie" else f"{t}-bin") for t, d in dirs.items()}
        out = task_dirs(opts.work, MULTI)[0]
        glue = sdist_data.multi_layout(out, targets) if create else sdist_data.multi_glue(out)
        return {"targets": {t: os.path.join(glue, f"{t}-bin") for t in targets}, "snli": os.path.join(data, "snli-bin"),
                "glue": glue, "mt_task": ",".join(targets), "num_classes": None, "multitask": True}
    glue = glue_dir(data)
    if opts.task == "movie":
        return {"sentiment": os.path.join(data, "sentiment-bin"), "snli": os.path.join(data, "snli-bin"),
                "glue": glue_layout(data) if create else glue, "mt_task": methods.MT_TASK, "num_classes": 2}
    return {"sentiment": os.path.join(data, f"{opts.task}-bin"), "snli": os.path.join(data, "snli-bin"),
            "glue": sdist_data.own_layout(data, opts.task) if create else glue, "mt_task": opts.task,
            "num_classes": len(sdist_data.TARGETS[opts.task].classes)}
