"""What the task scripts ask before fairseq-train (recadam_fairseq/launch builds the run with the answers): the
method's part of the command (the catalogue), the task's recipe, the checkpoint's architecture, the training set's
size, whether there is a GPU; and ``resume``, which prepares a run directory for fairseq to continue from.

Every question's failure is a :class:`Stop`: one line naming the input. Reading a checkpoint needs torch: the
Python that runs fairseq-train (:func:`need` says so when this one lacks it)."""

import glob
import json
import math
import os
import re
import shutil
import struct
import sys
import time
from typing import List

from recadam_fairseq import catalogue  # pure Python: no torch
from recadam_fairseq.core import glue_tasks
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.core.layers import parse_layers

from .spec import Stop  # the launcher's one-line error


# --------------------------------------------------------------------------- checkpoints
class Truncated(Stop):
    """The file is cut short or empty (a kill during fairseq's copy): safe to set aside."""


def load(path: str, what: str):
    """A fairseq checkpoint, memory-mapped (tensors are not read). Truncated if the file is cut short or
    empty; Stop if it cannot be read for another reason (this Python lacks torch, a file carrying code: the
    plug-in's words, core/checkpoint_file.py)."""
    if not os.path.isfile(path):
        raise Stop(f"{what}: no such file")
    need("torch")
    need("recadam_fairseq.safe_globals")  # the types fairseq pickles
    checkpoint_file = need("recadam_fairseq.core.checkpoint_file")
    try:
        return checkpoint_file.load(path, what)
    except checkpoint_file.CheckpointFileError as e:
        raise (Truncated if e.cut_short else Stop)(str(e)) from None


def arch_of(path: str, what: str, arch_given: str = "", keys=None) -> dict:
    need("fairseq.models")
    from recadam_fairseq.tools import checkpoint_arch as ca

    m = ca.model_config(load(path, what))
    try:
        arch, flags = ca.arch_flags(m, what, keys or ca.SIZE_KEYS)
        why = ca.mismatch(m, arch_given, what, "ARCH=", "leave ARCH unset") if arch_given else None
    except ca.ArchError as e:
        raise Stop(f"{e}: set ARCH") from None
    if why:  # the model ARCH builds must be the one the checkpoint holds
        raise Stop(why)
    return {"CKPT_ARCH": arch, "CKPT_ARCH_FLAGS": " ".join(flags), "CKPT_MAX_POSITIONS": ca.max_positions(m),
            "CKPT_LAYERS": int(m.get("encoder_layers") or ca.arch_defaults(arch).get("encoder_layers") or 0)}


def arch_defaults(arch: str) -> dict:
    need("fairseq.models")
    from recadam_fairseq.tools.checkpoint_arch import arch_defaults as defaults

    return defaults(arch)


def num_updates(state: dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def rank(path: str) -> int:
    """Among checkpoints of the same update: fairseq's numbered one, then an epoch one, then checkpoint_best."""
    name = os.path.basename(path)
    return 2 if re.fullmatch(r"checkpoint_\d+_\d+\.pt", name) else 1 if re.fullmatch(r"checkpoint\d+\.pt", name) else 0


def resume(run_dir: str) -> str:
    """Make checkpoint_last.pt in RUN_DIR loadable, or absent; return the one line to print.

    Only a file that is cut short is set aside: any other failure to read a checkpoint stops (a
    good checkpoint must never be traded for a restart from the pretrained model)."""
    last = os.path.join(run_dir, "checkpoint_last.pt")
    need("torch")
    note = ""
    if os.path.exists(last):
        try:
            return f"resuming {run_dir} from checkpoint_last.pt (update {num_updates(load(last, last))})"
        except Truncated as e:
            aside = f"{last}.bad-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(last, aside)
            note = f"{e}; set aside as {os.path.basename(aside)}; "
    found = []
    for path in glob.glob(os.path.join(run_dir, "checkpoint*.pt")):
        if os.path.basename(path) == "checkpoint_last.pt":
            continue
        try:
            found.append((num_updates(load(path, path)), rank(path), path))
        except Truncated:
            continue
    if not found:
        return f"{note}no complete checkpoint in {run_dir}: starting from the pretrained model"
    n, _, best = max(found)
    tmp = last + ".tmp"
    shutil.copyfile(best, tmp)
    os.replace(tmp, last)  # atomic: a kill here leaves either nothing or the whole file
    return f"{note}resuming {run_dir} from {os.path.basename(best)} (update {n})"


# --------------------------------------------------------------------------- data
def train_examples(data: str, task: str) -> int:
    idx = os.path.join(data, f"{task}-bin", "input0", "train.idx")
    if not os.path.exists(idx):
        own = task not in glue_tasks.TASKS or os.path.exists(os.path.join(data, f"{task}-bin", "labels.json"))
        how = f"data-prep/prepare_task.py --task-name {task}" if own else f"data-prep/prepare_glue.py --tasks {task}"
        raise Stop(f"no {idx} (make it with {how})")
    with open(idx, "rb") as f:  # fairseq's mmap index: magic (9 bytes), version (8), dtype (1), count (8)
        head = f.read(26)
    if head[:9] != b"MMIDIDX\x00\x00":
        raise Stop(f"{idx} is not a fairseq mmap index")
    return struct.unpack("<Q", head[18:26])[0]


def has_cuda() -> int:
    return int(need("torch").cuda.is_available())


def need(module: str):
    """Import ``module``, or Stop: this Python is not the one that runs fairseq-train."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Stop(f"PYTHON={sys.executable} cannot import {module} ({e}): set PYTHON to the Python that runs "
                   f"fairseq-train") from None


# --------------------------------------------------------------------------- main
def method_plan(name: str, env, multitask: bool = False, seq2seq: bool = False) -> dict:
    """What METHOD adds to the task scripts' command, its knobs read from ``env``."""
    shown = script_methods(multitask, seq2seq)
    try:
        m = catalogue.get(name)
    except catalogue.UnknownMethod:
        near = catalogue.closest(name, shown)
        raise Stop(f"unknown METHOD '{name}'" + (f" (did you mean {near}?)" if near else "")
                   + f"; choose one of {' '.join(shown)}") from None
    if m.name not in shown:
        raise Stop(f"METHOD {name} is not one of this script's; choose one of {' '.join(shown)}"
                   + ("" if m.scripts else " (it runs in the comparison: scripts/forgetting/run.py --methods)")
                   + (" (GLUE's: scripts/glue/finetune.sh)" if seq2seq and m.scripts else ""))
    knobs = catalogue.KNOBS
    given = {k: env[knobs[k].var] for k in m.knobs if env.get(knobs[k].var)}
    try:
        values = {k: knobs[k].check(v) for k, v in {**m.defaults(), **given}.items()}
    except ValueError as e:
        raise Stop(str(e)) from None
    f = m.flags(values)
    return {**{knobs[k].var: v for k, v in values.items()}, "METHOD": m.name, "METHOD_NAME": m.run_name(values),
            "METHOD_CRITERION": m.seq2seq_criterion if seq2seq else m.criterion or "", "METHOD_FLAGS": f["optimizer"] + f["extra"] + f["criterion"],
            "METHOD_FT": int(m.needs_ft), "METHOD_RECADAM": int(m.uses_recadam), "METHOD_LR": m.lr or "",
            "METHOD_SETTINGS": " ".join(f"{knobs[k].var}={v}" for k, v in values.items()),
            "METHOD_JSON": m.settings(values)}


def methods_plans(names: List[str], env) -> dict:
    """{name: method_plan} of METHODS (grid.sh's, tune.sh's); Stop naming METHODS for one that is unknown."""
    plans = {}
    for m in names:
        try:
            plans[m] = method_plan(m, env)
        except Stop as e:
            raise Stop(f"METHODS: {e}") from None
    return plans


def script_methods(multitask: bool = False, seq2seq: bool = False) -> List[str]:
    """The METHODs a task script takes, in the catalogue's order."""
    return [n for n in catalogue.names(scripts=True, seq2seq=seq2seq) if catalogue.METHODS[n].multitask or not multitask]


def methods_help(multitask: bool = False, seq2seq: bool = False) -> str:
    """The scripts' --help on METHOD, from the catalogue: the names, then each knob's variable, default and flag."""
    import textwrap

    names = script_methods(multitask, seq2seq)
    lines = ["METHOD (the catalogue, recadam_fairseq/catalogue.py; python -m recadam_fairseq methods METHOD: one in full):"]
    lines += textwrap.wrap(" ".join(names), 100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    lines.append("The methods' knobs, each from its variable [default]:")
    for key, knob in catalogue.KNOBS.items():
        users = [n for n in names if key in catalogue.METHODS[n].knobs]
        if users:
            who = ", ".join(users) if len(users) <= 4 else f"{len(users)} methods: {', '.join(users[:3])}, ..."
            lines.append(f"  {knob.var} [{knob.default}]  {knob.flag}: {knob.help} ({who})")
    return "\n".join(lines)


def task_names(tasks: str, data: str = None) -> List[str]:
    """TASKS (a comma list, any case) in GLUE's spelling; a name of the user's kept when DATA holds its labels.json."""
    names = []
    for n in (x.strip() for x in tasks.split(",") if x.strip()):
        try:
            names.append(glue_tasks.canonical(n))
        except glue_tasks.UnknownTask as e:
            if not (data and os.path.isfile(os.path.join(data, f"{n}-bin", "labels.json"))):  # not one of yours
                raise Stop(f"TASKS={tasks}: {e}") from None
            names.append(n)
    if not names:
        raise Stop("TASKS is empty")
    if len(set(names)) != len(names):
        raise Stop(f"TASKS={tasks}: a task is named twice")
    return names


def per_epoch(data: str, names: List[str], batch: int, gpus: int) -> int:
    """Updates per epoch of ``names`` on ``gpus`` workers, batches of ``batch`` examples (about: with --max-tokens a
    batch may hold fewer examples)."""
    steps = sum(math.ceil(train_examples(data, n) / batch) for n in names)
    return max(1, math.ceil(steps / gpus))


def check_freeze(freeze: str, layers: int) -> None:
    """FREEZE (the layer syntax of core/layers.py) against the model's ``layers``."""
    if not layers:
        raise Stop(f"FREEZE={freeze}: cannot tell how many layers the model has (set ROBERTA_PATH)")
    try:
        parse_layers(freeze, int(layers), "FREEZE")
    except ConfigError as e:
        raise Stop(str(e)) from None


def task_plan(name: str, data: str = None) -> dict:
    """TASK, its recipe (RECIPE_*), NUM_CLASSES, METRIC and TASK_FLAGS (its own fairseq-train flags): a GLUE task's
    from fairseq's recipe, a task of the user's (DATA/NAME-bin/labels.json, data-prep/prepare_task.py) from its
    labels.json and the small-task recipe (core/glue_tasks.own_task_recipe) over its training set."""
    try:
        t = glue_tasks.TASKS[glue_tasks.canonical(name)]
    except glue_tasks.UnknownTask:
        return own_task_plan(name, data)
    if not t.recipe.total_updates:
        raise Stop(f"unknown TASK '{name}'; choose one of {' '.join(glue_tasks.RECIPE_TASKS)}")
    r = t.recipe
    flags = (["--regression-target"] if t.regression else []) + \
        (["--valid-subset", "valid,valid1"] if len(t.dev_files) > 1 else [])  # MNLI: matched, mismatched
    return dict(TASK=t.name, RECIPE_LR=r.lr, RECIPE_BATCH=r.batch, RECIPE_TOTAL=r.total_updates,
                RECIPE_WARMUP=r.warmup_updates, NUM_CLASSES=t.num_classes, METRIC=t.primary_metric, TASK_FLAGS=flags)


def own_task_plan(name: str, data: str = None) -> dict:
    task_dir = os.path.join(data or "", f"{name}-bin")
    path = os.path.join(task_dir, "labels.json")
    if not data or not os.path.isfile(path):
        raise Stop(f"unknown TASK '{name}': not a GLUE task ({' '.join(glue_tasks.RECIPE_TASKS)}) nor one of yours "
                   f"in DATA_DIR={data} (expected {path}: data-prep/prepare_task.py writes it)")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise Stop(f"{path}: not readable JSON ({e})") from None
    regression = bool(meta.get("regression"))
    k = meta.get("num_classes")
    if meta.get("task", name) != name or not (regression or isinstance(k, int) and k >= 2):
        raise Stop(f"{path}: not the labels.json of task {name!r} (data-prep/prepare_task.py writes it)")
    r = glue_tasks.own_task_recipe(train_examples(data, name))
    return dict(TASK=name, RECIPE_LR=r.lr, RECIPE_BATCH=r.batch, RECIPE_TOTAL=r.total_updates,
                RECIPE_WARMUP=r.warmup_updates, NUM_CLASSES=1 if regression else k,
                METRIC=meta.get("metric") or ("pearson" if regression else "accuracy"),
                TASK_FLAGS=["--regression-target"] if regression else [])


def ft_arch(arch: str, what: str) -> str:
    """fairseq's RoBERTa arch -> the roberta_ft model's arch of the same sizes (roberta_large -> roberta_ft_large)."""
    name = arch if arch.startswith("roberta_ft") else "roberta_ft" + arch[len("roberta"):] if arch.startswith("roberta") else ""
    arch_defaults("roberta")  # registers the plug-in's archs
    if not name or name not in need("fairseq.models").ARCH_CONFIG_REGISTRY:
        raise Stop(f"{what}: --arch {arch} has no roberta_ft twin (re-init and LoRA need fairseq's RoBERTa: "
                   f"roberta, roberta_base, roberta_large): set ARCH=roberta_ft_base or roberta_ft_large")
    return name
